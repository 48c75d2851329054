"""Routing and disaggregation policies on hand-built worker views, with exact expected choices."""

import itertools

import pytest

from services.router.policy import DisaggregationPolicy, LeastLoadedPolicy, RoundRobinPolicy, load_of, make_policy
from services.router.types import RouteInput
from tests.unit.services.router.helpers import PREFILL, view


def req(n_tokens: int = 8, model: str = "m") -> RouteInput:
    return RouteInput("r", model, tuple(range(n_tokens)))


def pool(*worker_ids: str) -> list:
    return [view(w) for w in worker_ids]


def test_round_robin_cycles_in_worker_id_order():
    rr = RoundRobinPolicy()
    picks = [rr.choose(req(), pool("c", "a", "b")).worker_id for _ in range(4)]
    assert picks == ["a", "b", "c", "a"]


def test_round_robin_resumes_after_last_choice_when_pool_changes():
    rr = RoundRobinPolicy()
    picks = [rr.choose(req(), pool("a", "b", "c")).worker_id for _ in range(2)]  # a, b
    picks += [rr.choose(req(), pool("a", "b", "bb", "c")).worker_id for _ in range(2)]  # joiner after b
    picks.append(rr.choose(req(), pool("a", "b")).worker_id)  # c left: wrap
    picks.append(rr.choose(req(), pool("b", "c")).worker_id)  # a (last) left: next after it
    assert picks == ["a", "b", "bb", "c", "a", "b"]


def test_round_robin_keeps_one_cycle_per_model():
    rr = RoundRobinPolicy()
    picks = [rr.choose(req(model=m), pool("a", "b")).worker_id for m in ("x", "x", "y", "x", "y")]
    assert picks == ["a", "b", "a", "a", "b"]


def test_load_counts_running_waiting_unreflected_per_slot():
    assert load_of(view("w", running=2, waiting=1, unreflected=1, max_num_seqs=8)) == 0.5


def test_least_loaded_normalises_by_max_num_seqs():
    candidates = [
        view("w1", running=2, max_num_seqs=4),  # 0.5
        view("w2", running=1, waiting=1, max_num_seqs=8),  # 0.25
        view("w3", unreflected=3, max_num_seqs=4),
    ]  # 0.75: routed, not yet reported
    assert LeastLoadedPolicy().choose(req(), candidates).worker_id == "w2"


def test_least_loaded_counts_unreflected_routes():
    candidates = [view("w1", unreflected=2), view("w2", running=1)]
    assert LeastLoadedPolicy().choose(req(), candidates).worker_id == "w2"


@pytest.mark.parametrize("order", list(itertools.permutations(range(4))))
def test_least_loaded_ties_break_on_blocks_then_worker_id(order):
    candidates = [
        view("w4", running=1, blocks=3),
        view("w3", running=1, blocks=3),
        view("w2", running=1, blocks=5),
        view("w1", running=2, blocks=0),
    ]
    chosen = LeastLoadedPolicy().choose(req(), [candidates[i] for i in order])
    assert chosen.worker_id == "w3"  # w1 is busier; w2 holds more blocks; w3 < w4


def test_make_policy_by_name_and_unknown_name():
    assert isinstance(make_policy("round_robin"), RoundRobinPolicy)
    assert make_policy("least_loaded").name == "least_loaded"
    with pytest.raises(ValueError, match="unknown routing policy 'nope'; choose one of kv, least_loaded, round_robin"):
        make_policy("nope")


def prefill(worker_id: str, waiting: int = 0, unreflected: int = 0, running: int = 0):
    return view(worker_id, running=running, waiting=waiting, unreflected=unreflected, role=PREFILL)


def test_disagg_without_prefill_workers_is_aggregated():
    decision = DisaggregationPolicy(min_tokens=1).decide(req(1000), [])
    assert (decision.prefill, decision.reason) == (None, "aggregated: no prefill workers")


@pytest.mark.parametrize("n_tokens,expected", [(511, None), (512, "p1"), (513, "p1")])
def test_disagg_threshold(n_tokens, expected):
    decision = DisaggregationPolicy(min_tokens=512).decide(req(n_tokens), [prefill("p1")])
    assert (decision.prefill.worker_id if decision.prefill else None) == expected
    if expected is None:
        assert decision.reason == "aggregated: 511 uncached tokens < 512"
    else:
        assert decision.reason == f"disaggregated: {n_tokens} uncached tokens >= 512; p1 has 0 waiting"


def test_disagg_counts_only_uncached_tokens():
    decision = DisaggregationPolicy(min_tokens=512).decide(req(600), [prefill("p1")], num_cached_tokens=100)
    assert (decision.prefill, decision.reason) == (None, "aggregated: 500 uncached tokens < 512")


def test_disagg_extremes_force_either_mode():
    assert DisaggregationPolicy(min_tokens=1).decide(req(1), [prefill("p1")]).prefill is not None
    assert DisaggregationPolicy(min_tokens=10**9).decide(req(100_000), [prefill("p1")]).prefill is None


def test_disagg_picks_least_loaded_prefill():
    workers = [prefill("p1", waiting=3), prefill("p2", waiting=1), prefill("p3", waiting=1, running=1)]
    decision = DisaggregationPolicy(min_tokens=1, max_waiting=4).decide(req(), workers)
    assert (decision.prefill.worker_id, decision.reason) == (
        "p2",
        "disaggregated: 8 uncached tokens >= 1; p2 has 1 waiting",
    )


@pytest.mark.parametrize("waiting,unreflected", [(4, 0), (2, 2), (9, 0)])
def test_disagg_saturated_prefill_pool_is_aggregated(waiting, unreflected):
    num_waiting = waiting + unreflected
    workers = [prefill("p1", waiting=waiting, unreflected=unreflected), prefill("p2", waiting=num_waiting + 1)]
    decision = DisaggregationPolicy(min_tokens=1, max_waiting=4).decide(req(), workers)
    assert decision.prefill is None
    assert decision.reason == f"aggregated: prefill pool saturated (p1 has {num_waiting} waiting >= 4)"


def test_disagg_just_below_saturation_still_disaggregates():
    decision = DisaggregationPolicy(min_tokens=1, max_waiting=4).decide(req(), [prefill("p1", waiting=3)])
    assert decision.prefill.worker_id == "p1"


def test_make_policy_kv_builds_its_index_from_settings():
    from services.router.kv_policy import KvAwarePolicy, KvPolicyConfig

    policy = make_policy("kv", KvPolicyConfig(temperature=0.5), clock=lambda: 0.0, index_max_entries=7)
    assert isinstance(policy, KvAwarePolicy)
    assert (policy.config.temperature, policy.index.max_entries, policy.rng is not None) == (0.5, 7, True)
