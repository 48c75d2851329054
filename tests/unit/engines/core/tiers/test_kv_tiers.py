"""TierPool and KvTiers on CPU: exact slots, LRU order, pins, dedup, disk admission, the prefix walk, events."""

import pytest

from engines.base.block_hash import NONE_HASH, chain_block_hashes
from engines.base.events import KvTier
from engines.core.tiers.kv_tiers import DiskWrite, KvTiers, Onboard, OnboardBlock, TierSpec, beats_recompute
from engines.core.tiers.tier_pool import TierPool

BS = 4
A = list(range(100, 116))  # four full blocks
HA = chain_block_hashes(A, BS)


def blocks_of(tokens, hashes, first_block_id=0):
    """(block id, parent, hash, tokens) per full block, as the core hands completed blocks to `offload`."""
    return [
        (first_block_id + i, hashes[i - 1] if i else NONE_HASH, h, tuple(tokens[i * BS : (i + 1) * BS]))
        for i, h in enumerate(hashes)
    ]


# -- TierPool ----------------------------------------------------------------------------------
def test_pool_hands_out_slots_in_order_and_evicts_least_recently_used():
    pool = TierPool(KvTier.HOST, 2)
    a, _ = pool.put(NONE_HASH, 11, (1,))
    b, _ = pool.put(11, 12, (2,))
    assert (a.slot, b.slot) == (0, 1)
    pool.touch(11)  # 12 is now the least recently used
    c, evicted = pool.put(12, 13, (3,))
    assert [e.block_hash for e in evicted] == [12]
    assert c.slot == 1 and list(pool.blocks) == [11, 13]
    assert pool.drain() == ([(NONE_HASH, 11), (11, 12), (12, 13)], [12])
    assert pool.drain() == ([], [])


def test_pool_put_of_a_held_hash_only_touches_it():
    pool = TierPool(KvTier.HOST, 2)
    pool.put(NONE_HASH, 11, (1,))
    pool.put(11, 12, (2,))
    block, evicted = pool.put(NONE_HASH, 11, (1,))
    assert block.slot == 0 and evicted == [] and list(pool.blocks) == [12, 11]
    assert pool.drain()[0] == [(NONE_HASH, 11), (11, 12)]  # stored once


def test_pool_never_evicts_a_pinned_block_and_refuses_when_all_are_pinned():
    pool = TierPool(KvTier.DISK, 2)
    a, _ = pool.put(NONE_HASH, 11, (1,))
    b, _ = pool.put(11, 12, (2,))
    a.num_pins = 1
    _, evicted = pool.put(12, 13, (3,))
    assert [e.block_hash for e in evicted] == [12]  # 11 is older but pinned
    pool.blocks[13].num_pins = 1
    assert pool.put(13, 14, (4,)) == (None, [])
    assert set(pool.blocks) == {11, 13}


def test_pool_get_confirms_tokens_and_parent():
    pool = TierPool(KvTier.HOST, 1)
    pool.put(7, 11, (1, 2))
    assert pool.get(11, 7, (1, 2)).slot == 0
    assert pool.get(11, 7, (1, 3)) is None
    assert pool.get(11, 8, (1, 2)) is None
    assert pool.get(12, 7, (1, 2)) is None


def test_pool_remove_and_clear_free_their_slots():
    pool = TierPool(KvTier.HOST, 2)
    pool.put(NONE_HASH, 11, (1,))
    pool.put(11, 12, (2,))
    assert pool.remove(11).slot == 0
    assert pool.remove(11) is None
    assert pool.put(NONE_HASH, 21, (5,))[0].slot == 0
    assert [b.block_hash for b in pool.clear()] == [12, 21]
    assert len(pool) == 0 and pool.put(NONE_HASH, 31, (6,))[0].slot == 0


# -- write-through and disk admission ---------------------------------------------------------
def test_offload_copies_each_new_hash_once_into_the_host_tier():
    tiers = KvTiers(TierSpec(num_host_blocks=8, block_bytes=100), BS)
    assert tiers.offload(blocks_of(A, HA, first_block_id=5)) == [(5, 0), (6, 1), (7, 2), (8, 3)]
    # the same prefix computed again elsewhere (other device blocks): deduplicated by hash
    assert tiers.offload(blocks_of(A, HA, first_block_id=20)) == []
    assert tiers.counters.num_host_offloaded == 4
    stored, removed = tiers.drain()[KvTier.HOST]
    assert stored == [(NONE_HASH, HA[0]), (HA[0], HA[1]), (HA[1], HA[2]), (HA[2], HA[3])] and removed == []


