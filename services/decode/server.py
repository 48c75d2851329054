"""Decode worker servicer: Generate — pull the KV named by the handle (falling back to a local prefill if the
pull fails), continue after the tokens generated elsewhere in the continuous batch, stream token deltas."""
import asyncio
import functools
import logging
import time

import grpc

from engines.base import EngineRequest, FinishReason
from engines.base.errors import EngineError
from engines.transfer import descriptor
from engines.transfer.budget import StagingBudget, StagingFull
from engines.transfer.paged import staging_nbytes
from services.common.convert import finish_to_pb, layout_from_pb, logprob_to_pb, params_from_pb
from services.common.drain import drainable
from services.common.errors import abort_with
from services.common.kv_signing import KvHandleError, KvVerifier
from services.common.protos import worker_pb2, worker_pb2_grpc
from services.common.roles import WorkerRole
from services.common.streams import coalesced
from services.common.tracing import span, timed_span
from services.common.worker_base import WorkerService, main_for, observed, wall_clock
from services.decode.kv_gate import KvGate, PrefillPool
from services.decode.kv_import import KvPuller

log = logging.getLogger(__name__)


class DecodeService(WorkerService, worker_pb2_grpc.DecodeWorkerServicer):
    role = WorkerRole.DECODE
    service_name = worker_pb2.DESCRIPTOR.services_by_name["DecodeWorker"].full_name

    def __init__(self, settings, engine):
        super().__init__(settings, engine)
        self.puller = KvPuller()
        key = settings.kv_signing_key() if settings is not None else None
        self.gate = KvGate(KvVerifier(key), PrefillPool(settings.router_address) if settings is not None else None)
        self.transport = getattr(engine, "kv_transport", "")  # "": the engine takes KV as bytes
        self.staging = StagingBudget(settings.kv_staging_mb << 20, "tandem-kv-import") if self.transport else None
        self._tasks: set[asyncio.Task] = set()

    def close(self) -> None:
        if self.staging is not None:
            self.staging.close()

    @classmethod
    def add_to(cls, service, server) -> None:
        worker_pb2_grpc.add_DecodeWorkerServicer_to_server(service, server)

    @observed("Generate")
    @drainable
    async def Generate(self, request, context):
        start = time.monotonic()
        kv, landed = None, None
        kv_params = await self._verified_params(request, context)
        if request.HasField("kv") and self.transport == "nixl" and kv_params:
            landed = self._spawn_after(self.puller.release(request.kv))  # NOTE: the engine READs; then released
            kv_params = descriptor.with_expiry(kv_params, request.kv.lease_expires_unix_s)
        elif request.HasField("kv") and self.transport:  # the gRPC fallback, into the staging buffer
            kv_params, landed = await self._pull_staged(request)
        elif request.HasField("kv") and not request.kv.engine_params:  # NOTE: engine params: its engine moves it
            kv = await self._maybe_pull(request)
        params = params_from_pb(request.params)
        req = EngineRequest(request.req_id, tuple(request.token_ids), params, kv=kv,
                            output_token_ids=tuple(request.output_token_ids), kv_params=kv_params,
                            hash_root=self.hash_root(params))
        try:
            stream = self.engine.add_request(req)
        except Exception as exc:
            if landed is not None:
                landed()
            await abort_with(context, exc)
        first_at, queue_s, num_tokens = 0.0, None, 0
        try:
            # NOTE: a cancelled call closes these streams, which aborts the request in the engine
            async for out in coalesced(stream):
                if out.finish_reason is FinishReason.ERROR:
                    await abort_with(context, EngineError(out.error or "generation failed"))
                if not first_at:
                    first_at, queue_s = time.monotonic(), out.queue_s
                    self._landed(request, landed, first_at - start)
                num_tokens += len(out.new_token_ids)
                yield worker_pb2.GenerateResponse(
                    token_ids=out.new_token_ids, logprobs=[logprob_to_pb(lp) for lp in out.logprobs],
                    finish_reason=finish_to_pb(out.finish_reason),
                    num_prompt_tokens=out.num_prompt_tokens,
                    num_cached_tokens=out.num_cached_tokens, kv_imported=first_at == 0 and kv is not None,
                )
        finally:
            if landed is not None and not first_at:
                landed()
            if first_at:
                _decode_spans(start, first_at, time.monotonic(), queue_s, num_tokens)

    async def _verified_params(self, request, context) -> bytes:
        """The engine params of a handle that passed the gate (refused otherwise, before any pull or READ); a
        request's own kv_params count only as the verified handle's, and are ignored without one."""
        if not request.HasField("kv"):
            if request.kv_params:
                log.warning("kv_params without a KV handle for %s: ignored", request.req_id)
            return b""
        try:
            await self.gate.admit(request.kv, tuple(request.token_ids) + tuple(request.output_token_ids))
        except KvHandleError as exc:
            self.metrics.kv_handle_refused(exc.reason)
            log.warning("KV handle for %s refused (%s): %s", request.req_id, exc.reason, exc)
            await abort_with(context, exc)
        if request.kv_params and request.kv_params != request.kv.engine_params:
            log.warning("kv_params for %s differ from its verified handle's: the handle's are used", request.req_id)
        return request.kv.engine_params

    async def _pull_staged(self, request):
        """Pull the KV into a staging region; (kv_params naming it, what frees it) — or (b"", None) to prefill
        locally when the pull fails or the budget has no room in time."""
        handle, begin = request.kv, time.monotonic()
        layout = layout_from_pb(handle.layout)
        tokens = tuple(request.token_ids) + tuple(request.output_token_ids)
        try:
            with span("kv.transfer", **{"tandem.kv.source": handle.worker_id, "tandem.kv.blocks": handle.num_blocks,
                                        "tandem.kv.transport": "grpc"}):
                offset = await self.staging.acquire(layout, handle.num_blocks, self.puller.timeout_s)
                try:
                    kv_params = await self.puller.pull_staged(handle, tokens, self.staging, offset)
                except BaseException:
                    self.staging.release(offset)
                    raise
        except (grpc.aio.AioRpcError, ValueError, StagingFull) as exc:
            log.warning("KV pull for %s failed (%s); prefilling locally", request.req_id, exc)
            return b"", None
        num_bytes = staging_nbytes(layout, handle.num_blocks)
        self.kv_moved("import", num_bytes, time.monotonic() - begin, "grpc")
        return kv_params, functools.partial(self.staging.release, offset)

    def _landed(self, request, landed, seconds: float) -> None:
        """The engine's first output: its load is over; the staging region or the remote blocks go. A NIXL
        READ is counted here (bytes by the handle; seconds until the first token, the load's upper bound)."""
        if landed is None:
            return
        landed()
        if self.transport == "nixl" and request.kv.engine_params:  # NOTE: a staged pull counted itself
            layout = layout_from_pb(request.kv.layout)
            num_bytes = staging_nbytes(layout, request.kv.num_blocks)
            self.kv_moved("import", num_bytes, seconds, "nixl")
            timed_span("kv.transfer", *map(wall_clock(), (time.monotonic() - seconds, time.monotonic())),
                       **{"tandem.kv.source": request.kv.worker_id, "tandem.kv.blocks": request.kv.num_blocks,
                          "tandem.kv.transport": "nixl"})

    def _spawn_after(self, coro):
        """A callable that runs `coro` in the background once (the first time it is called)."""
        def fire():
            if not fired:
                fired.append(True)
                task = asyncio.create_task(coro)
                self._tasks.add(task)
                task.add_done_callback(self._tasks.discard)
        fired: list[bool] = []
        return fire

    async def _maybe_pull(self, request):
        start = time.monotonic()
        try:
            with span("kv.transfer", **{"tandem.kv.source": request.kv.worker_id,
                                        "tandem.kv.blocks": request.kv.num_blocks}):
                kv = await self.puller.pull(request.kv, len(request.token_ids) + len(request.output_token_ids))
        except (grpc.aio.AioRpcError, ValueError) as exc:
            log.warning("KV pull for %s failed (%s); prefilling locally", request.req_id, exc)
            return None
        self.kv_moved("import", len(kv.data), time.monotonic() - start, "bytes")
        tokens = tuple(request.token_ids) + tuple(request.output_token_ids)
        if kv.token_ids != tokens[: kv.num_tokens]:
            log.warning("KV for %s covers other tokens; prefilling locally", request.req_id)
            return None
        return kv


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
