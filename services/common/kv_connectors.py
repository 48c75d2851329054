"""The KvConnector of each transport (engines/transfer/connector.py) over the workers' gRPC: PullKv as KvExport bytes,
PullKv through shared-memory staging regions, a NIXL READ by the decode engine, TensorRT-LLM's transceiver. Built
once per worker by `make_connector`; the servicers call `export` / `receive` and never branch on the transport. A pull
(bytes or staging) goes through the decode worker's KvPuller: on its PullKvStream when open, else a unary PullKv."""

import asyncio
import functools
import logging
import time
from collections.abc import Callable

import grpc

from engines.base import Engine
from engines.base.errors import InvalidRequestError, RequestNotFoundError
from engines.base.requests import check_kv_prefix
from engines.transfer import descriptor, transports
from engines.transfer.budget import StagingBudget, StagingFull
from engines.transfer.connector import Incoming
from engines.transfer.paged import staging_nbytes
from services.common.convert import layout_from_pb, layout_to_pb
from services.common.protos import worker_pb2
from services.common.tracing import span, timed_span
from services.common.worker_base import wall_clock

log = logging.getLogger(__name__)
KV_CHUNK_BYTES = 4 << 20
STAGING_WAIT_S = 10.0  # how long a pull waits for room in the staging buffer before it is refused
KvMoved = Callable[[str, int, float, str], None]  # (direction, bytes, seconds, transport label): the worker's metrics


