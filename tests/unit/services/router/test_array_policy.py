"""The array-scored kv path decides exactly as today's per-view one: the slot index's depths against the prefix
index's match, recent routes against the approximate index, and whole routers fed the same random history."""

import os
import random
import subprocess
import sys

import numpy as np
import pytest

from engines.base.block_hash import NONE_HASH, chain_block_hashes
from engines.base.events import KvEvent, KvEventKind, KvTier
from services.router.array_policy import ArrayKvPolicy
from services.router.core import BusyThresholds, RouterCore
from services.router.kv_policy import ApproximateIndex, KvAwarePolicy, KvPolicyConfig
from services.router.policy import DisaggregationPolicy
from services.router.prefix_index import PrefixIndex
from services.router.recent_routes import RecentRoutes
from services.router.registry import Registry
from services.router.slot_index import SlotIndex
from services.router.types import InvalidArgumentError, RouteInput, WorkerLoad, WorkersBusyError
from tests.unit.services.router.helpers import FakeClock, info

BS = 4


def chains(rng: random.Random, num_roots: int = 3, length: int = 12) -> list[list[int]]:
    """Prompts sharing a few roots, so workers hold overlapping prefixes of different lengths."""
    roots = [[rng.randrange(50) for _ in range(BS * length)] for _ in range(num_roots)]
    return [
        r[: BS * rng.randrange(1, length + 1)] + [rng.randrange(50) for _ in range(BS * rng.randrange(3))]
        for r in roots
        for _ in range(4)
    ]


def feed(indexes, rng: random.Random, worker_ids: list[str], prompts: list[list[int]], steps: int) -> None:
    """The same random STORED / REMOVED / CLEARED history applied to every index."""
    seq = dict.fromkeys(worker_ids, 0)
    for _ in range(steps):
        worker_id = rng.choice(worker_ids)
        hashes = tuple(chain_block_hashes(rng.choice(prompts), BS))
        roll = rng.random()
        if roll < 0.75:
            event = KvEvent(seq[worker_id] + 1, KvEventKind.STORED, NONE_HASH, hashes[: rng.randrange(len(hashes) + 1)])
        elif roll < 0.95:
            event = KvEvent(
                seq[worker_id] + 1, KvEventKind.REMOVED, NONE_HASH, hashes[rng.randrange(len(hashes) + 1) :]
            )
        else:
            event = KvEvent(seq[worker_id] + 1, KvEventKind.CLEARED)
        seq[worker_id] += 1
        for index in indexes:
            index.apply(worker_id, [event])


@pytest.mark.parametrize("num_workers", [3, 70])  # 70: past the first mask width, so the masks widen
def test_slot_depths_equal_the_prefix_index_match(num_workers):
    rng = random.Random(num_workers)
    worker_ids = [f"w{i:02d}" for i in range(num_workers)]
    prompts = chains(rng)
    plain, slots = PrefixIndex(max_entries=60), SlotIndex(max_entries=60)  # small: eviction happens too
    for round_ in range(20):
        feed([plain, slots], rng, worker_ids, prompts, 40)
        if round_ % 5 == 4:
            gone = rng.choice(worker_ids)
            assert plain.remove_worker(gone) == slots.remove_worker(gone)
        for prompt in prompts:
            hashes = chain_block_hashes(prompt, BS)
            depths = slots.depths(hashes)
            got = {w: int(d) for w, d in zip(worker_ids, depths[slots.slots_for(worker_ids)]) if d}
            assert got == plain.overlap(hashes)
    assert len(plain) == len(slots) and slots.masked_hashes() == set(plain._holders)


def test_slot_depths_decline_an_offloaded_prefix_and_free_slots():
    index = SlotIndex()
    hashes = tuple(chain_block_hashes(list(range(12)), BS))
    index.apply("a", [KvEvent(1, KvEventKind.STORED, NONE_HASH, hashes)])
    index.apply("b", [KvEvent(1, KvEventKind.STORED, NONE_HASH, hashes[:1], KvTier.HOST)])
    assert index.depths(hashes) is None  # tiers must be counted: the per-view path does it
    assert list(index.depths((12345,) + hashes)) == [0] * (index.capacity + 1)  # an unknown first block
    epoch = index.epoch
    index.remove_worker("b")
    assert index.epoch > epoch and list(index.slots_for(["a", "b"])) == [0, index.capacity]
    assert index.depths(hashes)[0] == 3


