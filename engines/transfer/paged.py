"""The paged KV cache as bytes: a [num_layers * 2 planes, num_blocks, block_bytes] array at one address, the
NIXL pieces of its (plane, block) pairs, pieces merged into runs contiguous on both sides of a transfer,
and block copies in and out of a staging view. Numpy only."""

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

    def pieces(self, block_ids) -> np.ndarray:
        """[num_planes * len(block_ids), 3] uint64 (address, length, device) rows: the (plane, block) piece of
        each of `block_ids` in every plane, plane-major (the staging order)."""
        blocks = np.asarray(block_ids, dtype=np.uint64).reshape(-1)
        planes = np.arange(self.num_planes, dtype=np.uint64)[:, None] * np.uint64(self.num_blocks)
        starts = np.uint64(self.base) + (planes + blocks[None, :]).reshape(-1) * np.uint64(self.block_bytes)
        table = np.empty((len(starts), 3), dtype=np.uint64)
        table[:, 0], table[:, 1], table[:, 2] = starts, self.block_bytes, self.device_id
        return table


def merge_runs(local: np.ndarray, remote: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Two tables of paired (address, length, device) rows, with each row folded into the one before it where
    BOTH sides continue that row's bytes on the same device: consecutive source blocks going to consecutive
    local blocks become one row per plane (and whole planes, when both pools are contiguous there). The bytes
    moved, and where, are unchanged; a transfer just posts far fewer, larger pieces."""
    if local.shape != remote.shape:
        raise ValueError(f"paired tables differ in shape: {local.shape} vs {remote.shape}")
    if len(local) == 0:
        return local, remote
    starts = np.ones(len(local), dtype=bool)
    starts[1:] = ~(_continues(local) & _continues(remote))
    heads = np.flatnonzero(starts)
    return _fold(local, heads), _fold(remote, heads)


def _continues(table: np.ndarray) -> np.ndarray:
    """[len(table) - 1] bool: row i + 1 starts where row i ends, on the same device."""
    return (table[1:, 0] == table[:-1, 0] + table[:-1, 1]) & (table[1:, 2] == table[:-1, 2])


def _fold(table: np.ndarray, heads: np.ndarray) -> np.ndarray:
    out = table[heads].copy()
    out[:, 1] = np.add.reduceat(table[:, 1], heads)
    return out


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
