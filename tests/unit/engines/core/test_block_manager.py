"""BlockManager on CPU: exact block ids, ref counts, free-queue order, cache bookkeeping, events."""

from engines.base.block_hash import NONE_HASH, chain_block_hashes, hash_block
from engines.base.types import SamplingParams
from engines.core import block_manager as bm_module
from engines.core.block_manager import BlockManager
from engines.core.sequence import Sequence

BS = 4


def make_seq(tokens, req_id: str = "r") -> Sequence:
    return Sequence(req_id, list(tokens), len(tokens), SamplingParams(max_tokens=64, ignore_eos=True))


def run_prefill(bm: BlockManager, seq: Sequence, computed=()) -> None:
    """Allocate and 'compute' the rest of `seq`'s tokens, as one engine step would."""
    num_new = seq.num_tokens - seq.num_computed_tokens - len(computed) * BS
    assert bm.allocate_slots(seq, num_new, computed)
    seq.num_computed_tokens = seq.num_tokens


def ref_counts(bm: BlockManager) -> list[int]:
    return [b.ref_count for b in bm.blocks]


A = list(range(100, 112))  # three full blocks
HA = chain_block_hashes(A, BS)


# -- allocation ------------------------------------------------------------------------------
def test_fresh_manager_has_every_block_free_in_id_order():
    bm = BlockManager(num_blocks=6, block_size=BS)
    assert list(bm.free_queue) == [0, 1, 2, 3, 4, 5]
    assert bm.num_free_blocks == 6
    assert bm.num_cached_free_blocks == 0
    assert bm.cached == {}
    assert [bm.num_blocks_for(n) for n in (0, 1, 4, 5, 8, 9)] == [0, 1, 1, 2, 2, 3]


def test_allocate_takes_blocks_from_the_front_and_registers_full_blocks():
    bm = BlockManager(num_blocks=6, block_size=BS)
    seq = make_seq(A[:10])
    assert bm.allocate_slots(seq, 10)
    assert seq.block_table == [0, 1, 2]
    assert ref_counts(bm) == [1, 1, 1, 0, 0, 0]
    assert list(bm.free_queue) == [3, 4, 5]
    assert seq.num_computed_tokens == 0  # allocation does not compute
    # two full blocks are cached; the 2-token tail is not
    assert bm.cached == {HA[0]: 0, HA[1]: 1}
    assert [bm.blocks[i].block_hash for i in range(3)] == [HA[0], HA[1], None]
    assert bm.blocks[1].token_ids == tuple(A[4:8])
    assert bm.blocks[1].parent_hash == HA[0]
    assert seq.num_registered_blocks == 2
    assert bm.drain_events().stored == [(NONE_HASH, HA[0], tuple(A[0:4])), (HA[0], HA[1], tuple(A[4:8]))]


def test_allocate_adds_a_block_only_when_a_token_crosses_a_boundary():
    bm = BlockManager(num_blocks=4, block_size=BS)
    seq = make_seq(A[:3])
    run_prefill(bm, seq)
    assert seq.block_table == [0] and bm.cached == {}
    seq.append_token(A[3])  # 4 tokens: the decode fills block 0
    assert bm.allocate_slots(seq, 1)
    assert seq.block_table == [0]
    assert bm.cached == {HA[0]: 0}  # registered once the step will fill it
    seq.num_computed_tokens = 4
    seq.append_token(A[4])  # token 5 needs a second block
    assert bm.allocate_slots(seq, 1)
    assert seq.block_table == [0, 1]
    assert list(bm.free_queue) == [2, 3]


def test_allocate_exactly_the_free_blocks_succeeds():
    bm = BlockManager(num_blocks=3, block_size=BS)
    seq = make_seq(A[:12])
    assert bm.allocate_slots(seq, 12)
    assert seq.block_table == [0, 1, 2]
    assert bm.num_free_blocks == 0


