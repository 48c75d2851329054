"""The KV event log: per-worker numbering, bounded replay, snapshots of the live blocks."""

import pytest

from engines.base.block_hash import NONE_HASH
from engines.base.events import KvEvent, KvEventKind, KvEventLog, KvTier

STORED, REMOVED, CLEARED = KvEventKind.STORED, KvEventKind.REMOVED, KvEventKind.CLEARED


def test_events_are_numbered_from_one_per_log():
    log = KvEventLog()
    assert log.stored(NONE_HASH, [11, 12]) == KvEvent(1, STORED, NONE_HASH, (11, 12), KvTier.DEVICE)
    assert log.removed([12], KvTier.DEVICE) == KvEvent(2, REMOVED, NONE_HASH, (12,), KvTier.DEVICE)
    assert log.cleared().seq == 3 and log.last_seq == 3
    assert KvEventLog().stored(NONE_HASH, [11]).seq == 1  # another worker counts on its own


def test_record_groups_chained_pairs_and_puts_removals_first():
    log = KvEventLog()
    events = log.record(stored=[(NONE_HASH, 1), (1, 2), (2, 3), (7, 8)], removed=[5, 6], tier=KvTier.HOST)
    assert events == [
        KvEvent(1, REMOVED, NONE_HASH, (5, 6), KvTier.HOST),
        KvEvent(2, STORED, NONE_HASH, (1, 2, 3), KvTier.HOST),
        KvEvent(3, STORED, 7, (8,), KvTier.HOST),
    ]
    assert log.record(stored=[], removed=[]) == []  # nothing changed: no seq spent
    assert log.last_seq == 3


def test_since_replays_after_seq_and_refuses_what_the_ring_lost():
    log = KvEventLog(max_events=3)
    for h in range(1, 6):
        log.stored(NONE_HASH, [h])
    assert [e.seq for e in log.since(2)] == [3, 4, 5]
    assert log.since(5) == []
    assert log.since(1) is None  # seq 2 fell out of the ring: snapshot instead
    assert log.since(6) is None  # the reader is ahead: the worker restarted


def test_fresh_log_replays_nothing_from_zero():
    assert KvEventLog().since(0) == []


def test_snapshot_holds_only_live_blocks_chained_per_tier():
    log = KvEventLog()
    log.stored(NONE_HASH, [1, 2, 3])
    log.stored(3, [4])
    log.stored(NONE_HASH, [9], KvTier.DISK)
    log.removed([2])
    log.stored(1, [2])  # re-stored after eviction: its chain link survives
    snap = log.snapshot()
    assert snap.seq == 5
    assert snap.events == (
        KvEvent(5, STORED, NONE_HASH, (1,), KvTier.DEVICE),
        KvEvent(5, STORED, 2, (3, 4), KvTier.DEVICE),
        KvEvent(5, STORED, 1, (2,), KvTier.DEVICE),
        KvEvent(5, STORED, NONE_HASH, (9,), KvTier.DISK),
    )
    assert log.num_blocks == 5


def test_removal_is_per_tier_and_cleared_empties_the_snapshot():
    log = KvEventLog()
    log.stored(NONE_HASH, [1], KvTier.DEVICE)
    log.stored(NONE_HASH, [1], KvTier.HOST)  # offloaded copy
    log.removed([1], KvTier.DEVICE)
    assert log.snapshot().events == (KvEvent(3, STORED, NONE_HASH, (1,), KvTier.HOST),)
    log.cleared()
    assert log.snapshot().events == () and log.num_blocks == 0


def test_bad_ring_size_raises():
    with pytest.raises(ValueError, match="max_events must be >= 1"):
        KvEventLog(max_events=0)
