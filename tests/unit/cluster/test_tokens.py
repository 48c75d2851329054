"""Mooncake hash-id expansion: shared ids are shared token prefixes; different ids differ in every block."""

from engines.base.block_hash import chain_block_hashes
from tandem.bench.traces import TraceRow
from tandem.cluster.tokens import expand_hash_ids, prompt_tokens


def test_lengths_and_shared_prefix():
    a = expand_hash_ids((0, 5, 7), 1100)
    b = expand_hash_ids((0, 5, 8), 1030)
    assert len(a) == 1100 and len(b) == 1030
    assert a[:1024] == b[:1024] and a[1024:1030] != b[1024:1030]


def test_block_hashes_match_exactly_up_to_the_first_different_id():
    a = chain_block_hashes(expand_hash_ids((0, 5, 7), 1536), 64)
    b = chain_block_hashes(expand_hash_ids((0, 6, 7), 1536), 64)
    assert len(a) == 24
    assert a[:8] == b[:8] and all(x != y for x, y in zip(a[8:], b[8:]))


def test_rows_without_ids_share_nothing():
    r = TraceRow(0.0, 600, 10)
    a, b = prompt_tokens(r, 0), prompt_tokens(r, 1)
    assert len(a) == 600 and not set(chain_block_hashes(a, 16)) & set(chain_block_hashes(b, 16))