def test_allocate_is_all_or_nothing():
    bm = BlockManager(num_blocks=3, block_size=BS)
    first = make_seq(A[:8], "first")
    assert bm.allocate_slots(first, 8)
    second = make_seq(range(8), "second")
    events_before = (list(bm.events.stored), list(bm.events.removed))
    assert not bm.allocate_slots(second, 8)  # needs 2 blocks, 1 is free
    assert second.block_table == []
    assert second.num_computed_tokens == 0 and second.num_registered_blocks == 0
    assert ref_counts(bm) == [1, 1, 0]
    assert list(bm.free_queue) == [2]
    assert (bm.events.stored, bm.events.removed) == events_before
    assert bm.allocate_slots(second, 4)  # a chunk that fits still goes through
    assert second.block_table == [2]


def test_revived_hits_count_against_free_blocks_and_failure_leaves_them_free():
    bm = BlockManager(num_blocks=3, block_size=BS)
    a = make_seq(A[:9], "a")
    run_prefill(bm, a)
    bm.free(a)
    assert list(bm.free_queue) == [2, 1, 0]
    b = make_seq(A[:8] + [7, 7, 7, 7, 7], "b")  # hits blocks 0 and 1, then needs 2 blocks more
    computed = bm.get_computed_blocks(b)
    assert computed == [0, 1]
    assert not bm.allocate_slots(b, 5, computed)  # 2 revived + 2 new > 3 free
    assert ref_counts(bm) == [0, 0, 0]
    assert list(bm.free_queue) == [2, 1, 0]
    assert b.block_table == [] and b.num_computed_tokens == 0
    assert bm.cached == {HA[0]: 0, HA[1]: 1}


# -- free and the LRU queue ------------------------------------------------------------------
def test_free_sends_hashed_blocks_to_the_back_tail_first():
    bm = BlockManager(num_blocks=5, block_size=BS)
    seq = make_seq(A)  # three full blocks, all hashed
    run_prefill(bm, seq)
    assert list(bm.free_queue) == [3, 4]
    bm.free(seq)
    assert list(bm.free_queue) == [3, 4, 2, 1, 0]
    assert ref_counts(bm) == [0] * 5
    assert seq.block_table == [] and seq.num_registered_blocks == 0
    assert bm.cached == {HA[0]: 0, HA[1]: 1, HA[2]: 2}  # freed, still cached
    assert bm.num_cached_free_blocks == 3


def test_free_sends_an_unhashed_block_to_the_front():
    bm = BlockManager(num_blocks=6, block_size=BS)
    seq = make_seq(A[:10])  # blocks 0, 1 hashed; block 2 holds a partial tail
    run_prefill(bm, seq)
    bm.free(seq)
    assert list(bm.free_queue) == [2, 3, 4, 5, 1, 0]
    assert bm.num_cached_free_blocks == 2


def test_free_without_prefix_caching_puts_every_block_in_front():
    bm = BlockManager(num_blocks=5, block_size=BS, enable_prefix_caching=False)
    seq = make_seq(A)
    run_prefill(bm, seq)
    bm.free(seq)
    assert list(bm.free_queue) == [0, 1, 2, 3, 4]
    assert bm.cached == {} and bm.num_cached_free_blocks == 0
    assert bm.drain_events().stored == []


def test_free_of_a_shared_block_only_drops_one_reference():
    bm = BlockManager(num_blocks=5, block_size=BS)
    a = make_seq(A[:9], "a")
    run_prefill(bm, a)  # [0, 1, 2]
    b = make_seq(A[:8] + [7], "b")
    computed = bm.get_computed_blocks(b)
    assert bm.allocate_slots(b, 1, computed)
    assert b.block_table == [0, 1, 3]
    assert ref_counts(bm) == [2, 2, 1, 1, 0]
    bm.free(a)
    assert ref_counts(bm) == [1, 1, 0, 1, 0]
    assert list(bm.free_queue) == [2, 4]  # only a's private unhashed tail came back
    bm.free(b)
    assert list(bm.free_queue) == [3, 2, 4, 1, 0]


