"""Prefill worker servicer: Prefill (prefill only: the user's request, one token, KV held), PullKv (stream the
held blocks, then free them), ReleaseKv. Abort, stats and KV events are the shared WorkerControl service."""
import time

import grpc

from engines.base import EngineRequest, FinishReason
from engines.base.errors import EngineError
from engines.transfer.budget import StagingBudget, StagingFull
from services.common.convert import finish_to_pb, layout_to_pb, logprob_to_pb, params_from_pb
from services.common.errors import abort_with
from services.common.kv_signing import KvSigner
from services.common.protos import common_pb2, worker_pb2, worker_pb2_grpc
from services.common.roles import WorkerRole
from services.common.tracing import timed_span
from services.common.worker_base import WorkerService, main_for, observed, wall_clock
from services.prefill.leases import Leases

KV_CHUNK_BYTES = 4 << 20
STAGING_WAIT_S = 10.0  # how long a pull waits for room in the staging buffer before it is refused


class PrefillService(WorkerService, worker_pb2_grpc.PrefillWorkerServicer):
    role = WorkerRole.PREFILL
    service_name = worker_pb2.DESCRIPTOR.services_by_name["PrefillWorker"].full_name

    def __init__(self, settings, engine):
        super().__init__(settings, engine)
        self.leases = Leases(settings.kv_lease_s)
        self.signer = KvSigner(settings.kv_signing_key() if settings is not None else None)
        # NOTE: an engine that loads KV exports it through shared memory, never through its pipe
        self.staging = (StagingBudget(settings.kv_staging_mb << 20, "tandem-kv-export")
                        if getattr(engine, "kv_transport", "") else None)
        self._num_blocks: dict[str, int] = {}  # held req_id -> its blocks, for the staging region

    @classmethod
    def add_to(cls, service, server) -> None:
        worker_pb2_grpc.add_PrefillWorkerServicer_to_server(service, server)

    @observed("Prefill")
    async def Prefill(self, request, context):
        params = params_from_pb(request.params)
        req = EngineRequest(request.req_id, tuple(request.token_ids), params, hold_kv=True,
                            hash_root=self.hash_root(params))
        start = time.monotonic()
        try:
            outputs = [out async for out in self.engine.add_request(req)]
        except Exception as exc:
            await abort_with(context, exc)
        last = outputs[-1]
        _engine_spans("prefill", start, time.monotonic(), outputs[0].queue_s, len(request.token_ids),
                      last.num_cached_tokens)
        if last.finish_reason in (FinishReason.ERROR, FinishReason.ABORT):
            if last.error:
                await abort_with(context, EngineError(last.error))
            await context.abort(grpc.StatusCode.CANCELLED, "prefill aborted")
        (token_id,) = [t for out in outputs for t in out.new_token_ids]
        reply = worker_pb2.PrefillResponse(first_token_id=token_id, num_cached_tokens=last.num_cached_tokens)
        if last.logprobs:
            reply.first_logprob.CopyFrom(logprob_to_pb(last.logprobs[0]))
        if last.finish_reason is FinishReason.PREFILLED:
            reply.kv.CopyFrom(self._handle(request.req_id, request.token_ids, last.kv_params))
        else:  # the first token ended the request: nothing is held
            reply.finish_reason = finish_to_pb(last.finish_reason)
        return reply

    @observed("PullKv")
    async def PullKv(self, request, context):
        if self.staging is not None:
            async for chunk in self._pull_staged(request, context):
                yield chunk
            return
        start = time.monotonic()
        try:
            kv = await self.engine.export_kv(request.req_id)
        except Exception as exc:
            await abort_with(context, exc)
        self.leases.take(request.req_id)
        bytes_per_block = len(kv.data) // max(kv.num_blocks, 1)
        blocks_per_chunk = max(1, KV_CHUNK_BYTES // max(bytes_per_block, 1))
        layout = layout_to_pb(kv.layout)
        for first in range(0, kv.num_blocks, blocks_per_chunk):
            n = min(blocks_per_chunk, kv.num_blocks - first)
            yield worker_pb2.KvChunk(
                layout=layout, token_ids=kv.token_ids if first == 0 else (), first_block=first,
                num_blocks=n, total_blocks=kv.num_blocks,
                data=_block_slice(kv.data, kv.num_blocks, first, n, kv.layout.num_layers),
            )
        self.kv_moved("export", len(kv.data), time.monotonic() - start, "bytes")
        await self.engine.release_kv(request.req_id)  # NOTE: a completed pull ends the lease

    async def _pull_staged(self, request, context):
        """The held blocks copied by the engine into a staging region, streamed from there, then freed."""
        start, layout = time.monotonic(), self.engine.kv_layout
        num_blocks = self._num_blocks.get(request.req_id)
        if num_blocks is None:
            await context.abort(grpc.StatusCode.NOT_FOUND, f"no KV held for request {request.req_id!r}")
        try:
            offset = await self.staging.acquire(layout, num_blocks, STAGING_WAIT_S)
        except StagingFull as exc:
            await context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, str(exc))
        try:
            error = await _failure(self.engine.export_kv_to(request.req_id, self.staging.path, offset))
            if error is not None:  # NOTE: aborted outside the except clause, so its status is the one sent
                await abort_with(context, error)
            self._take(request.req_id)
            view = self.staging.view(layout, offset, num_blocks)
            per_chunk = max(1, KV_CHUNK_BYTES // (view.shape[0] * view.shape[2]))
            for first in range(0, num_blocks, per_chunk):
                n = min(per_chunk, num_blocks - first)
                yield worker_pb2.KvChunk(layout=layout_to_pb(layout), first_block=first, num_blocks=n,
                                         total_blocks=num_blocks, data=await self.staging.read_chunk(view, first, n))
        finally:
            self.staging.release(offset)
        self.kv_moved("export", view.nbytes, time.monotonic() - start, "grpc")
        await self.engine.abort(request.req_id)  # NOTE: a completed pull ends the lease (if it did not lapse)

    def close(self) -> None:
        if self.staging is not None:
            self.staging.close()

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
            worker_id=self.worker_id, address=self.address, req_id=req_id, layout=layout_to_pb(layout),
            num_tokens=num_tokens, num_blocks=-(-num_tokens // layout.block_size),
            lease_expires_unix_s=self.leases.grant(req_id), engine_params=engine_params,
        )
        self.signer.seal(handle, token_ids)
        return handle


async def _failure(call) -> Exception | None:
    try:
        await call
    except Exception as exc:
        return exc
    return None


def _engine_spans(stage: str, start: float, end: float, queue_s: float | None, num_prompt_tokens: int,
                  num_cached_tokens: int) -> None:
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


def _block_slice(data: bytes, num_blocks: int, first: int, n: int, num_layers: int) -> bytes:
    """Blocks [first, first+n) of a [layers, 2, num_blocks, ...] array, as the same layout with n blocks."""
    if num_blocks == 0:
        return b""
    block_bytes = len(data) // (num_layers * 2 * num_blocks)
    row = num_blocks * block_bytes  # one (layer, k|v) plane
    view = memoryview(data)
    return b"".join(view[p * row + first * block_bytes : p * row + (first + n) * block_bytes]
                    for p in range(num_layers * 2))


def main(argv: list[str] | None = None) -> int:
    return main_for(WorkerRole.PREFILL, PrefillService, argv)