@pytest.mark.parametrize("max_pending", [1, 4096])  # 1: every decision replays the touches before it
def test_deferred_touches_evict_exactly_as_immediate_ones(monkeypatch, max_pending):
    monkeypatch.setattr("services.router.slot_index._MAX_PENDING_TOUCHES", max_pending)
    rng = random.Random(11)
    prompts = [chain_block_hashes([rng.randrange(50) for _ in range(BS * 6)], BS) for _ in range(12)]
    plain, slots = PrefixIndex(max_entries=20), SlotIndex(max_entries=20)
    seq = 0
    for _ in range(60):
        for _ in range(rng.randrange(4)):  # decisions touch what they matched, in their order
            hashes = rng.choice(prompts)
            plain.match(hashes)
            slots.depths(hashes)
        assert len(slots._touches) <= max_pending
        seq, stored = seq + 1, rng.choice(prompts)[: rng.randrange(1, 7)]
        for index in (plain, slots):  # STORED evicts the least recently touched
            index.apply("a", [KvEvent(seq, KvEventKind.STORED, NONE_HASH, tuple(stored))])
        assert list(slots._holders) == list(plain._holders)  # the same LRU order, so the same evictions
    assert len(plain) == 20


def test_recent_routes_answer_as_the_approximate_index():
    rng, clock = random.Random(3), FakeClock()
    prompts = chains(rng)
    old, new = ApproximateIndex(clock, ttl_s=10.0), RecentRoutes(clock, ttl_s=10.0)
    for _ in range(300):
        hashes = chain_block_hashes(rng.choice(prompts), BS)
        worker_id = rng.choice("abcd")
        old.record(hashes, worker_id)
        new.record(hashes, worker_id)
        clock.advance(rng.random())
        probe = chain_block_hashes(rng.choice(prompts), BS)
        assert new.overlap(probe) == old.overlap(probe)
    new.remove_worker("a")
    assert "a" not in new.overlap(chain_block_hashes(prompts[0], BS))


@pytest.mark.parametrize("max_pending", [1, 4096])
def test_recent_routes_recorded_later_answer_as_recorded_at_once(monkeypatch, max_pending):
    monkeypatch.setattr("services.router.recent_routes._MAX_PENDING", max_pending)
    rng, clock = random.Random(5), FakeClock()
    prompts = chains(rng)
    now, later = RecentRoutes(clock, ttl_s=3.0, max_entries=20), RecentRoutes(clock, ttl_s=3.0, max_entries=20)
    rows = {w: i for i, w in enumerate("abcd")}
    for step in range(300):
        hashes = chain_block_hashes(rng.choice(prompts), BS)
        worker_id = rng.choice("abcd")
        now.record(hashes, worker_id)
        later.record_later(hashes, worker_id)  # the expiry of now, though made when next read
        assert len(later._pending) <= max_pending
        clock.advance(rng.random())
        if step % 3 == 0:  # several routes pending at once
            continue
        probe = chain_block_hashes(rng.choice(prompts), BS)
        out = np.full(5, -1, np.int64)
        later.overlap_into(probe, rows, out)
        expected = now.overlap(probe)
        assert {w: int(out[r]) for w, r in rows.items() if out[r]} == expected and out[4] == 0
        assert later.overlap(probe) == expected
        assert_first_index_is_exact(later)
    assert len(now) == len(later)
    later.remove_worker("a")
    clock.advance(2.0)
    later.expire()
    assert_first_index_is_exact(later)
    clock.advance(2.0)
    later.expire()
    assert later._by_first == {} and later._firsts == {}


def assert_first_index_is_exact(recent: RecentRoutes) -> None:
    """Every worker listed under a first hash holds it, and the two maps mirror each other (so neither grows past
    what the workers hold)."""
    listed = {(h, w) for h, workers in recent._by_first.items() for w in workers}
    assert listed == {(h, w) for w, firsts in recent._firsts.items() for h in firsts}
    assert all(h in recent._until[w] for h, w in listed) and all(recent._by_first.values())