def test_host_tier_evicts_lru_and_reports_removed():
    tiers = KvTiers(TierSpec(num_host_blocks=2, block_bytes=100), BS)
    assert tiers.offload(blocks_of(A, HA)[:2]) == [(0, 0), (1, 1)]
    assert tiers.offload(blocks_of(A, HA)[2:3]) == [(2, 0)]  # slot 0 (HA[0]) was the least recently used
    assert tiers.drain()[KvTier.HOST][1] == [HA[0]]


def test_a_block_goes_to_disk_on_its_second_sighting_only():
    tiers = KvTiers(TierSpec(num_host_blocks=8, num_disk_blocks=8, block_bytes=100), BS)
    tiers.offload(blocks_of(A, HA)[:2])
    assert tiers.take_disk_writes() == []  # seen once
    tiers.see(HA[0])  # a prefix hit
    assert tiers.take_disk_writes() == [DiskWrite(HA[0], NONE_HASH, tuple(A[:4]), 0)]
    assert tiers.host.blocks[HA[0]].num_pins == 1  # the write reads its slot
    tiers.see(HA[0])
    assert tiers.take_disk_writes() == []  # a write in flight is not repeated
    tiers.disk_written(HA[0], ok=True)
    assert tiers.host.blocks[HA[0]].num_pins == 0
    assert HA[0] in tiers.disk and tiers.counters.num_disk_written == 1
    assert tiers.drain()[KvTier.DISK] == ([(NONE_HASH, HA[0])], [])
    tiers.see(HA[0])
    assert tiers.take_disk_writes() == []  # on disk already


def test_a_failed_disk_write_stops_disk_writes_but_keeps_the_host_block():
    tiers = KvTiers(TierSpec(num_host_blocks=8, num_disk_blocks=8, block_bytes=100), BS)
    tiers.offload(blocks_of(A, HA))
    tiers.see(HA[0])
    tiers.see(HA[1])
    assert [w.block_hash for w in tiers.take_disk_writes()] == [HA[0], HA[1]]
    tiers.disk_written(HA[0], ok=False)
    tiers.disk_written(HA[1], ok=False)
    assert not tiers.is_disk_writable and tiers.counters.num_disk_errors == 2
    assert len(tiers.disk) == 0 and tiers.host.blocks[HA[0]].num_pins == 0
    tiers.see(HA[2])
    tiers.see(HA[2])
    assert tiers.take_disk_writes() == []


def test_disk_eviction_drops_the_evicted_files():
    tiers = KvTiers(TierSpec(num_host_blocks=8, num_disk_blocks=1, block_bytes=100), BS)
    tiers.offload(blocks_of(A, HA))
    for h in HA[:2]:
        tiers.see(h)
    for w in tiers.take_disk_writes():
        tiers.disk_written(w.block_hash, ok=True)
    assert list(tiers.disk.blocks) == [HA[1]]
    assert tiers.take_disk_drops() == [HA[0]]
    assert tiers.take_disk_drops() == []


def test_restore_disk_indexes_a_previous_runs_blocks_and_announces_them():
    tiers = KvTiers(TierSpec(num_host_blocks=4, num_disk_blocks=2, block_bytes=100), BS)
    tiers.restore_disk(
        [(HA[0], NONE_HASH, tuple(A[:4])), (HA[1], HA[0], tuple(A[4:8])), (HA[2], HA[1], tuple(A[8:12]))]
    )
    assert list(tiers.disk.blocks) == [HA[1], HA[2]]  # the oldest did not fit
    assert tiers.take_disk_drops() == [HA[0]]
    assert tiers.drain()[KvTier.DISK] == ([(NONE_HASH, HA[0]), (HA[0], HA[1]), (HA[1], HA[2])], [HA[0]])


