"""Prompts for simulated requests: Mooncake hash ids expanded into token ids so that shared ids are shared
token prefixes at any engine block size that divides 16; rows without ids get unique prompts. Pure."""

from engines.base.block_hash import num_blocks_for
from tandem.bench.traces import MOONCAKE_BLOCK_SIZE, TraceRow

MARK_EVERY = 16  # one id-marking token per 16 positions: any engine block of 16k tokens carries its id
_UNIQUE_BASE = 1 << 30  # ids of rows without hash ids: above any trace's, and token ids stay below 2**32
_FILLER = [j % MARK_EVERY for j in range(MOONCAKE_BLOCK_SIZE)]  # values < MARK_EVERY, never a mark


def id_block(hash_id: int, num_tokens: int = MOONCAKE_BLOCK_SIZE) -> list[int]:
    """The first `num_tokens` tokens of the 512-token block behind `hash_id`."""
    tokens = _FILLER[:num_tokens]
    tokens[0::MARK_EVERY] = [MARK_EVERY + hash_id] * len(range(0, num_tokens, MARK_EVERY))
    return tokens


def expand_hash_ids(hash_ids: tuple[int, ...], num_tokens: int) -> list[int]:
    """`num_tokens` prompt tokens, 512 per id; the last id's block is cut to fit."""
    tokens: list[int] = []
    for i, hash_id in enumerate(hash_ids):
        tokens += id_block(hash_id, min(MOONCAKE_BLOCK_SIZE, num_tokens - i * MOONCAKE_BLOCK_SIZE))
    return tokens


def prompt_tokens(row: TraceRow, row_index: int) -> list[int]:
    """A row's prompt: its hash ids expanded, or (no ids, e.g. Azure) ids no other row shares."""
    if row.hash_ids:
        return expand_hash_ids(row.hash_ids, row.isl)
    ids = tuple(_UNIQUE_BASE + row_index * 1024 + i for i in range(num_blocks_for(row.isl, MOONCAKE_BLOCK_SIZE)))
    return expand_hash_ids(ids, row.isl)
