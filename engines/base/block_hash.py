"""The one chained block hash: h_i = XXH3-64(tokens of block i as little-endian uint32, seed h_{i-1} ^ SEED),
full blocks only. The first block's parent is the chain's root: NONE_HASH, or a keyed digest of the tenant's cache
salt and the deployment's secret (chain_root), so tenants never share a block and nobody outside can recompute one.

Every part of tandem that names a KV block (prefix cache, KV events, router index, simulator)
calls this module; nothing else may hash blocks, or count the blocks a number of tokens fills.
"""

import functools
import hashlib
import sys
from array import array
from collections.abc import Sequence

import xxhash

HASH_SEED = 0x7A6E_6465_6D00  # fixed: hashes must agree across processes and restarts
NONE_HASH = 0  # the root of a chain with no salt and no deployment secret
_ROOT_PERSON = b"tandem-kv-root"
_TOKEN = "I"  # NOTE: token ids are in [0, 2**32); packing them is most of the cost of hashing a long prompt
_xxh3 = xxhash.xxh3_64_intdigest
assert array(_TOKEN).itemsize == 4 and sys.byteorder == "little", "block hashes assume 4-byte little-endian ids"


def num_blocks_for(num_tokens: int, block_size: int) -> int:
    """The blocks `num_tokens` tokens fill, the last one perhaps partly: ceil(num_tokens / block_size)."""
    return -(-num_tokens // block_size)


def hash_block(parent_hash: int, token_ids: Sequence[int]) -> int:
    """Hash one full block of token ids chained on its parent's hash."""
    return _xxh3(array(_TOKEN, token_ids).tobytes(), parent_hash ^ HASH_SEED)


def chain_block_hashes(token_ids: Sequence[int], block_size: int, parent_hash: int = NONE_HASH) -> list[int]:
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


@functools.lru_cache(maxsize=4096)
def chain_root(cache_salt: str = "", secret: str = "") -> int:
    """The parent hash of a prompt's first block: NONE_HASH when neither is set, else BLAKE2b keyed with the
    deployment `secret` over the tenant's `cache_salt`. NOTE: a keyed digest, not XXH3, so a published block hash
    cannot be tested against a guessed prompt without the secret; it is never published itself."""
    if not cache_salt and not secret:
        return NONE_HASH
    key = hashlib.sha256(secret.encode()).digest()
    digest = hashlib.blake2b(cache_salt.encode(), key=key, digest_size=8, person=_ROOT_PERSON).digest()
    return int.from_bytes(digest, "little") or 1  # NOTE: never NONE_HASH, which means "unsalted, public"
