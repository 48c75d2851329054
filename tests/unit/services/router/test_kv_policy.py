"""KV-aware routing with exact expected choices: the Dynamo docs example, the overlap/load trade-off,
deterministic ties, softmax draws, the router's own predictions, sibling bursts and expired workers."""

import itertools

import pytest

from engines.base.block_hash import NONE_HASH, chain_block_hashes
from engines.base.events import KvEvent, KvEventKind, KvTier
from services.router.core import RouterCore
from services.router.kv_policy import ApproximateIndex, KvAwarePolicy, KvPolicyConfig, tier_credit
from services.router.policy import DisaggregationPolicy
from services.router.prefix_index import PrefixIndex
from services.router.registry import Registry
from services.router.types import RouteInput, WorkerLoad, WorkerView
from tests.unit.services.router.helpers import FakeClock, info, view

BS = 4
PROMPT = tuple(range(1000, 1040))  # 10 full blocks of 4
H = chain_block_hashes(PROMPT, BS)


class FixedRng:
    def __init__(self, *draws: float):
        self.draws = list(draws)

    def random(self) -> float:
        return self.draws.pop(0)


def index_with(**cached_blocks: int) -> PrefixIndex:
    index = PrefixIndex()
    for worker_id, n in cached_blocks.items():
        index.apply(worker_id, [KvEvent(1, KvEventKind.STORED, NONE_HASH, tuple(H[:n]), KvTier.DEVICE)])
    return index


def kv_policy(index: PrefixIndex, clock=None, rng=None, **config) -> KvAwarePolicy:
    """Dynamo's cost (an in-flight block weighs as much as one to prefill) unless `config` says otherwise."""
    config.setdefault("inflight_weight", 1.0)
    return KvAwarePolicy(index, clock or FakeClock(), rng, KvPolicyConfig(block_size=BS, **config))


def req(tokens=PROMPT, req_id: str = "r") -> RouteInput:
    return RouteInput(req_id, "m", tuple(tokens))


def busy(worker_id: str, inflight_blocks: int = 0, queued_blocks: int = 0, **kw):
    """A worker holding `inflight_blocks` of routed prompts, `queued_blocks` of them not yet prefilled."""
    return view(worker_id, inflight_tokens=inflight_blocks * BS, queued_tokens=queued_blocks * BS, **kw)


def docs_example() -> tuple[KvAwarePolicy, list]:
    policy = kv_policy(index_with(w1=2, w2=5, w3=8))
    return policy, [busy("w1", 10), busy("w2", 5), busy("w3", 9)]


def test_dynamo_docs_example_costs_and_choice():
    policy, candidates = docs_example()
    scores = policy.scores(req(), candidates)
    assert [(s.view.worker_id, s.cost, s.num_overlap_blocks) for s in scores] == [
        ("w2", 10.0, 5),
        ("w3", 11.0, 8),
        ("w1", 18.0, 2),
    ]
    assert policy.choose(req(), candidates).worker_id == "w2"


@pytest.mark.parametrize("overlap_weight, chosen", [(1.0, "w1"), (0.5, "w2"), (0.0, "w2")])
def test_overlap_beats_load_up_to_the_configured_trade_off(overlap_weight, chosen):
    # w1: 6 of 10 blocks cached, 4 decode blocks; w2: nothing cached, idle
    policy = kv_policy(index_with(w1=6), overlap_weight=overlap_weight)
    candidates = [busy("w1", 4), view("w2")]
    costs = {s.view.worker_id: s.cost for s in policy.scores(req(), candidates)}
    assert costs == {"w1": 10 - 6 * overlap_weight + 4, "w2": 10.0}  # 8 / 11 / 14 against 10
    assert policy.choose(req(), candidates).worker_id == chosen


