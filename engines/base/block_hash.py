"""The one chained block hash: h_i = XXH3-64(tokens of block i as little-endian uint32, seed h_{i-1} ^ SEED),
full blocks only.

Every part of tandem that names a KV block (prefix cache, KV events, router index, simulator)
calls this module; nothing else may hash blocks.
"""
import sys
from array import array
from collections.abc import Sequence

import xxhash

HASH_SEED = 0x7A6E_6465_6D00  # fixed: hashes must agree across processes and restarts
NONE_HASH = 0  # parent hash of the first block
_TOKEN = "I"  # NOTE: token ids are in [0, 2**32); packing them is most of the cost of hashing a long prompt
_xxh3 = xxhash.xxh3_64_intdigest
assert array(_TOKEN).itemsize == 4 and sys.byteorder == "little", "block hashes assume 4-byte little-endian ids"


def hash_block(parent_hash: int, token_ids: Sequence[int]) -> int:
    """Hash one full block of token ids chained on its parent's hash."""
    return _xxh3(array(_TOKEN, token_ids).tobytes(), parent_hash ^ HASH_SEED)


def chain_block_hashes(
    token_ids: Sequence[int], block_size: int, parent_hash: int = NONE_HASH
) -> list[int]:
    """Hashes of every full block of `token_ids`; a partial last block gets none. Packs the ids once."""
    if block_size < 1:
        raise ValueError(f"block_size must be >= 1, got {block_size}")
    data = array(_TOKEN, token_ids).tobytes()
    width = 4 * block_size
    hashes: list[int] = []
    for start in range(0, len(data) - width + 1, width):
        parent_hash = _xxh3(data[start : start + width], parent_hash ^ HASH_SEED)
        hashes.append(parent_hash)
    return hashes