def test_recent_routes_keep_the_newest_half_with_their_ancestors():
    clock = FakeClock()
    recent = RecentRoutes(clock, ttl_s=10.0, max_entries=8)
    first, second = list(range(100, 106)), list(range(200, 206))
    recent.record(first, "a")
    clock.advance(1.0)
    recent.record(second, "a")  # 12 > 8: the older prompt goes whole, the newer stays whole
    assert recent.overlap(second) == {"a": 6} and recent.overlap(first) == {} and len(recent) == 6
    clock.advance(10.0)
    recent.expire()
    assert len(recent) == 0


def make_core(policy, clock: FakeClock, worker_ids: list[str], busy: BusyThresholds = BusyThresholds()) -> RouterCore:
    registry = Registry(clock, lease_ttl_s=1e6)
    for worker_id in worker_ids:
        registry.register(info(worker_id, max_num_seqs=8), WorkerLoad())
    return RouterCore(registry, policy, DisaggregationPolicy(1_000_000, 4), busy)


def decide(core: RouterCore, request: RouteInput) -> tuple:
    try:
        decision = core.route(request)
    except WorkersBusyError:
        return ("busy",)
    return decision.decode.worker_id, decision.num_cached_tokens


# the router's defaults shed load past 2 sequences per slot: 0.5 here makes every worker busy now and then
@pytest.mark.parametrize(
    "gateway_hashes,busy",
    [(False, BusyThresholds()), (True, BusyThresholds()), (True, BusyThresholds(load=0.5, kv=0.9))],
)
def test_whole_routers_decide_alike_over_a_random_history(gateway_hashes, busy):
    rng, clock = random.Random(10), FakeClock()  # a history in which every worker is busy now and then
    worker_ids = [f"w{i}" for i in range(6)]
    prompts = chains(rng)
    config = KvPolicyConfig(block_size=BS, inflight_weight=0.5)
    today = make_core(KvAwarePolicy(PrefixIndex(), clock, config=config), clock, worker_ids, busy)
    arrays = make_core(ArrayKvPolicy(SlotIndex(), clock, config=config), clock, worker_ids, busy)
    taken, outcomes = [], []
    arrays.policy.choose = lambda *a: taken.append(a) or ArrayKvPolicy.choose(arrays.policy, *a)
    live = []
    for i in range(300):
        feed([today.policy.index, arrays.policy.index], rng, worker_ids, prompts, 1)
        tokens = tuple(rng.choice(prompts))
        hashes = tuple(chain_block_hashes(tokens, BS)) if gateway_hashes else ()
        request = RouteInput(f"r{i}", "m", tokens, block_hashes=hashes, hash_block_size=BS if hashes else 0)
        a, b = decide(today, request), decide(arrays, request)
        assert a == b, i
        outcomes.append(a[0])
        if a != ("busy",):
            live.append(request.req_id)
        if live and rng.random() < 0.4:
            done = live.pop(rng.randrange(len(live)))
            today.registry.complete(done), arrays.registry.complete(done)
        if rng.random() < 0.1:  # a heartbeat: the worker's own queue replaces the router's guess
            worker_id = rng.choice(worker_ids)
            load = WorkerLoad(num_waiting=rng.randrange(3), num_blocks_used=rng.randrange(100), num_blocks_total=100)
            today.registry.heartbeat(worker_id, load), arrays.registry.heartbeat(worker_id, load)
        clock.advance(rng.random() * 0.5)
    assert not taken  # every decision was array-scored (an all-busy pool is refused by the per-view path)
    arrays.flush_deferred()  # what the decisions deferred leaves the LRU order exactly as today's immediate touches
    assert list(arrays.policy.index._holders) == list(today.policy.index._holders)
    if busy.load:
        assert 0 < outcomes.count("busy") < 300


def test_exclusions_take_the_per_view_path_with_the_same_state():
    clock = FakeClock()
    core = make_core(ArrayKvPolicy(SlotIndex(), clock, config=KvPolicyConfig(block_size=BS)), clock, ["w1", "w2"])
    tokens = tuple(range(16))
    first = core.route(RouteInput("r1", "m", tokens))
    again = core.route(RouteInput("r2", "m", tokens, exclude_worker_ids=frozenset({first.decode.worker_id})))
    assert again.decode.worker_id != first.decode.worker_id and again.num_cached_tokens == 0
    third = core.route(RouteInput("r3", "m", tokens))  # the recent routes of both paths count
    assert third.num_cached_tokens == 16