@pytest.mark.parametrize("inflight_weight, chosen", [(1.0, "w2"), (0.25, "w1"), (0.0, "w1")])
def test_inflight_blocks_weigh_as_configured_against_blocks_to_prefill(inflight_weight, chosen):
    # w1: 6 of 10 blocks cached, 12 blocks held by requests decoding there; w2: nothing cached, 2 held
    policy = kv_policy(index_with(w1=6), inflight_weight=inflight_weight)
    candidates = [busy("w1", 12), busy("w2", 2)]
    costs = {s.view.worker_id: s.cost for s in policy.scores(req(), candidates)}
    # w1 16 / 7 / 4 against w2 12 / 10.5 / 10
    assert costs == {"w1": 4 + 12 * inflight_weight, "w2": 10 + 2 * inflight_weight}
    assert policy.choose(req(), candidates).worker_id == chosen


def test_by_default_an_inflight_block_weighs_a_tenth_of_one_to_prefill():
    policy = KvAwarePolicy(index_with(w1=6), FakeClock(), config=KvPolicyConfig(block_size=BS))
    costs = {s.view.worker_id: s.cost for s in policy.scores(req(), [busy("w1", 12), busy("w2", 2)])}
    assert costs == pytest.approx({"w1": 4 + 1.2, "w2": 10 + 0.2})


def test_without_inflight_weight_queued_prefill_still_spreads_a_burst():
    # inflight_weight 0 drops what requests hold while decoding, not the prefill still queued at a worker
    policy = kv_policy(PrefixIndex(), inflight_weight=0.0)
    candidates = [busy("w1", inflight_blocks=40, queued_blocks=0), busy("w2", inflight_blocks=10, queued_blocks=10)]
    costs = {s.view.worker_id: s.cost for s in policy.scores(req(), candidates)}
    assert costs == {"w1": 10.0, "w2": 20.0}
    assert policy.choose(req(), candidates).worker_id == "w1"


@pytest.mark.parametrize("order", list(itertools.permutations(range(4))))
def test_equal_costs_break_on_fewest_inflight_tokens_then_worker_id(order):
    # all cost 10: wa (2 cached + 2 in-flight blocks); wd, wc, wb (nothing cached, idle; heartbeats stale)
    policy = kv_policy(index_with(wa=2))
    candidates = [busy("wa", 2), view("wd", blocks=9), view("wc", blocks=1), view("wb", blocks=5)]
    assert policy.choose(req(), [candidates[i] for i in order]).worker_id == "wb"


def test_queued_prefill_is_charged_and_stale_heartbeat_load_is_not():
    # w1: 3 cached, 6 blocks queued of 8 in flight; w2: a heartbeat says 50 blocks used and 3 waiting, but
    # the router has nothing in flight there (those requests completed since)
    policy = kv_policy(index_with(w1=3))
    candidates = [busy("w1", inflight_blocks=8, queued_blocks=6), view("w2", blocks=50, waiting=3)]
    costs = {s.view.worker_id: s.cost for s in policy.scores(req(), candidates)}
    assert costs == {"w1": 6 + 7 + 8.0, "w2": 10.0}
    assert policy.choose(req(), candidates).worker_id == "w2"


def test_host_and_disk_blocks_save_less_than_device_blocks():
    index = PrefixIndex()
    index.apply("w1", [KvEvent(1, KvEventKind.STORED, NONE_HASH, tuple(H[:4]), KvTier.HOST)])
    index.apply("w2", [KvEvent(1, KvEventKind.STORED, NONE_HASH, tuple(H[:4]), KvTier.DISK)])
    costs = {s.view.worker_id: s.cost for s in kv_policy(index).scores(req(), [view("w1"), view("w2")])}
    assert costs == {"w1": 10 - 4 * 0.75, "w2": 10 - 4 * 0.25}


def tiered(worker_id: str, prefill: float, host: float = 0.0, disk: float = 0.0, per_token: float = 1000.0):
    load = WorkerLoad(
        prefill_tokens_per_s=prefill, kv_bytes_per_token=per_token, kv_host_bytes_per_s=host, kv_disk_bytes_per_s=disk
    )
    return WorkerView(info(worker_id), load)


