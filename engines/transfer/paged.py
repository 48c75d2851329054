"""The paged KV cache as bytes: a [num_layers * 2 planes, num_blocks, block_bytes] array at one address, the
NIXL region table of its (plane, block) pieces, and block copies in and out of a staging view. Numpy only."""
from dataclasses import dataclass

import numpy as np

from engines.base.requests import DTYPE_BYTES
from engines.base.types import KvLayout


def block_bytes(layout: KvLayout) -> int:
    """Bytes of one block in one plane (one layer's K or V)."""
    return layout.block_size * layout.num_kv_heads * layout.head_dim * DTYPE_BYTES[layout.dtype]


@dataclass(frozen=True, slots=True)
class Geometry:
    num_planes: int  # num_layers * 2 (k, v)
    num_blocks: int
    block_bytes: int
    base: int  # address of the first byte
    mem: str = "DRAM"  # or "VRAM"
    device_id: int = 0

    @classmethod
    def of(cls, layout: KvLayout, num_blocks: int, base: int, mem: str = "DRAM", device_id: int = 0) -> "Geometry":
        return cls(layout.num_layers * 2, num_blocks, block_bytes(layout), base, mem, device_id)

    @property
    def nbytes(self) -> int:
        return self.num_planes * self.num_blocks * self.block_bytes

    def region_table(self) -> np.ndarray:
        """[num_planes * num_blocks, 3] uint64 (address, length, device): every (plane, block) piece, plane-major."""
        starts = self.base + np.arange(self.num_planes * self.num_blocks, dtype=np.uint64) * self.block_bytes
        table = np.empty((len(starts), 3), dtype=np.uint64)
        table[:, 0], table[:, 1], table[:, 2] = starts, self.block_bytes, self.device_id
        return table

    def indices(self, block_ids) -> np.ndarray:
        """Rows of `region_table` for `block_ids` in every plane, plane-major (the staging order)."""
        blocks = np.asarray(block_ids, dtype=np.int64)
        planes = np.arange(self.num_planes, dtype=np.int64)[:, None] * self.num_blocks
        return (planes + blocks[None, :]).reshape(-1).astype(np.int32)


def staging_nbytes(layout: KvLayout, num_blocks: int) -> int:
    return layout.num_layers * 2 * num_blocks * block_bytes(layout)


def staging_view(buffer: np.ndarray, layout: KvLayout, offset: int, num_blocks: int) -> np.ndarray:
    """[planes, num_blocks, block_bytes] uint8 over `buffer[offset:]`: the KvExport byte order."""
    n = staging_nbytes(layout, num_blocks)
    return buffer[offset : offset + n].reshape(layout.num_layers * 2, num_blocks, block_bytes(layout))


class HostCache:
    """A paged cache in host memory, viewed as [planes, num_blocks, block_bytes] uint8."""

    def __init__(self, array: np.ndarray, layout: KvLayout, num_blocks: int):
        self.layout = layout
        self.blocks = array.reshape(-1).view(np.uint8).reshape(layout.num_layers * 2, num_blocks, block_bytes(layout))
        self.geometry = Geometry.of(layout, num_blocks, self.blocks.ctypes.data)

    def write_blocks(self, block_ids, src: np.ndarray) -> None:
        """Copy `src` ([planes, len(block_ids), block_bytes]) into `block_ids`."""
        for i, b in enumerate(block_ids):  # NOTE: per block: numpy's plain copies run without the GIL
            self.blocks[:, b] = src[:, i]

    def read_blocks(self, block_ids, dst: np.ndarray) -> None:
        for i, b in enumerate(block_ids):
            dst[:, i] = self.blocks[:, b]
