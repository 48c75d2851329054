"""The recent routes' compiled table answers exactly as their dicts (the per-view path's `overlap`) through records,
records made later, the newest-half cut, expiry, removed workers, the clock stepping back, and table rebuilds."""

import random

import numpy as np
import pytest

from engines.base.block_hash import chain_block_hashes
from services.router.kv_policy import ApproximateIndex
from services.router.recent_routes import RecentRoutes
from services.router.recent_table import RecentTable
from tests.unit.services.router.helpers import FakeClock
from tests.unit.services.router.test_array_policy import BS, chains

WORKERS = [f"w{i}" for i in range(7)]


def compiled_overlap(recent: RecentRoutes, hashes, worker_ids=WORKERS) -> dict[str, int]:
    recent.flush()
    out = np.full(len(worker_ids), -1, np.int64)
    recent.overlap_rows(np.fromiter(hashes, np.uint64, len(hashes)), recent.slots_for(worker_ids), out)
    return {w: int(out[r]) for r, w in enumerate(worker_ids) if out[r]}


@pytest.mark.parametrize("seed,max_entries", [(1, 100_000), (2, 40), (3, 12)])  # small: the newest-half cut
def test_the_compiled_overlap_is_the_dicts_over_a_random_history(seed, max_entries):
    rng, clock = random.Random(seed), FakeClock()
    prompts = chains(rng, num_roots=4)
    recent = RecentRoutes(clock, ttl_s=5.0, max_entries=max_entries)
    recent._table = RecentTable(min_rows=2)  # the smallest table: it is rebuilt many times
    for step in range(600):
        hashes = chain_block_hashes(rng.choice(prompts), BS)
        worker_id, roll = rng.choice(WORKERS), rng.random()
        if roll < 0.5:
            recent.record_later(hashes, worker_id)
        elif roll < 0.8:
            recent.record(hashes, worker_id)
        elif roll < 0.85:
            recent.expire()
        elif roll < 0.88:
            recent.remove_worker(worker_id)
        clock.advance(rng.random() if rng.random() < 0.95 else -2.0)  # now and then back: lapsed stays lapsed
        probe = chain_block_hashes(rng.choice(prompts), BS)
        assert compiled_overlap(recent, probe) == recent.overlap(probe), step
        assert compiled_overlap(recent, ()) == {}
    assert recent._table.rebuilds >= 3


def test_the_compiled_overlap_is_the_approximate_index():
    rng, clock = random.Random(9), FakeClock()
    prompts = chains(rng)
    old, new = ApproximateIndex(clock, ttl_s=10.0), RecentRoutes(clock, ttl_s=10.0)
    for _ in range(300):
        hashes = chain_block_hashes(rng.choice(prompts), BS)
        worker_id = rng.choice(WORKERS)
        old.record(hashes, worker_id)
        new.record_later(hashes, worker_id)
        clock.advance(rng.random())
        probe = chain_block_hashes(rng.choice(prompts), BS)
        assert compiled_overlap(new, probe) == old.overlap(probe)


def test_a_removed_worker_loses_its_slot_and_a_returning_one_starts_empty():
    clock = FakeClock()
    recent = RecentRoutes(clock, ttl_s=10.0)
    first, second = list(range(100, 106)), list(range(200, 203))
    recent.record(first, "a")
    epoch = recent.slot_epoch
    recent.remove_worker("a")
    assert recent.slot_epoch > epoch and recent.slots_for(["a"])[0] == -1
    recent.record(second, "a")
    assert compiled_overlap(recent, first, ["a"]) == {} and compiled_overlap(recent, second, ["a"]) == {"a": 3}
    clock.advance(11.0)
    recent.expire()
    assert recent.slots_for(["a"])[0] == -1 and compiled_overlap(recent, second, ["a"]) == {}


def test_rows_of_workers_the_table_does_not_know_are_zero():
    recent = RecentRoutes(FakeClock(), ttl_s=10.0)
    recent.record([1, 2, 3], "a")
    assert compiled_overlap(recent, [1, 2, 3], ["x", "a", "y"]) == {"a": 3}
    assert compiled_overlap(recent, [1, 2, 4], ["a"]) == {"a": 2} == recent.overlap([1, 2, 4])