_ROUTES_IN_A_FRESH_PROCESS = """
from engines.base.block_hash import chain_block_hashes
from services.router import recent_table
from services.router.array_scoring import decide_row
from services.router.policy import make_policy
from services.router.core import RouterCore
from services.router.policy import DisaggregationPolicy
from services.router.registry import Registry
from services.router.types import RouteInput, WorkerInfo, WorkerLoad, WorkerRole
from engines.base.types import KvLayout

registry = Registry(lambda: 0.0)
for w in ("w1", "w2"):
    registry.register(WorkerInfo(w, WorkerRole.DECODE, w + ":1", "m", KvLayout(1, 1, 8, "float32", 4), 8), WorkerLoad())
core = RouterCore(registry, make_policy("kv"), DisaggregationPolicy())
kernels = (decide_row, recent_table.overlap_rows, recent_table.put, recent_table.drop)
compiled = sum(len(k.signatures) for k in kernels)
tokens = tuple(range(16))
hashes = chain_block_hashes(tokens, 4)
for i, block_hashes in enumerate(((), tuple(hashes))):
    core.route(RouteInput(f"r{i}", "m", tokens, block_hashes=block_hashes, hash_block_size=4))
    core.flush_deferred()  # the recent routes' record, after the reply
print(compiled, sum(len(k.signatures) for k in kernels))
"""


def test_no_decision_compiles_a_kernel():
    """The kernels compiled when the policy is made cover every argument type a decision passes (hashes made here,
    a gateway's); a missing one would compile inside a live Route (seconds). In a fresh process, so no other test's
    calls have compiled it already."""
    out = subprocess.run(
        [sys.executable, "-c", _ROUTES_IN_A_FRESH_PROCESS],
        check=True,
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
    ).stdout.split()
    assert int(out[0]) >= 4 and out[0] == out[1]


def test_hashes_that_do_not_fit_the_prompt_are_refused():
    with pytest.raises(InvalidArgumentError, match="3 block hashes do not fit 8 tokens in blocks of 4"):
        RouteInput("r", "m", tuple(range(8)), block_hashes=(1, 2, 3), hash_block_size=4).validate()
    with pytest.raises(InvalidArgumentError):
        RouteInput("r", "m", tuple(range(8)), block_hashes=(1, 2), hash_block_size=0).validate()


def test_a_route_request_decides_alike_with_its_ids_left_in_the_message():
    from services.common.protos import router_pb2
    from services.router.convert import route_input_from_pb

    tokens = list(range(40))
    msg = router_pb2.RouteRequest(req_id="r", model="m", token_ids=tokens)
    request = route_input_from_pb(router_pb2.RouteRequest.FromString(msg.SerializeToString()))
    assert not isinstance(request.token_ids, tuple) and len(request.token_ids) == 40
    assert chain_block_hashes(request.token_ids, BS) == chain_block_hashes(tokens, BS)
    clock = FakeClock()
    cores = [
        make_core(ArrayKvPolicy(SlotIndex(), clock, config=KvPolicyConfig(block_size=BS)), clock, ["w1", "w2"])
        for _ in range(2)
    ]
    for core in cores:
        core.policy.index.apply(
            "w2", [KvEvent(1, KvEventKind.STORED, NONE_HASH, tuple(chain_block_hashes(tokens[:12], BS)))]
        )
    a, b = cores[0].route(request), cores[1].route(RouteInput("r", "m", tuple(tokens)))
    assert (a.decode.worker_id, a.num_cached_tokens) == (b.decode.worker_id, b.num_cached_tokens) == ("w2", 12)


def test_an_empty_decode_pool_is_refused_alike_on_both_paths():
    """A router that has just restarted has no workers yet: both paths refuse the same way (never an IndexError,
    which gRPC turned into UNKNOWN and the gateway into 500)."""
    clock = FakeClock()
    config = KvPolicyConfig(block_size=BS)
    refusals = []
    for policy in (
        KvAwarePolicy(PrefixIndex(), clock, config=config),
        ArrayKvPolicy(SlotIndex(), clock, config=config),
    ):
        with pytest.raises(Exception) as raised:
            make_core(policy, clock, []).route(RouteInput("r0", "m", tuple(range(2 * BS))))
        refusals.append(type(raised.value))
    assert refusals[0] is refusals[1] and refusals[0] is not IndexError
