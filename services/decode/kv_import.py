"""Getting a request's KV from the prefill worker named in its KvHandle over gRPC: either as one KvExport (engines
that take bytes) or, for engines that load KV themselves, received into a region of the worker's shared-memory
staging buffer (bounded; copies on a thread) that the engine then reads — never through an event loop or the
engine's pipe. Also tells a prefill worker to release blocks its engine's NIXL READ has taken. A pull never takes more
than the handle's blocks, nor a handle more blocks than the request's tokens fill. A pull travels on the prefill
worker's PullKvStream when that is open (pull_stream.py), as a unary PullKv otherwise."""

import contextlib
import logging
from collections.abc import AsyncIterator

import grpc

from engines.base import KvExport
from engines.base.requests import DTYPE_BYTES
from engines.transfer import descriptor
from engines.transfer.budget import StagingBudget
from engines.transfer.descriptor import STAGING, KvDescriptor
from services.common.convert import layout_from_pb
from services.common.grpc_server import make_channel
from services.common.protos import common_pb2, worker_pb2, worker_pb2_grpc
from services.decode.pull_stream import PullStreamClient, StreamUnavailable

log = logging.getLogger(__name__)
RELEASE_TIMEOUT_S = 5.0
# NOTE: a pull larger than this goes unary: a call's fixed cost is then well under 1% of its transfer, while the stream
# wraps and queues every chunk again (4 MiB chunks: `tandem bench kv` over gRPC fell from 0.44-0.46 to 0.38-0.39 GB/s)
STREAM_MAX_BYTES = 1 << 20


class _Peer:
    """One prefill worker: its channel, its unary stub, its pull stream."""

    __slots__ = ("channel", "stub", "stream")

    def __init__(self, address: str):
        self.channel = make_channel(address)
        # NOTE: one stub per channel, kept: a stub builds a callable per method, a cost paid per request otherwise
        self.stub = worker_pb2_grpc.PrefillWorkerStub(self.channel)
        self.stream = PullStreamClient(self.stub)


