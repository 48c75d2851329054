"""The router's prefix index on hand-made event streams: longest prefix per worker, gaps, resync, churn, bounds."""

import pytest

from engines.base.block_hash import NONE_HASH, chain_block_hashes
from engines.base.events import KvEvent, KvEventKind, KvEventLog, KvTier
from services.router.prefix_index import CachedPrefix, PrefixIndex

BS = 4
PROMPT = list(range(100, 120))  # 5 full blocks of 4
H = chain_block_hashes(PROMPT, BS)


def stored(seq: int, hashes, parent: int = NONE_HASH, tier: KvTier = KvTier.DEVICE) -> KvEvent:
    return KvEvent(seq, KvEventKind.STORED, parent, tuple(hashes), tier)


def removed(seq: int, hashes, tier: KvTier = KvTier.DEVICE) -> KvEvent:
    return KvEvent(seq, KvEventKind.REMOVED, NONE_HASH, tuple(hashes), tier)


def loaded() -> PrefixIndex:
    """w1 holds 2 blocks of the prompt, w2 all 5, w3 only a different prefix."""
    index = PrefixIndex()
    assert index.apply("w1", [stored(1, H[:2])])
    assert index.apply("w2", [stored(1, H[:3]), stored(2, H[3:], parent=H[2])])
    assert index.apply("w3", [stored(1, chain_block_hashes(list(range(20)), BS))])
    return index


def test_longest_prefix_per_worker_from_token_ids():
    index = loaded()
    assert index.overlap(chain_block_hashes(PROMPT, BS)) == {"w1": 2, "w2": 5}
    # a partial last block never matches
    assert index.overlap(chain_block_hashes(PROMPT[:11], BS)) == {"w1": 2, "w2": 2}
    # the first block differs: nothing downstream
    assert index.overlap(chain_block_hashes([7] + PROMPT[1:], BS)) == {}


def test_workers_dropping_out_at_different_depths_and_one_joining_late():
    index = PrefixIndex()
    for worker_id, n in (("w1", 1), ("w2", 3), ("w3", 5), ("w4", 4)):
        index.apply(worker_id, [stored(1, H[:n])])
    index.apply("w5", [stored(1, H[2:], parent=H[1])])  # holds blocks 3..5 without their parents
    assert index.overlap(H) == {"w1": 1, "w2": 3, "w3": 5, "w4": 4}
    assert index.overlap(H[:2]) == {"w1": 1, "w2": 2, "w3": 2, "w4": 2}


def test_a_hole_in_the_chain_ends_the_match():
    index = PrefixIndex()
    index.apply("w1", [stored(1, H), removed(2, [H[1]])])
    assert index.overlap(H) == {"w1": 1}  # blocks 3..5 are still held, but no longer a prefix


def test_gap_marks_stale_until_resync_and_duplicates_are_skipped():
    index = loaded()
    assert index.apply("w1", [stored(1, H[:2]), stored(2, H[2:3], parent=H[1])])  # seq 1 again: replay overlap
    assert index.last_seq("w1") == 2 and index.overlap(H)["w1"] == 3
    assert not index.apply("w1", [removed(4, H[:1])])  # seq 3 never came
    assert index.stale == {"w1"}
    assert not index.apply("w1", [removed(3, H[:1])])  # ignored while stale
    assert index.overlap(H)["w1"] == 3  # old knowledge still counts until the snapshot
    log = KvEventLog()
    for _ in range(6):
        log.stored(NONE_HASH, H[:1])
    index.resync("w1", log.snapshot())
    assert index.stale == set() and index.last_seq("w1") == 6 and index.overlap(H)["w1"] == 1
    assert index.apply("w1", [stored(7, H[1:2], parent=H[0])])
    assert index.overlap(H)["w1"] == 2


def test_index_follows_a_real_event_log_through_replay():
    log, index = KvEventLog(max_events=2), PrefixIndex()
    log.record(stored=[(NONE_HASH, H[0]), (H[0], H[1])], removed=[])
    index.apply("w1", log.since(index.last_seq("w1")))
    log.record(stored=[(H[1], H[2])], removed=[])
    log.record(stored=[], removed=[H[2]])
    log.record(stored=[(H[1], H[2]), (H[2], H[3])], removed=[])
    assert log.since(index.last_seq("w1")) is None  # the ring lost seq 2: the router takes a snapshot
    index.resync("w1", log.snapshot())
    assert index.overlap(H) == {"w1": 4} and index.last_seq("w1") == 4


def test_cleared_and_remove_worker_forget_everything_of_one_worker():
    index = loaded()
    assert index.apply("w2", [KvEvent(3, KvEventKind.CLEARED)])
    assert index.overlap(H) == {"w1": 2} and index.last_seq("w2") == 3
    assert index.remove_worker("w1") and not index.remove_worker("w1")
    assert index.overlap(H) == {} and len(index) == 5  # w3's blocks remain
    assert index.retain_workers(["w1", "w2"]) == ["w3"]  # the registry's sweep: w3 expired
    assert len(index) == 0 and index.worker_ids() == ["w2"]


def test_tiers_are_tracked_per_worker_and_removed_per_tier():
    index = PrefixIndex()
    index.apply("w1", [stored(1, H[:2]), stored(2, H[:2], tier=KvTier.HOST), removed(3, H[1:2])])
    assert index.match(H) == {"w1": CachedPrefix(2, num_host=1)}  # block 2 survives offloaded
    index.apply("w2", [stored(1, H[:3])])
    assert index.match(H) == {"w1": CachedPrefix(2, num_host=1), "w2": CachedPrefix(3)}
    index.apply("w1", [removed(4, H[1:2], tier=KvTier.HOST)])
    assert index.match(H) == {"w1": CachedPrefix(1), "w2": CachedPrefix(3)}
    assert index.match(H)["w2"].num_device == 3


def test_memory_bound_evicts_least_recently_touched_leaves_first():
    index = PrefixIndex(max_entries=4)
    other = chain_block_hashes(list(range(500, 508)), BS)
    index.apply("w1", [stored(1, H[:3])])
    index.apply("w2", [stored(1, other)])  # 5 entries: the oldest leaf, H[2], goes
    assert len(index) == 4 and index.overlap(H) == {"w1": 2}
    index.overlap(H)  # touch w1's prefix
    index.apply("w2", [stored(2, chain_block_hashes(list(range(900, 904)), BS))])  # other's leaf goes
    assert index.overlap(H) == {"w1": 2} and index.overlap(other) == {"w2": 1}


def test_bad_bound_raises():
    with pytest.raises(ValueError, match="max_entries must be >= 1"):
        PrefixIndex(max_entries=0)
