"""Prefill worker servicer: Prefill (prefill only: the user's request, one token, KV held), PullKv (stream the
held blocks, then free them; also as messages on PullKvStream, pull_stream.py), ReleaseKv. Abort, stats and KV events
are the shared WorkerControl service."""

import asyncio
import logging
import time

import grpc

from engines.base import EngineRequest, FinishReason
from engines.base.errors import EngineError
from services.common.convert import finish_to_pb, layout_to_pb, logprob_to_pb, params_from_pb
from services.common.errors import abort_with
from services.common.kv_connectors import make_connector
from services.common.kv_signing import KvSigner
from services.common.protos import common_pb2, worker_pb2, worker_pb2_grpc
from services.common.roles import WorkerRole
from services.common.tracing import timed_span
from services.common.worker_base import WorkerService, main_for, observed, wall_clock
from services.prefill.leases import Leases
from services.prefill.pull_stream import PullStreams

log = logging.getLogger(__name__)


class PrefillService(WorkerService, worker_pb2_grpc.PrefillWorkerServicer):
    role = WorkerRole.PREFILL
    service_name = worker_pb2.DESCRIPTOR.services_by_name["PrefillWorker"].full_name

    def __init__(self, settings, engine):
        super().__init__(settings, engine)
        self.leases = Leases(settings.kv_lease_s)
        self.signer = KvSigner(settings.kv_signing_key() if settings is not None else None)
        # NOTE: an engine that loads KV exports it through shared memory, never through its pipe
        self.connector = make_connector(
            engine, self.kv_moved, settings.kv_staging_mb << 20 if settings else 0, "tandem-kv-export"
        )
        self._num_blocks: dict[str, int] = {}  # held req_id -> its blocks, for the staging region
        self.pull_streams = PullStreams(self.kv_chunks, self._pulled)
        self._stop_watch: asyncio.Task | None = None  # ends the pull streams when the worker stops

    @classmethod
    def add_to(cls, service, server) -> None:
        worker_pb2_grpc.add_PrefillWorkerServicer_to_server(service, server)

    @observed("Prefill")
    async def Prefill(self, request, context):
        params = params_from_pb(request.params)
        req = EngineRequest(
            request.req_id, tuple(request.token_ids), params, hold_kv=True, hash_root=self.hash_root(params)
        )
        start = time.monotonic()
        try:
            outputs = [out async for out in self.engine.add_request(req)]
        except Exception as exc:
            await abort_with(context, exc)
        last = outputs[-1]
        _engine_spans(
            "prefill", start, time.monotonic(), outputs[0].queue_s, len(request.token_ids), last.num_cached_tokens
        )
        if last.finish_reason in (FinishReason.ERROR, FinishReason.ABORT):
            if last.error:
                await abort_with(context, EngineError(last.error))
            await context.abort(grpc.StatusCode.CANCELLED, "prefill aborted")
        (token_id,) = [t for out in outputs for t in out.new_token_ids]
        reply = worker_pb2.PrefillResponse(first_token_id=token_id, num_cached_tokens=last.num_cached_tokens)
        if last.logprobs:
            reply.first_logprob.CopyFrom(logprob_to_pb(last.logprobs[0]))
        if last.finish_reason is FinishReason.PREFILLED:
            reply.kv.CopyFrom(self._handle(request.req_id, request.token_ids, last.kv_handle))
        else:  # the first token ended the request: nothing is held
            reply.finish_reason = finish_to_pb(last.finish_reason)
        return reply

    @observed("PullKv")
    async def PullKv(self, request, context):
        chunks = self.kv_chunks(request.req_id)
        error = None
        try:
            async for chunk in chunks:
                yield chunk
        except Exception as exc:  # NOTE: aborted outside the except clause, so its status is the one sent
            error = exc
        finally:
            await chunks.aclose()
        if error is not None:
            await abort_with(context, error)

    async def PullKvStream(self, request_iterator, context):
        if self._stop_watch is None:
            self._stop_watch = asyncio.get_running_loop().create_task(self._end_streams_at_stop())
        await self.pull_streams.serve(request_iterator, context)

    def kv_chunks(self, req_id: str):
        """The one pull, unary or on the stream: the held blocks as chunks, the lease taken once the export has
        them, the blocks freed once the last chunk is out (the connector's export)."""
        return self.connector.export(req_id, self._num_blocks.get(req_id), self._take)

    def _pulled(self, code: str, seconds: float) -> None:
        """A pull on the stream ended: counted and logged as a unary PullKv is (worker_base.observed)."""
        self.metrics.rpc_done("PullKv", code)
        log.info("%s %s", "PullKv", code, extra={"rpc": "PullKv", "code": code, "duration_s": round(seconds, 6)})

    async def _end_streams_at_stop(self) -> None:
        await self.stopping.wait()
        await self.pull_streams.close()

    def close(self) -> None:
        self.connector.close()

    def _take(self, req_id: str) -> None:
        self.leases.take(req_id)
        self._num_blocks.pop(req_id, None)

    async def ReleaseKv(self, request, context):
        self._take(request.req_id)
        await self.engine.abort(request.req_id)  # drops held KV; unknown ids are ignored
        return worker_pb2.ReleaseKvResponse()

    def _handle(self, req_id: str, token_ids, engine_params: bytes) -> common_pb2.KvHandle:
        """The signed handle for a held request's KV (kv_signing.py: what the decode worker checks)."""
        layout, num_tokens = self.engine.kv_layout, len(token_ids)
        self._num_blocks[req_id] = -(-num_tokens // layout.block_size)
        handle = common_pb2.KvHandle(
            worker_id=self.worker_id,
            address=self.address,
            req_id=req_id,
            layout=layout_to_pb(layout),
            num_tokens=num_tokens,
            num_blocks=-(-num_tokens // layout.block_size),
            lease_expires_unix_s=self.leases.grant(req_id),
            engine_params=engine_params,
        )
        self.signer.seal(handle, token_ids)
        return handle


def _engine_spans(
    stage: str, start: float, end: float, queue_s: float | None, num_prompt_tokens: int, num_cached_tokens: int
) -> None:
    """<stage>.queue (waiting for the engine's first step) and <stage>.compute (first step to first token);
    one <stage>.engine span when the engine does not say how long it queued."""
    attrs = {"tandem.prompt_tokens": num_prompt_tokens, "tandem.cached_tokens": num_cached_tokens}
    wall_ns = wall_clock()
    if queue_s is None:
        timed_span(f"{stage}.engine", wall_ns(start), wall_ns(end), **attrs)
        return
    scheduled = min(start + queue_s, end)
    timed_span(f"{stage}.queue", wall_ns(start), wall_ns(scheduled))
    timed_span(f"{stage}.compute", wall_ns(scheduled), wall_ns(end), **attrs)


def main(argv: list[str] | None = None) -> int:
    return main_for(WorkerRole.PREFILL, PrefillService, argv)
