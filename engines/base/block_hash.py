"""The one chained block hash: h_i = XXH3-64(h_{i-1} || tokens of block i), full blocks only.

Every part of tandem that names a KV block (prefix cache, KV events, router index, simulator)
calls this module; nothing else may hash blocks.
"""
from collections.abc import Sequence
from array import array

import xxhash

HASH_SEED = 0x7A6E_6465_6D00  # fixed: hashes must agree across processes and restarts
NONE_HASH = 0  # parent hash of the first block


def hash_block(parent_hash: int, token_ids: Sequence[int]) -> int:
    """Hash one full block of token ids chained on its parent's hash."""
    h = xxhash.xxh3_64(seed=HASH_SEED)
    h.update(parent_hash.to_bytes(8, "little"))
    h.update(array("q", token_ids).tobytes())
    return h.intdigest()


def chain_block_hashes(
    token_ids: Sequence[int], block_size: int, parent_hash: int = NONE_HASH
) -> list[int]:
    """Hashes of every full block of `token_ids`; a partial last block gets none."""
    if block_size < 1:
        raise ValueError(f"block_size must be >= 1, got {block_size}")
    hashes: list[int] = []
    for start in range(0, len(token_ids) - block_size + 1, block_size):
        parent_hash = hash_block(parent_hash, token_ids[start : start + block_size])
        hashes.append(parent_hash)
    return hashes