def test_a_lower_tier_block_is_credited_by_what_it_saves_against_recompute():
    index = PrefixIndex()
    index.apply("w1", [KvEvent(1, KvEventKind.STORED, NONE_HASH, tuple(H[:4]), KvTier.HOST)])
    index.apply("w2", [KvEvent(1, KvEventKind.STORED, NONE_HASH, tuple(H[:4]), KvTier.DISK)])
    # 1 kB a token; 10k tokens/s: a token recomputes in 100 us. Host at 50 MB/s loads it in 20 us (saves 0.8);
    # disk at 5 MB/s in 200 us: slower than recomputing, saves nothing
    workers = [tiered("w1", 10_000, host=50e6), tiered("w2", 10_000, host=50e6, disk=5e6)]
    costs = {s.view.worker_id: s.cost for s in kv_policy(index).scores(req(), workers)}
    assert costs == pytest.approx({"w1": 10 - 4 * 0.8, "w2": 10.0})
    fixed = kv_policy(index, host_weight=0.5, disk_weight=0.1)  # the settings override
    costs = {s.view.worker_id: s.cost for s in fixed.scores(req(), workers)}
    assert costs == pytest.approx({"w1": 10 - 4 * 0.5, "w2": 10 - 4 * 0.1})


def test_tier_credit_falls_back_to_the_default_until_a_worker_reports():
    load = WorkerLoad(prefill_tokens_per_s=10_000, kv_bytes_per_token=1000)
    assert tier_credit(load, KvTier.HOST, 0.75) == 0.75  # no bandwidth measured yet
    assert tier_credit(WorkerLoad(kv_host_bytes_per_s=1e9), KvTier.HOST, 0.75) == 0.75
    assert tier_credit(
        WorkerLoad(prefill_tokens_per_s=1e4, kv_bytes_per_token=1e3, kv_disk_bytes_per_s=4e7), KvTier.DISK, 0.25
    ) == pytest.approx(0.75)


@pytest.mark.parametrize("draw, chosen", [(0.0, "w2"), (0.5, "w3"), (0.99, "w1")])
def test_temperature_draws_from_softmax_over_normalised_costs(draw, chosen):
    # costs 10, 11, 18 -> normalised 0, 1/8, 1 -> weights 1, e^-0.125 (0.882), e^-1 (0.368), sum 2.250
    policy = kv_policy(index_with(w1=2, w2=5, w3=8), rng=FixedRng(draw), temperature=1.0)
    candidates = [busy("w1", 10), busy("w2", 5), busy("w3", 9)]
    assert policy.choose(req(), candidates).worker_id == chosen


def test_own_decisions_predict_overlap_until_their_ttl():
    clock = FakeClock()
    policy = kv_policy(PrefixIndex(), clock, use_events=False, predict_ttl_s=30.0)
    assert policy.choose(req(), [busy("w1", 3), busy("w2", 5)]).worker_id == "w1"
    later = [busy("w1", 8), busy("w2", 5)]  # w1 now busier, but holds the prompt
    assert [(s.view.worker_id, s.num_overlap_blocks) for s in policy.scores(req(), later)] == [("w1", 10), ("w2", 0)]
    clock.advance(30.0)
    assert policy.choose(req(), later).worker_id == "w2"  # the prediction lapsed


def test_approximate_mode_ignores_events():
    policy = kv_policy(index_with(w2=10), use_events=False)
    assert policy.choose(req(), [view("w1"), view("w2")]).worker_id == "w1"


def test_approximate_index_bounds_and_forgets_workers():
    clock = FakeClock()
    approx = ApproximateIndex(clock, ttl_s=10.0, max_entries=3)
    approx.record(H[:5], "w1")
    assert len(approx) == 3 and approx.overlap(H) == {"w1": 3}  # the leaves went first
    approx.record(H[:2], "w2")  # shared hashes: no new entries, nothing evicted
    assert approx.overlap(H) == {"w1": 3, "w2": 2}
    approx.remove_worker("w1")
    assert approx.overlap(H) == {"w2": 2} and len(approx) == 2
    clock.advance(10.0)
    approx.expire()
    assert len(approx) == 0