# -- the prefix walk and loads -----------------------------------------------------------------
def test_match_walks_host_then_disk_and_stops_at_the_first_miss():
    tiers = KvTiers(TierSpec(num_host_blocks=8, num_disk_blocks=8, block_bytes=100), BS)
    tiers.offload(blocks_of(A, HA)[:1])
    tiers.restore_disk([(HA[1], HA[0], tuple(A[4:8])), (HA[3], HA[2], tuple(A[12:16]))])
    found = tiers.match(HA, A, 0, 4)
    assert found == [
        OnboardBlock(KvTier.HOST, 0, HA[0], NONE_HASH, tuple(A[:4])),
        OnboardBlock(KvTier.DISK, -1, HA[1], HA[0], tuple(A[4:8])),
    ]
    assert tiers.match(HA, A, 1, 4) == found[1:]
    assert tiers.match(HA, A, 0, 4, frozenset({KvTier.HOST})) == found[:1]  # disk left out by the cost check
    assert tiers.match(HA, A, 0, 1) == found[:1]


def test_match_confirms_tokens():
    tiers = KvTiers(TierSpec(num_host_blocks=8, block_bytes=100), BS)
    tiers.offload(blocks_of(A, HA))
    other = A[:4] + [1, 2, 3, 4]
    assert len(tiers.match(HA, other, 0, 2)) == 1  # same hashes claimed, other tokens: never served


def test_a_load_pins_its_blocks_and_others_see_them_in_flight():
    tiers = KvTiers(TierSpec(num_host_blocks=2, block_bytes=100), BS)
    tiers.offload(blocks_of(A, HA)[:2])
    found = tiers.match(HA, A, 0, 2)
    tiers.pin_load("r1", found)
    assert tiers.in_flight == {HA[0]: "r1", HA[1]: "r1"}
    assert tiers.match(HA, A, 0, 2) == []  # being onboarded: wait on that load, never load twice
    assert tiers.offload(blocks_of(A, HA)[2:3]) == []  # every host slot pinned: nothing evicted
    tiers.load_done("r1", Onboard(tuple(found)), ok=True, seconds=0.25)
    assert tiers.in_flight == {} and all(b.num_pins == 0 for b in tiers.host.blocks.values())
    assert tiers.counters.hit_tokens == {KvTier.HOST: 8, KvTier.DISK: 0}
    assert tiers.counters.onboarded_blocks[KvTier.HOST] == 2
    assert (tiers.counters.num_onboards, tiers.counters.onboard_s) == (1, 0.25)


def test_a_failed_load_counts_nothing():
    tiers = KvTiers(TierSpec(num_host_blocks=2, block_bytes=100), BS)
    tiers.offload(blocks_of(A, HA)[:2])
    found = tiers.match(HA, A, 0, 2)
    tiers.pin_load("r1", found)
    tiers.load_done("r1", Onboard(tuple(found)), ok=False, seconds=0.25)
    assert tiers.counters.num_onboards == 0 and tiers.counters.hit_tokens[KvTier.HOST] == 0
    assert tiers.in_flight == {}


def test_drop_and_clear():
    tiers = KvTiers(TierSpec(num_host_blocks=4, num_disk_blocks=4, block_bytes=100), BS)
    tiers.offload(blocks_of(A, HA))
    tiers.restore_disk([(HA[1], HA[0], tuple(A[4:8])), (HA[2], HA[1], tuple(A[8:12]))])
    tiers.drop(KvTier.DISK, [HA[1]])
    assert list(tiers.disk.blocks) == [HA[2]]
    tiers.clear()
    assert len(tiers.host) == 0 and len(tiers.disk) == 0
    assert tiers.take_disk_drops() == [HA[2]]


def test_cost_check_compares_a_blocks_load_with_its_recompute():
    # 1 MB per 16-token block: at 1 GB/s a load takes 1 ms; recomputing at 10k tokens/s, 1.6 ms
    assert beats_recompute(1_000_000, 16, 1e9, 10_000)
    assert not beats_recompute(1_000_000, 16, 1e9, 20_000)  # 0.8 ms to recompute
    assert beats_recompute(1_000_000, 16, 0.0, 20_000)  # not measured yet: try it


def test_spec_checks():
    with pytest.raises(ValueError, match="host tier"):
        TierSpec(num_disk_blocks=4)
    with pytest.raises(ValueError):
        TierSpec(num_host_blocks=-1)
    assert not TierSpec().is_enabled and TierSpec(num_host_blocks=1).is_enabled
