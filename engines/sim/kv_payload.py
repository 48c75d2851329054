"""The sim runner's real paged KV cache: GPU-sized bytes per token in host memory, so transfers move what a
real engine's would. Each computed token's slot in every plane is stamped with (plane, position, token id),
so a load can check it holds the tokens it claims. Numpy only."""

import numpy as np

from engines.base.types import KvLayout
from engines.core.loads import KvLoad
from engines.transfer.paged import HostCache, block_bytes

LLAMA_8B_KV_BYTES_PER_TOKEN = 131072  # 32 layers x 2 x 8 KV heads x 128 dims x 2 bytes (bf16)
DEFAULT_MAX_CACHE_BYTES = 2 << 30  # a worker's pool unless its num_blocks says otherwise


def payload_layout(bytes_per_token: int, block_size: int) -> KvLayout:
    """A Llama-like bf16 layout (32 layers, 8 KV heads) when the size allows, else one float32 plane pair."""
    if bytes_per_token % 1024 == 0:
        return KvLayout(32, 8, bytes_per_token // 1024, "bfloat16", block_size)
    if bytes_per_token < 8 or bytes_per_token % 8:
        raise ValueError(f"KV bytes per token must be a positive multiple of 8, got {bytes_per_token}")
    return KvLayout(1, 1, bytes_per_token // 8, "float32", block_size)


def default_num_blocks(bytes_per_token: int, block_size: int, profile_blocks: int) -> int:
    return max(1, min(profile_blocks, DEFAULT_MAX_CACHE_BYTES // (bytes_per_token * block_size)))


class SimKvCache(HostCache):
    def __init__(self, layout: KvLayout, num_blocks: int, prefault: bool = False):
        # NOTE: zeros: the OS hands out pages as they are first written, so an idle pool costs no memory; NIXL
        # wants them resident (prefault): UCX faulting pages in on a first READ stalls it for seconds, as
        # registering pinned GPU memory never does
        array = np.zeros(layout.num_layers * 2 * num_blocks * block_bytes(layout), np.uint8)
        if prefault:
            array.fill(0)
        super().__init__(array, layout, num_blocks)
        slot_bytes = self.blocks.shape[2] // layout.block_size
        # [planes, num_blocks, block_size, slot_bytes // 8]: a token's first 8 bytes per plane hold its stamp
        self.stamps = (
            self.blocks.view(np.uint64).reshape(*self.blocks.shape[:2], layout.block_size, -1)
            if slot_bytes % 8 == 0
            else None
        )

    def stamp(self, block_table: list[int], start: int, token_ids: list[int]) -> None:
        """Stamp the KV slots of tokens at positions start.. (what computing them would write)."""
        if self.stamps is not None and token_ids:
            rows, cols, expected = self._where(block_table, start, token_ids)
            self.stamps[:, rows, cols, 0] = expected

    def check(self, load: KvLoad) -> str:
        """ "" when the loaded blocks hold the source's tokens from position 0, else what is wrong."""
        if self.stamps is None:
            return ""
        token_ids = list(load.source.token_ids)
        rows, cols, expected = self._where(list(load.block_ids), 0, token_ids)
        bad = np.flatnonzero((self.stamps[:, rows, cols, 0] != expected).any(axis=0))
        return f"loaded KV differs from its tokens' at {len(bad)} positions (first {bad[0]})" if len(bad) else ""

    def _where(self, block_table: list[int], start: int, token_ids: list[int]):
        bs = self.layout.block_size
        pos = np.arange(start, start + len(token_ids), dtype=np.int64)
        rows = np.asarray(block_table, dtype=np.int64)[pos // bs]
        planes = np.arange(self.blocks.shape[0], dtype=np.uint64)[:, None]
        expected = (
            (planes << np.uint64(56))
            ^ (pos.astype(np.uint64) << np.uint64(24))
            ^ np.asarray(token_ids, dtype=np.uint64)
        )
        return rows, pos % bs, expected