def make_core(policy: KvAwarePolicy, clock: FakeClock, workers=("w1", "w2")) -> RouterCore:
    registry = Registry(clock, lease_ttl_s=10.0)
    for worker_id in workers:
        registry.register(info(worker_id, max_num_seqs=8), WorkerLoad())
    return RouterCore(registry, policy, DisaggregationPolicy(1_000_000, 4))


def test_sibling_burst_spreads_by_the_routers_own_inflight_load():
    # 8 siblings share 8 leading blocks and differ in the last 2; no KV event and no heartbeat arrives meanwhile.
    # r0 -> w1 (cost 10 vs 10, tie); r1: w1 = 10 queued + 2 + 10 in flight = 22 vs w2 = 10 -> w2; r2: 22 vs 22
    # -> w1 (fewer in-flight tokens: equal, so worker_id); r3: w1 = 12 + 2 + 20 = 34 vs w2 = 22 -> w2; ...
    clock = FakeClock()
    policy = kv_policy(PrefixIndex(), clock)
    core = make_core(policy, clock)
    siblings = [PROMPT[:32] + tuple(range(8 * i, 8 * i + 8)) for i in range(8)]
    picks = [core.route(req(s, f"r{i}")).decode.worker_id for i, s in enumerate(siblings)]
    assert picks == ["w1", "w2", "w1", "w2", "w1", "w2", "w1", "w2"]
    views = {v.worker_id: v for v in core.registry.views()}
    # w1 took r0 (40 uncached tokens) then r2, r4, r6 (8 each, their first 8 blocks predicted on w1): the KV they
    # added, the shared prefix once
    assert (views["w1"].num_inflight_tokens, views["w1"].num_queued_prefill_tokens) == (64, 64)
    ignoring_load = kv_policy(PrefixIndex(), clock)  # the same decisions, but never any in-flight load
    alone = [ignoring_load.choose(req(s), [view("w1"), view("w2")]).worker_id for s in siblings]
    assert alone == ["w1"] * 8  # without in-flight tracking they all pile onto w1


def test_completed_requests_stop_counting_at_once():
    clock = FakeClock()
    core = make_core(kv_policy(PrefixIndex(), clock), clock)
    assert core.route(req(req_id="r0")).decode.worker_id == "w1"
    other = tuple(range(5000, 5020))  # 5 blocks sharing nothing with PROMPT
    assert core.route(req(other, "r1")).decode.worker_id == "w2"  # w1: 10 + 5 + 10 = 25 against 5
    # a sibling of r1 would cost w1 25 and w2 5 queued + 0 + 5 in flight = 10; once r0 completes, w1 costs 5
    core.registry.complete("r0")
    assert core.route(req(other, "r2")).decode.worker_id == "w1"  # no heartbeat needed


def test_decision_reports_cached_tokens_and_expired_workers_are_never_chosen():
    clock = FakeClock()
    index = index_with(w1=10, w2=4)
    core = make_core(kv_policy(index, clock), clock)
    decision = core.route(req(req_id="r1"))
    assert (decision.decode.worker_id, decision.policy, decision.num_cached_tokens) == ("w1", "kv", 40)
    clock.advance(5.0)
    core.registry.heartbeat("w2", WorkerLoad())
    clock.advance(5.0)  # w1's lease lapses: its perfect overlap must not attract anything
    assert [core.route(req(req_id=f"s{i}")).decode.worker_id for i in range(3)] == ["w2"] * 3
    assert index.retain_workers(v.worker_id for v in core.registry.views()) == ["w1"]


def test_bad_config_raises():
    with pytest.raises(ValueError, match="must be >= 0"):
        KvPolicyConfig(overlap_weight=-1.0)
    with pytest.raises(ValueError, match="must be >= 0"):
        KvPolicyConfig(inflight_weight=-0.5)
    with pytest.raises(ValueError, match="temperature > 0 needs an rng"):
        kv_policy(PrefixIndex(), temperature=0.5)
    with pytest.raises(ValueError, match="in \\[0, 1\\]"):
        KvPolicyConfig(host_weight=1.5)