# -- eviction --------------------------------------------------------------------------------
def test_eviction_pops_the_front_and_uncaches_tail_blocks_first():
    bm = BlockManager(num_blocks=5, block_size=BS)
    a = make_seq(A, "a")
    run_prefill(bm, a)
    bm.free(a)
    bm.drain_events()
    assert list(bm.free_queue) == [3, 4, 2, 1, 0]
    b = make_seq(range(12), "b")
    assert bm.allocate_slots(b, 9)  # 3 blocks: the 2 never used, then a's tail block
    assert b.block_table == [3, 4, 2]
    assert bm.blocks[2].block_hash is None and bm.blocks[2].token_ids == ()
    assert bm.cached == {HA[0]: 0, HA[1]: 1, **dict(zip(chain_block_hashes(range(8), BS), (3, 4)))}
    events = bm.drain_events()
    assert events.removed == [HA[2]]
    assert [h for _, h, _ in events.stored] == chain_block_hashes(range(8), BS)
    # a's first two blocks are still served
    assert bm.get_computed_blocks(make_seq(A[:9], "c")) == [0, 1]


def test_drain_events_hands_over_and_resets():
    bm = BlockManager(num_blocks=2, block_size=BS)
    run_prefill(bm, make_seq(A[:5]))
    events = bm.drain_events()
    assert events.stored == [(NONE_HASH, HA[0], tuple(A[:4]))] and events.removed == []
    again = bm.drain_events()
    assert again.stored == [] and again.removed == []


# -- prefix hits -----------------------------------------------------------------------------
def test_prefix_hit_is_the_longest_matching_run_of_full_blocks():
    bm = BlockManager(num_blocks=8, block_size=BS)
    run_prefill(bm, make_seq(A, "a"))
    assert bm.get_computed_blocks(make_seq(A[:8] + [1, 2, 3, 4, 5], "b")) == [0, 1]
    assert bm.get_computed_blocks(make_seq(A[:4] + [1, 2, 3, 4] + A[8:] + [5], "c")) == [0]  # chain breaks
    assert bm.get_computed_blocks(make_seq([0] + A[1:], "d")) == []


def test_prefix_hit_leaves_at_least_one_token_to_compute():
    bm = BlockManager(num_blocks=8, block_size=BS)
    run_prefill(bm, make_seq(A, "a"))
    same = make_seq(A, "same")
    assert bm.get_computed_blocks(same) == [0, 1]  # not [0, 1, 2]: the last token must be computed
    assert same.block_hashes == HA[:2]
    assert bm.get_computed_blocks(make_seq(A + [1], "longer")) == [0, 1, 2]


def test_allocate_with_revived_hits_takes_them_off_the_free_queue():
    bm = BlockManager(num_blocks=5, block_size=BS)
    a = make_seq(A, "a")
    run_prefill(bm, a)
    bm.free(a)  # queue [3, 4, 2, 1, 0]
    b = make_seq(A[:8] + [1, 2], "b")
    computed = bm.get_computed_blocks(b)
    assert bm.allocate_slots(b, 2, computed)
    assert b.block_table == [0, 1, 3]
    assert b.num_computed_tokens == 8
    assert ref_counts(bm) == [1, 1, 0, 1, 0]
    assert list(bm.free_queue) == [4, 2]
    assert bm.drain_events().stored == [
        (NONE_HASH, HA[0], tuple(A[:4])),
        (HA[0], HA[1], tuple(A[4:8])),
        (HA[1], HA[2], tuple(A[8:])),
    ]  # a's only: hits are not re-stored


def test_prefix_caching_disabled_never_hits():
    bm = BlockManager(num_blocks=8, block_size=BS, enable_prefix_caching=False)
    run_prefill(bm, make_seq(A, "a"))
    b = make_seq(A + [1], "b")
    assert bm.get_computed_blocks(b) == []
    assert b.block_hashes == []