class BytesConnector:
    """The engine exports a KvExport; PullKv streams it in chunks; the decode engine writes it into fresh blocks."""

    name = transports.BYTES

    def __init__(self, engine: Engine, kv_moved: KvMoved, puller=None):
        self.engine, self.kv_moved, self.puller = engine, kv_moved, puller

    async def export(self, req_id: str, num_blocks: int | None, taken: Callable[[str], None]):
        start = time.monotonic()
        kv = await self.engine.export_kv(req_id)
        taken(req_id)
        bytes_per_block = len(kv.data) // max(kv.num_blocks, 1)
        blocks_per_chunk = max(1, KV_CHUNK_BYTES // max(bytes_per_block, 1))
        layout = layout_to_pb(kv.layout)
        for first in range(0, kv.num_blocks, blocks_per_chunk):
            n = min(blocks_per_chunk, kv.num_blocks - first)
            yield worker_pb2.KvChunk(
                layout=layout,
                token_ids=kv.token_ids if first == 0 else (),
                first_block=first,
                num_blocks=n,
                total_blocks=kv.num_blocks,
                data=block_slice(kv.data, kv.num_blocks, first, n, kv.layout.num_layers),
            )
        self.kv_moved("export", len(kv.data), time.monotonic() - start, transports.BYTES)
        await self.engine.release_kv(req_id)  # NOTE: a completed pull ends the lease

    async def receive(self, handle, token_ids: tuple[int, ...]) -> Incoming:
        if handle.engine_params:  # NOTE: another kind's params: its engine reads them (or refuses, with the reason)
            return Incoming(kv=handle.engine_params)
        start = time.monotonic()
        try:
            with span("kv.transfer", **{"tandem.kv.source": handle.worker_id, "tandem.kv.blocks": handle.num_blocks}):
                kv = await self.puller.pull(handle, len(token_ids))
        except (grpc.aio.AioRpcError, ValueError) as exc:
            log.warning("KV pull for %s failed (%s); prefilling locally", handle.req_id, exc)
            return Incoming()
        self.kv_moved("import", len(kv.data), time.monotonic() - start, transports.BYTES)
        try:
            check_kv_prefix(kv.token_ids, token_ids)
        except InvalidRequestError:
            log.warning("KV for %s covers other tokens; prefilling locally", handle.req_id)
            return Incoming()
        return Incoming(kv=kv)

    def close(self) -> None:
        pass


class TrtllmConnector(BytesConnector):
    """TensorRT-LLM moves its KV with its own transceiver: the handle's engine params name it, and the engine
    reads them; tandem moves no bytes (a handle without params is pulled as bytes, which that engine refuses)."""

    name = transports.TRTLLM


class StagingConnector(BytesConnector):
    """Engines that load KV themselves copy it into and out of shared-memory staging regions; PullKv streams the
    regions, so the payload never passes through an engine's pipe or the event loop."""

    name = transports.STAGING

    def __init__(self, engine: Engine, kv_moved: KvMoved, staging: StagingBudget, puller=None):
        super().__init__(engine, kv_moved, puller)
        self.staging = staging

    async def export(self, req_id: str, num_blocks: int | None, taken: Callable[[str], None]):
        if num_blocks is None:
            raise RequestNotFoundError(f"no KV held for request {req_id!r}")
        start, layout = time.monotonic(), self.engine.kv_layout
        offset = await self.staging.acquire(layout, num_blocks, STAGING_WAIT_S)
        try:
            await self.engine.export_kv(req_id, self.staging.path, offset)  # its handle names the region streamed
            taken(req_id)
            view = self.staging.view(layout, offset, num_blocks)
            per_chunk = max(1, KV_CHUNK_BYTES // (view.shape[0] * view.shape[2]))
            for first in range(0, num_blocks, per_chunk):
                n = min(per_chunk, num_blocks - first)
                yield worker_pb2.KvChunk(
                    layout=layout_to_pb(layout),
                    first_block=first,
                    num_blocks=n,
                    total_blocks=num_blocks,
                    data=await self.staging.read_chunk(view, first, n),
                )
        finally:
            self.staging.release(offset)
        self.kv_moved("export", view.nbytes, time.monotonic() - start, transports.STAGING)
        await self.engine.abort(req_id)  # NOTE: a completed pull ends the lease (if it did not lapse)

    async def receive(self, handle, token_ids: tuple[int, ...]) -> Incoming:
        """Pull into a staging region; params naming it and a `land` that frees it — or Incoming() to prefill
        locally when the pull fails or the budget has no room in time."""
        begin, layout = time.monotonic(), layout_from_pb(handle.layout)
        try:
            with span(
                "kv.transfer",
                **{
                    "tandem.kv.source": handle.worker_id,
                    "tandem.kv.blocks": handle.num_blocks,
                    "tandem.kv.transport": transports.STAGING,
                },
            ):
                offset = await self.staging.acquire(layout, handle.num_blocks, self.puller.timeout_s)
                try:
                    kv_params = await self.puller.pull_staged(handle, token_ids, self.staging, offset)
                except BaseException:
                    self.staging.release(offset)
                    raise
        except (grpc.aio.AioRpcError, ValueError, StagingFull) as exc:
            log.warning("KV pull for %s failed (%s); prefilling locally", handle.req_id, exc)
            return Incoming()
        num_bytes = staging_nbytes(layout, handle.num_blocks)
        self.kv_moved("import", num_bytes, time.monotonic() - begin, transports.STAGING)
        return Incoming(kv=kv_params, land=_once(lambda seconds: self.staging.release(offset)))

    def close(self) -> None:
        self.staging.close()


class NixlConnector(StagingConnector):
    """The decode engine READs the prefill engine's blocks itself, named by the handle's engine params; once its
    first output is out the prefill worker is told to release them. PullKv through staging stays the fallback."""

    name = transports.NIXL

    def __init__(self, engine: Engine, kv_moved: KvMoved, staging: StagingBudget, puller=None):
        super().__init__(engine, kv_moved, staging, puller)
        self._tasks: set[asyncio.Task] = set()  # releases in flight (a task no one holds may be collected)

    async def receive(self, handle, token_ids: tuple[int, ...]) -> Incoming:
        if not handle.engine_params:  # a prefill worker without NIXL: its blocks are pulled
            return await super().receive(handle, token_ids)
        kv_params = descriptor.with_expiry(handle.engine_params, handle.lease_expires_unix_s)
        return Incoming(kv=kv_params, land=_once(functools.partial(self._landed, handle)))

    def _landed(self, handle, seconds: float) -> None:
        """The READ is over: release the source's blocks, count it (bytes by the handle; seconds until the first
        token, the load's upper bound)."""
        task = asyncio.create_task(self.puller.release(handle))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        if not seconds:
            return
        num_bytes = staging_nbytes(layout_from_pb(handle.layout), handle.num_blocks)
        self.kv_moved("import", num_bytes, seconds, transports.NIXL)
        end = time.monotonic()
        timed_span(
            "kv.transfer",
            *map(wall_clock(), (end - seconds, end)),
            **{
                "tandem.kv.source": handle.worker_id,
                "tandem.kv.blocks": handle.num_blocks,
                "tandem.kv.transport": transports.NIXL,
            },
        )


def make_connector(engine: Engine, kv_moved: KvMoved, staging_bytes: int, staging_prefix: str, puller=None):
    """The connector for the transport `engine` declares (a staging buffer of `staging_bytes` for those that load)."""
    transport = engine.capabilities.kv_transport
    if transport == transports.TRTLLM:
        return TrtllmConnector(engine, kv_moved, puller)
    if transport not in transports.LOADING:
        return BytesConnector(engine, kv_moved, puller)
    kind = NixlConnector if transport == transports.NIXL else StagingConnector
    return kind(engine, kv_moved, StagingBudget(staging_bytes, staging_prefix), puller)


def _once(fn: Callable[[float], None]) -> Callable[[float], None]:
    fired: list[bool] = []

    def call(seconds: float) -> None:
        if not fired:
            fired.append(True)
            fn(seconds)

    return call


def block_slice(data: bytes, num_blocks: int, first: int, n: int, num_layers: int) -> bytes:
    """Blocks [first, first+n) of a [layers, 2, num_blocks, ...] array, as the same layout with n blocks."""
    if num_blocks == 0:
        return b""
    block_bytes = len(data) // (num_layers * 2 * num_blocks)
    row = num_blocks * block_bytes  # one (layer, k|v) plane
    view = memoryview(data)
    return b"".join(
        view[p * row + first * block_bytes : p * row + (first + n) * block_bytes] for p in range(num_layers * 2)
    )
