"""Decode worker servicer: Generate — verify the KV handle, take its KV through the worker's KvConnector (a local
prefill if the transfer fails), continue after the tokens generated elsewhere in the continuous batch, stream token deltas."""

import logging
import time

from engines.base import EngineRequest, FinishReason
from engines.base.errors import EngineError
from engines.base.types import KvExport
from engines.transfer.connector import Incoming
from services.common.convert import finish_to_pb, logprob_to_pb, params_from_pb
from services.common.drain import drainable
from services.common.errors import abort_with
from services.common.kv_connectors import make_connector
from services.common.kv_signing import KvHandleError, KvVerifier
from services.common.protos import worker_pb2, worker_pb2_grpc
from services.common.roles import WorkerRole
from services.common.streams import coalesced
from services.common.tracing import timed_span
from services.common.worker_base import WorkerService, main_for, observed, wall_clock
from services.decode.kv_gate import KvGate, PrefillPool
from services.decode.kv_import import KvPuller

log = logging.getLogger(__name__)


class DecodeService(WorkerService, worker_pb2_grpc.DecodeWorkerServicer):
    role = WorkerRole.DECODE
    service_name = worker_pb2.DESCRIPTOR.services_by_name["DecodeWorker"].full_name

    def __init__(self, settings, engine):
        super().__init__(settings, engine)
        key = settings.kv_signing_key() if settings is not None else None
        self.gate = KvGate(KvVerifier(key), PrefillPool(settings.router_address) if settings is not None else None)
        self.connector = make_connector(
            engine, self.kv_moved, settings.kv_staging_mb << 20 if settings else 0, "tandem-kv-import", KvPuller()
        )

    def close(self) -> None:
        self.connector.close()

    @classmethod
    def add_to(cls, service, server) -> None:
        worker_pb2_grpc.add_DecodeWorkerServicer_to_server(service, server)

    @observed("Generate")
    @drainable
    async def Generate(self, request, context):
        start = time.monotonic()
        incoming = Incoming()
        if await self._verified(request, context):
            incoming = await self.connector.receive(request.kv, _all_tokens(request))
        params = params_from_pb(request.params)
        req = EngineRequest(
            request.req_id,
            tuple(request.token_ids),
            params,
            kv=incoming.kv,
            output_token_ids=tuple(request.output_token_ids),
            hash_root=self.hash_root(params),
        )
        try:
            stream = self.engine.add_request(req)
        except Exception as exc:
            incoming.landed()
            await abort_with(context, exc)
        first_at, queue_s, num_tokens = 0.0, None, 0
        try:
            # NOTE: a cancelled call closes these streams, which aborts the request in the engine
            async for out in coalesced(stream):
                if out.finish_reason is FinishReason.ERROR:
                    await abort_with(context, EngineError(out.error or "generation failed"))
                if not first_at:
                    first_at, queue_s = time.monotonic(), out.queue_s
                    incoming.landed(first_at - start)  # NOTE: the engine's first output: its load is over
                num_tokens += len(out.new_token_ids)
                yield worker_pb2.GenerateResponse(
                    token_ids=out.new_token_ids,
                    logprobs=[logprob_to_pb(lp) for lp in out.logprobs],
                    finish_reason=finish_to_pb(out.finish_reason),
                    num_prompt_tokens=out.num_prompt_tokens,
                    num_cached_tokens=out.num_cached_tokens,
                    kv_imported=first_at == 0 and isinstance(incoming.kv, KvExport),
                )
        finally:
            if not first_at:
                incoming.landed()
            if first_at:
                _decode_spans(start, first_at, time.monotonic(), queue_s, num_tokens)

    async def _verified(self, request, context) -> bool:
        """Whether the request carries a KV handle that passed the gate (refused otherwise, before any pull or
        READ); only a verified handle's engine_params ever reach the engine."""
        if not request.HasField("kv"):
            return False
        try:
            await self.gate.admit(request.kv, _all_tokens(request))
        except KvHandleError as exc:
            self.metrics.kv_handle_refused(exc.reason)
            log.warning("KV handle for %s refused (%s): %s", request.req_id, exc.reason, exc)
            await abort_with(context, exc)
        return True


def _all_tokens(request) -> tuple[int, ...]:
    return tuple(request.token_ids) + tuple(request.output_token_ids)


def _decode_spans(start: float, first_at: float, end: float, queue_s: float | None, num_tokens: int) -> None:
    """decode.queue (until the engine's first step), decode.first_token, decode.stream (the rest)."""
    wall_ns = wall_clock()
    scheduled = min(start + queue_s, first_at) if queue_s is not None else start
    if queue_s is not None:
        timed_span("decode.queue", wall_ns(start), wall_ns(scheduled))
    timed_span("decode.first_token", wall_ns(scheduled), wall_ns(first_at))
    timed_span("decode.stream", wall_ns(first_at), wall_ns(end), **{"tandem.generated_tokens": num_tokens})


def main(argv: list[str] | None = None) -> int:
    return main_for(WorkerRole.DECODE, DecodeService, argv)
