"""A missed first token is blamed on the pool that delayed it: the request's own route says where it waited, and
the pools' state at the tick decides only for a request that does not say."""

from dataclasses import replace

import pytest

from services.planner.slo_misses import blamed_role, judge
from services.planner.state_machine import PlannerConfig, PlannerCore
from services.planner.types import PlannerConfigError, RequestOutcome, WorkerRole, WorkerSample
from tests.unit.services.planner.test_state_machine import CONFIG, MODEL, obs, run

P, D = WorkerRole.PREFILL, WorkerRole.DECODE


def late(role=None, is_overflow=False):
    """A feasible prompt (900 tokens: 90 ms of prefill by the model) whose first token came 0.9 s after arrival."""
    return RequestOutcome(900, 0.9, 0.02, role, is_overflow)


def test_the_pool_that_computed_the_first_token_is_blamed_and_an_overflow_is_prefills():
    assert blamed_role(late(P), has_prefill_pool=True) is P  # waited in the prefill queue or prefilled slowly
    assert blamed_role(late(D, is_overflow=True), has_prefill_pool=True) is P  # sent away by a saturated pool
    assert blamed_role(late(D), has_prefill_pool=True) is D  # a prompt the decode worker was meant to prefill
    assert blamed_role(late(), has_prefill_pool=True) is None  # the route is not known
    assert blamed_role(late(), has_prefill_pool=False) is D  # aggregated serving: decode alone


def test_judge_counts_each_pools_misses_and_leaves_the_rest_unknown():
    ok = RequestOutcome(900, 0.2, 0.02, P)
    misses = judge((ok, late(P), late(P), late(D, True), late(D), late()), MODEL)
    assert (misses.num_judged, misses.num_ttft_missed) == (6, 5)
    assert (misses.num_ttft_on_prefill, misses.num_ttft_on_decode, misses.num_ttft_unknown) == (3, 1, 1)
    aggregated = judge((ok, late(P), late()), MODEL, has_prefill_pool=False)
    assert (aggregated.num_ttft_on_prefill, aggregated.num_ttft_on_decode) == (0, 2)


# the prefill worker is idle at every tick and decode has a queue: the state alone blames decode
IDLE_PREFILL = (WorkerSample("p0", P), WorkerSample("d0", D, num_waiting=5, num_running=1))


def targets_after(finished):
    """Three 1-second ticks, each with 18 requests on time and 2 late (10% missed > the 5% budget)."""
    ok = (RequestOutcome(900, 0.2, 0.02, P),) * 18
    ticks = [obs(workers=IDLE_PREFILL, finished=ok + finished)] * 3
    return run(PlannerCore(CONFIG, MODEL), ticks, step=1.0)[-1].targets


def test_misses_that_waited_for_prefill_add_prefill_though_it_is_idle_at_the_tick():
    """The third pass's constant-load failure: the prefill queue made the first tokens late, the prefill worker was
    idle by the tick the misses were seen, and decode was grown instead of prefill."""
    assert targets_after((late(P),) * 2) == {P: 2, D: 1}
    assert targets_after((late(D, is_overflow=True),) * 2) == {P: 2, D: 1}


def test_misses_the_decode_side_caused_add_decode_and_unknown_ones_keep_the_old_rule():
    assert targets_after((late(D),) * 2) == {P: 1, D: 2}
    assert targets_after((late(),) * 2) == {P: 1, D: 2}  # no route known: idle prefill at the tick blames decode


def test_one_miss_of_each_pool_is_under_either_budget():
    """2 misses in 20 requests break the 5% budget together, but split between the pools neither one does."""
    assert targets_after((late(P), late(D))) == {P: 1, D: 1}


def decode_after_new_replica(arrival_s: float) -> int:
    """Decode 1 serving + 1 starting; the second serves from t=5; then two ticks in which half the requests
    finishing miss the ITL SLO, all of which arrived at `arrival_s`."""
    from services.planner.types import Replicas

    slow = (RequestOutcome(900, 0.2, 0.08, P, arrival_s=arrival_s),) * 10
    fine = (RequestOutcome(900, 0.2, 0.02, P, arrival_s=arrival_s),) * 10
    ticks = [obs(replicas={P: Replicas(1), D: Replicas(1, starting=1)})]
    ticks += [obs(replicas={P: Replicas(1), D: Replicas(2)}, finished=slow + fine)] * 3
    return run(PlannerCore(CONFIG, MODEL), ticks)[-1].targets[D]


def test_misses_of_requests_that_arrived_before_a_new_replica_served_add_no_other():
    """A burst's requests admitted on the old fleet keep finishing late after the replica it asked for serves:
    they say nothing about the fleet that serves now. The same misses from requests admitted after it do."""
    assert decode_after_new_replica(arrival_s=2.0) == 2
    assert decode_after_new_replica(arrival_s=6.0) == 3


def prefill_after(finished, config=CONFIG, num_ticks=3):
    """`num_ticks` 1-second ticks, each with 18 requests on time and `finished` besides; the prefill target."""
    ok = (RequestOutcome(900, 0.2, 0.02, P),) * 18
    ticks = [obs(workers=IDLE_PREFILL, finished=ok + finished)] * num_ticks
    return run(PlannerCore(config, MODEL), ticks, step=1.0)[-1].targets[P]


def test_with_miss_deviations_a_few_misses_at_a_low_rate_are_noise_and_a_steady_excess_is_not():
    """10% missed of 60 judged requests: over the 5% budget, but within two binomial deviations of it (3 expected,
    sd 1.7: 6 missed is under 3 + 3.4); the same 10% over 600 requests is far past it (30 + 10.7)."""
    noisy = replace(CONFIG, miss_deviations=2.0)
    assert prefill_after((late(P),) * 2) == 2  # the share alone adds one
    assert prefill_after((late(P),) * 2, noisy) == 1
    many = (RequestOutcome(900, 0.2, 0.02, P),) * 180
    ticks = [obs(workers=IDLE_PREFILL, finished=many + (late(P),) * 20)] * 3
    assert run(PlannerCore(noisy, MODEL), ticks, step=1.0)[-1].targets[P] == 2


def test_miss_deviations_must_not_be_negative():
    with pytest.raises(PlannerConfigError, match="miss_deviations"):
        PlannerConfig(miss_deviations=-1.0)
