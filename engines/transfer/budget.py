"""StagingBudget: a worker front process's staging file handed out in regions, waiting (bounded) for room; the
gRPC KV fallback's memory bound. Copies between gRPC messages and the file run on a thread, never on the loop."""

import asyncio
import time

import numpy as np

from engines.base.types import KvLayout
from engines.transfer.paged import staging_nbytes, staging_view
from engines.transfer.staging import StagingFile

WAIT_POLL_S = 0.005


class StagingFull(Exception):
    """No room in the staging budget within the wait: the caller falls back (local prefill, or a retry)."""


class StagingBudget:
    def __init__(self, capacity: int, prefix: str = "tandem-kv"):
        self.file = StagingFile(capacity, prefix)

    @property
    def path(self) -> str:
        return self.file.path

    async def acquire(self, layout: KvLayout, num_blocks: int, timeout_s: float) -> int:
        """The offset of a region for `num_blocks` blocks; waits up to `timeout_s` for room, then StagingFull."""
        size = staging_nbytes(layout, num_blocks)
        if size > self.file.capacity:
            raise StagingFull(f"{size} bytes of KV exceed the {self.file.capacity}-byte staging buffer")
        deadline = time.monotonic() + timeout_s
        while (offset := self.file.regions.alloc(size)) is None:
            if time.monotonic() >= deadline:
                raise StagingFull(f"no room for {size} bytes of KV in the staging buffer within {timeout_s:.1f}s")
            await asyncio.sleep(WAIT_POLL_S)
        return offset

    def release(self, offset: int) -> None:
        self.file.regions.free(offset)

    def view(self, layout: KvLayout, offset: int, num_blocks: int) -> np.ndarray:
        return staging_view(self.file.array, layout, offset, num_blocks)

    async def write_chunk(self, view: np.ndarray, first: int, num_blocks: int, data: bytes) -> None:
        """Blocks [first, first + num_blocks) of a region, from a KvChunk's planes."""
        src = np.frombuffer(data, np.uint8).reshape(view.shape[0], num_blocks, view.shape[2])
        await asyncio.to_thread(view[:, first : first + num_blocks].__setitem__, slice(None), src)

    async def read_chunk(self, view: np.ndarray, first: int, num_blocks: int) -> bytes:
        return await asyncio.to_thread(lambda: view[:, first : first + num_blocks].tobytes())

    def close(self) -> None:
        self.file.close()