def test_an_identical_block_computed_twice_keeps_the_first_one_served():
    bm = BlockManager(num_blocks=4, block_size=BS)
    a, b = make_seq(A[:5], "a"), make_seq(A[:5], "b")
    assert bm.allocate_slots(a, 5)  # [0, 1]
    assert bm.allocate_slots(b, 5)  # [2, 3]: allocated without looking up hits
    assert bm.cached == {HA[0]: 0}
    assert bm.blocks[2].block_hash == HA[0]
    assert len(bm.drain_events().stored) == 1
    bm.free(b)  # queue [3, 2]
    c = make_seq(range(8), "c")
    assert bm.allocate_slots(c, 8)  # evicts b's duplicate: a's entry must survive
    assert c.block_table == [3, 2]
    assert bm.drain_events().removed == []
    assert bm.cached[HA[0]] == 0


# -- hash collisions -------------------------------------------------------------------------
def test_colliding_hash_with_other_tokens_is_not_served(monkeypatch):
    monkeypatch.setattr(bm_module, "hash_block", lambda parent, tokens: 42)  # every block collides
    bm = BlockManager(num_blocks=4, block_size=BS)
    a = make_seq([1, 2, 3, 4, 9], "a")
    run_prefill(bm, a)  # [0, 1]
    assert bm.cached == {42: 0}
    b = make_seq([5, 6, 7, 8, 9], "b")
    assert bm.get_computed_blocks(b) == []
    run_prefill(bm, b)  # [2, 3]
    assert bm.cached == {42: 0}  # b's block does not take over the entry
    assert len(bm.drain_events().stored) == 1
    bm.free(b)  # queue [3, 2]
    c = make_seq([10, 11, 12, 13, 14, 15, 16, 17], "c")
    assert bm.allocate_slots(c, 8)  # evicts b's colliding block 2
    assert c.block_table == [3, 2]
    assert bm.drain_events().removed == []  # a's entry is not removed on b's behalf
    assert bm.cached == {42: 0}
    assert bm.get_computed_blocks(make_seq([1, 2, 3, 4, 9], "d")) == [0]


def test_colliding_hash_with_same_tokens_after_another_prefix_is_not_served(monkeypatch):
    # A block's KV depends on every token before it, so a block is only the same if its prefix is.
    # Here block 1 of c ([5,6,7,8] then [20..23]) and block 1 of b ([1,2,3,4] then [20..23]) hash alike.
    monkeypatch.setattr(bm_module, "hash_block", lambda parent, tokens: hash_block(NONE_HASH, tokens))
    bm = BlockManager(num_blocks=8, block_size=BS)
    run_prefill(bm, make_seq([1, 2, 3, 4, 0], "a"))  # [0, 1]
    run_prefill(bm, make_seq([5, 6, 7, 8, 20, 21, 22, 23, 0], "c"))  # [2, 3, 4]
    b = make_seq([1, 2, 3, 4, 20, 21, 22, 23, 0], "b")
    assert bm.get_computed_blocks(b) == [0]  # block 3 holds KV computed after [5, 6, 7, 8]


def test_the_cached_free_block_counter_matches_a_scan():
    """Stats read a counter, never a scan of the free queue: the counter must agree with one after every change."""
    bm = BlockManager(6, BS)

    def scanned() -> int:
        return sum(1 for b in bm.free_queue if bm.blocks[b].block_hash is not None)

    a, b = make_seq(range(9), "a"), make_seq(range(20, 29), "b")
    for s in (a, b):
        run_prefill(bm, s)
        assert bm.num_cached_free_blocks == scanned() == 0
    bm.free(a)
    assert bm.num_cached_free_blocks == scanned() == 2  # a's two full blocks stay cached; its tail does not
    again = make_seq(range(9), "again")
    run_prefill(bm, again, bm.get_computed_blocks(again))  # the hit revives both
    assert bm.num_cached_free_blocks == scanned() == 0
    for s in (b, again):
        bm.free(s)
        assert bm.num_cached_free_blocks == scanned()
    big = make_seq(range(100, 124), "big")
    run_prefill(bm, big)  # takes every block: the cached ones are evicted
    assert bm.num_cached_free_blocks == scanned() == 0
    bm.free(big)
    assert bm.num_cached_free_blocks == scanned() == 6
    assert bm.reset_prefix_cache() == 6 and bm.num_cached_free_blocks == scanned() == 0