class KvPuller:
    """One channel and one pull stream per prefill worker, reused across requests."""

    def __init__(self, timeout_s: float = 30.0):
        self.timeout_s = timeout_s
        self._peers: dict[str, _Peer] = {}

    async def pull(self, handle: common_pb2.KvHandle, num_tokens: int) -> KvExport:
        """The handle's KV as one export; ValueError for a handle past `num_tokens` (the request's) or a stream
        sending more bytes than the handle's blocks hold (stopped at once: never buffered)."""
        max_bytes = handle_nbytes(handle, num_tokens)
        chunks, received = [], 0
        async with contextlib.aclosing(self._chunks(handle, max_bytes)) as stream:
            async for chunk in stream:
                received += len(chunk.data)
                if received > max_bytes:
                    raise ValueError(
                        f"PullKv sent over {max_bytes} bytes, what the handle's {handle.num_blocks} blocks hold"
                    )
                chunks.append(chunk)
        return assemble(chunks)

    async def pull_staged(
        self, handle: common_pb2.KvHandle, token_ids: tuple[int, ...], staging: StagingBudget, offset: int
    ) -> bytes:
        """Receive the handle's blocks into the staging region at `offset`; the STAGING descriptor naming it.
        ValueError when the stream does not fit the handle."""
        max_bytes = handle_nbytes(handle, len(token_ids))
        layout = layout_from_pb(handle.layout)
        view = staging.view(layout, offset, handle.num_blocks)
        received = 0
        async with contextlib.aclosing(self._chunks(handle, max_bytes)) as stream:
            async for c in stream:
                if c.total_blocks != handle.num_blocks or not 0 <= c.first_block <= handle.num_blocks - c.num_blocks:
                    raise ValueError(
                        f"PullKv sent blocks {c.first_block}+{c.num_blocks} of {c.total_blocks}, "
                        f"the handle names {handle.num_blocks}"
                    )
                await staging.write_chunk(view, c.first_block, c.num_blocks, c.data)
                received += c.num_blocks
        if received != handle.num_blocks:
            raise ValueError(f"PullKv returned {received} of {handle.num_blocks} blocks")
        return descriptor.encode(
            KvDescriptor(STAGING, layout, token_ids[: handle.num_tokens], base=offset, path=staging.path)
        )

    async def release(self, handle: common_pb2.KvHandle) -> None:
        """Tell the prefill worker its blocks were read (best effort: its lease frees them otherwise)."""
        try:
            await self._peer(handle.address).stub.ReleaseKv(
                worker_pb2.ReleaseKvRequest(req_id=handle.req_id), timeout=RELEASE_TIMEOUT_S
            )
        except grpc.aio.AioRpcError as exc:
            log.info("release of %s's KV on %s failed: %s", handle.req_id, handle.address, exc.code().name)

    async def close(self) -> None:
        """Each pull stream ended first (what was asked on it is answered), then each channel."""
        for peer in self._peers.values():
            await peer.stream.close()
            await peer.channel.close()

    async def _chunks(self, handle: common_pb2.KvHandle, max_bytes: int) -> AsyncIterator[worker_pb2.KvChunk]:
        """The pull's chunks: on the stream when it takes the pull (a small one), else (or if it broke before any
        came) unary."""
        peer = self._peer(handle.address)
        try:
            if max_bytes > STREAM_MAX_BYTES:
                raise StreamUnavailable
            async with contextlib.aclosing(peer.stream.pull(handle.req_id, max_bytes, self.timeout_s)) as chunks:
                async for chunk in chunks:
                    yield chunk
            return
        except StreamUnavailable:
            pass
        call = peer.stub.PullKv(worker_pb2.PullKvRequest(req_id=handle.req_id), timeout=self.timeout_s)
        try:
            async for chunk in call:
                yield chunk
        finally:
            call.cancel()  # NOTE: a pull left early (past its handle) stops the peer at once; a no-op once done

    def _peer(self, address: str) -> _Peer:
        peer = self._peers.get(address)
        if peer is None:
            peer = self._peers[address] = _Peer(address)
        return peer


def handle_nbytes(handle: common_pb2.KvHandle, num_tokens: int) -> int:
    """The bytes the handle's blocks hold; ValueError unless it covers a strict prefix of the request's
    `num_tokens` in exactly the blocks that prefix fills."""
    layout = layout_from_pb(handle.layout)
    if layout.block_size < 1 or layout.dtype not in DTYPE_BYTES:
        raise ValueError(f"KV handle has an unusable layout (block size {layout.block_size}, dtype {layout.dtype})")
    if not 0 < handle.num_tokens < num_tokens or handle.num_blocks != -(-handle.num_tokens // layout.block_size):
        raise ValueError(
            f"KV handle names {handle.num_blocks} blocks / {handle.num_tokens} tokens for a request of "
            f"{num_tokens} tokens"
        )
    per_block = layout.num_layers * 2 * layout.block_size * layout.num_kv_heads * layout.head_dim
    return handle.num_blocks * per_block * DTYPE_BYTES[layout.dtype]


def assemble(chunks: list[worker_pb2.KvChunk]) -> KvExport:
    """Chunks hold [layers, 2, n, ...] slices of consecutive blocks; join them plane by plane."""
    if not chunks:
        raise ValueError("PullKv returned no chunks")
    layout = layout_from_pb(chunks[0].layout)
    total = chunks[0].total_blocks
    if sum(c.num_blocks for c in chunks) != total:
        raise ValueError(f"PullKv returned {sum(c.num_blocks for c in chunks)} of {total} blocks")
    planes = layout.num_layers * 2
    parts = []
    for p in range(planes):
        for c in chunks:
            size = len(c.data) // planes
            parts.append(memoryview(c.data)[p * size : (p + 1) * size])
    return KvExport(layout=layout, token_ids=tuple(chunks[0].token_ids), num_blocks=total, data=b"".join(parts))
