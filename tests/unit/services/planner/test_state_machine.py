"""PlannerCore, pure and on an injected clock: the adjustment loop follows predicted load through the perf model,
the fast loop moves one replica with hysteresis, bounds hold, missing metrics hold every count."""

from dataclasses import replace

import pytest

from services.planner.feedback import FeedbackConfig
from services.planner.load_window import base_rate
from services.planner.perf_model import PerfModel, Sizing, Slo
from services.planner.state_machine import PlannerConfig, PlannerCore, RoleBounds
from services.planner.types import Observation, Replicas, WorkerRole, WorkerSample
from tests.unit.services.planner.helpers import round_profile

P, D = WorkerRole.PREFILL, WorkerRole.DECODE
SLO = Slo(ttft_s=0.5, itl_s=0.05)
# 20 ms decode steps (101 sequences of 1,000 tokens: 5,050 tokens/s); prefill busy at most half the time
MODEL = PerfModel(round_profile(), SLO, Sizing(itl_headroom=0.4, prefill_max_utilization=0.5))
CONFIG = PlannerConfig(
    adjustment_interval_s=10.0,
    prefill=RoleBounds(1, 6),
    decode=RoleBounds(1, 6),
    up_ticks=2,
    down_ticks=3,
    predictor="constant",
    down_stabilization=1,
    feedback=FeedbackConfig(is_enabled=False),
    is_proportional_up=False,
)  # the model alone


def obs(rate=4.0, isl=990.0, osl=20.0, prefill=1, decode=1, window=5.0, **kw):
    """One 5-second window of `rate` arrivals/s (4: one worker of each role is the model's count), `osl` tokens
    generated per arrival, calm workers."""
    replicas = kw.pop("replicas", {P: Replicas(prefill), D: Replicas(decode)})
    workers = kw.pop(
        "workers",
        (WorkerSample("p0", P), WorkerSample("d0", D, num_running=1, num_blocks_used=1, num_blocks_total=100)),
    )
    n = round(rate * window)
    return Observation(window, n, isl, osl, num_output_tokens=round(osl * n), replicas=replicas, workers=workers, **kw)


HEAVY = obs(rate=30.0, isl=900.0, osl=200.0)


def run(core, observations, start=0.0, step=5.0):
    return [core.on_tick(o, start + i * step) for i, o in enumerate(observations)]


def test_the_first_tick_keeps_the_counts_found():
    core = PlannerCore(CONFIG, MODEL)
    result = core.on_tick(obs(prefill=2, decode=3), now=100.0)
    assert result.decisions == () and result.targets == {P: 2, D: 3} and result.predicted is None


def test_the_adjustment_loop_sizes_from_predicted_load_after_a_warm_up_interval():
    core = PlannerCore(CONFIG, MODEL)
    # 30 req/s of 900 tokens: 30 x 90 ms = 2.7 prefill-seconds per second / 0.5 -> 6;
    # 200 tokens each at context 1,000: 6,000 tokens/s / 5,050 per worker -> 2
    results = run(core, [HEAVY] * 5)
    assert [r.predicted is not None for r in results] == [False, False, True, False, True]
    assert results[2].decisions == ()  # the first interval only observes
    assert results[2].predicted.request_rate == 30.0 and results[2].predicted.osl == 200.0
    assert {(d.role, d.current, d.target, d.reason) for d in results[4].decisions} == {
        (P, 1, 6, "predicted load"),
        (D, 1, 2, "predicted load"),
    }


def test_bounds_hold_and_no_role_ever_goes_to_zero():
    core = PlannerCore(replace(CONFIG, prefill=RoleBounds(1, 4)), MODEL)
    results = run(core, [HEAVY] * 5 + [obs(rate=0.0, prefill=4, decode=2)] * 4)
    assert results[4].targets == {P: 4, D: 2}  # the model's 6 prefill workers capped at 4
    assert results[-1].targets == {P: 1, D: 1}  # no traffic: the last worker of each role stays


def test_missing_metrics_hold_every_count():
    core = PlannerCore(CONFIG, MODEL)
    missing = Observation(5.0, None, replicas={P: Replicas(2), D: Replicas(2)})
    results = run(
        core,
        [
            obs(prefill=2, decode=2),
            missing,
            obs(rate=0.0, prefill=2, decode=2),
            obs(rate=0.0, prefill=2, decode=2),
            obs(rate=0.0, prefill=2, decode=2),
        ],
    )
    assert results[1].decisions == () and "missing" in results[1].warnings[0]
    assert "missing" in results[2].warnings[0]  # the interval that saw the gap is not trusted
    assert all(r.decisions == () for r in results)
    no_replicas = core.on_tick(Observation(5.0, 10, 990.0, replicas={D: Replicas(2)}), 25.0)
    assert no_replicas.decisions == () and no_replicas.warnings  # the connector did not answer for prefill


def itl(value, **kw):
    return obs(itl_s=value, ttft_s=0.1, **kw)


def test_an_itl_violation_adds_one_decode_replica_after_two_ticks():
    core = PlannerCore(CONFIG, MODEL)
    results = run(core, [itl(0.06), itl(0.03), itl(0.06), itl(0.06)])
    assert [r.decisions for r in results[:3]] == [(), (), ()]  # one bad tick, then a good one: hysteresis
    assert [(d.role, d.target, d.reason) for d in results[3].decisions] == [(D, 2, "SLO violated")]


def test_nothing_more_is_added_while_a_replica_is_starting_and_none_removed():
    core = PlannerCore(CONFIG, MODEL)
    starting = {P: Replicas(1), D: Replicas(ready=1, starting=1)}
    results = run(core, [itl(0.06)] * 2 + [itl(0.06, replicas=starting)] * 4)
    assert results[1].targets[D] == 2
    assert all(r.decisions == () for r in results[2:])  # still violated, but the new replica is coming
    calm = [itl(0.01, replicas=starting)] * 6
    assert all(r.decisions == () for r in run(core, calm, start=30.0))  # never down while one is starting


def test_every_worker_under_budget_gives_back_a_correction_but_not_below_the_model():
    core = PlannerCore(CONFIG, MODEL)
    up = run(core, [itl(0.06)] * 2)
    assert up[1].targets[D] == 2
    results = run(core, [itl(0.01, decode=2)] * 5, start=10.0)
    assert [r.targets[D] for r in results] == [2, 2, 1, 1, 1]  # three calm ticks, then -1 ...
    assert all(r.targets[D] == 1 for r in run(core, [itl(0.01)] * 6, start=40.0))  # ... and not below the model
    below = PlannerCore(replace(CONFIG, min_correction=1), MODEL)
    run(below, [itl(0.01, decode=2)] * 3)
    assert below.targets()[D] == 1 and below.state[D].correction == -1  # allowed one below when configured


def test_ttft_violations_blame_prefill_while_it_is_busy_else_decode():
    busy = (WorkerSample("p0", P, num_running=3), WorkerSample("d0", D, num_waiting=5, num_running=1))
    core = PlannerCore(CONFIG, MODEL)
    results = run(core, [obs(ttft_s=0.9, itl_s=0.01, workers=busy)] * 2)
    assert [(d.role, d.target) for d in results[1].decisions] == [(P, 2)]  # decode queues from prefill overflow
    idle_prefill = (WorkerSample("p0", P), WorkerSample("d0", D, num_waiting=5, num_running=1))
    core = PlannerCore(CONFIG, MODEL)
    results = run(core, [obs(ttft_s=0.9, itl_s=0.01, workers=idle_prefill)] * 2)
    assert [(d.role, d.target) for d in results[1].decisions] == [(D, 2)]


def test_without_observed_latencies_the_workers_own_load_is_the_budget():
    core = PlannerCore(CONFIG, MODEL)
    # a prefill worker with 9 prompts ahead: 10 x 99 ms = 990 ms > 500 ms
    busy = (WorkerSample("p0", P, num_waiting=8, num_running=1), WorkerSample("d0", D))
    results = run(core, [obs(workers=busy)] * 2)
    assert results[1].budgets[P] > 1.0
    assert [(d.role, d.target) for d in results[1].decisions] == [(P, 2)]


def test_aggregated_serving_sizes_decode_only_and_blames_it_for_ttft():
    config = replace(CONFIG, prefill=RoleBounds(0, 0))
    core = PlannerCore(config, MODEL)
    only_decode = {D: Replicas(1)}
    results = run(core, [obs(ttft_s=0.9, itl_s=0.01, replicas=only_decode)] * 2)
    assert set(results[1].targets) == {D} and [(d.role, d.target) for d in results[1].decisions] == [(D, 2)]


def test_shrinking_waits_for_the_stabilization_window():
    core = PlannerCore(replace(CONFIG, down_stabilization=2), MODEL)
    results = run(core, [HEAVY] * 5 + [obs(rate=10.0, prefill=6, decode=2)] * 4)
    assert results[4].targets == {P: 6, D: 2}
    assert results[6].targets == {P: 6, D: 2}  # one interval at the lower load: still the peak's count
    assert results[8].targets == {P: 2, D: 1}  # two: the lower count wins


def test_a_profile_that_does_not_cover_the_isl_warns_once():
    core = PlannerCore(CONFIG, MODEL)
    results = run(core, [obs(isl=3000.0)] * 7)
    warned = [w for r in results for w in r.warnings]
    assert len(warned) == 1 and "past the profile's longest measured prompt (2000 tokens)" in warned[0]
    assert results[4].targets[P] > 1  # it still sizes, extrapolating


def test_a_model_count_below_the_minimum_does_not_eat_the_fast_loops_correction():
    # an SLO violation added a decode replica; then an interval with hardly any arrivals sizes the model at 0
    # workers: the floor is the minimum, so the added replica stays (it went 2 -> 1 -> 2 live, restarting a worker)
    core = PlannerCore(CONFIG, MODEL)
    up = run(core, [itl(0.06)] * 2)
    assert up[1].targets[D] == 2
    steady = itl(0.045, rate=0.0, decode=2)  # within the SLO, not under budget: the fast loop holds
    results = run(core, [steady] * 3, start=10.0)
    assert results[2].predicted is not None and results[2].predicted.request_rate == 0.0  # the model re-sized
    assert [r.targets[D] for r in results] == [2, 2, 2]


def test_a_pool_calm_only_because_it_has_one_worker_too_many_keeps_it():
    """Under constant load, giving back a worker that the pool needs makes it violate a minute later and take it
    back (Dynamo's 2 <-> 1 oscillation): the fast loop judges each pool at the load one fewer worker would carry."""
    for observed_itl, expected in ((0.025, [2] * 5), (0.015, [2, 2, 1, 1, 1])):
        core = PlannerCore(CONFIG, MODEL)
        run(core, [itl(0.06)] * 2)  # +1 decode: 2 serve
        results = run(core, [itl(observed_itl, decode=2)] * 5, start=10.0)
        assert [r.targets[D] for r in results] == expected  # 0.025 x 2/1 = 0.05 is over 0.8 x 50 ms; 0.015 x 2 is not


def test_the_burst_headroom_carries_a_multiple_of_the_predicted_rate_at_the_slo_itself():
    # 10 req/s of 900 tokens: 0.9 prefill-seconds per second / 0.5 -> 2. A burst of 2x (20/s: 1.8 busy at the SLO,
    # no cap) needs no more than the steady count; of 4x (40/s: 3.6) it needs 4, not the 8 the 50% cap would buy.
    # Decode: 2,000 tokens/s at 20 ms steps -> 1; 8,000 at 50 ms steps (6,689 per worker) -> 2
    load = obs(rate=10.0, isl=900.0, osl=200.0)
    assert run(PlannerCore(CONFIG, MODEL), [load] * 5)[-1].targets == {P: 2, D: 1}
    assert run(PlannerCore(replace(CONFIG, burst_headroom=2.0), MODEL), [load] * 5)[-1].targets == {P: 2, D: 1}
    assert run(PlannerCore(replace(CONFIG, burst_headroom=4.0), MODEL), [load] * 5)[-1].targets == {P: 4, D: 2}


def test_with_a_burst_headroom_the_base_rate_is_the_median_tick_so_a_burst_is_not_paid_twice():
    """Seven 5-second ticks to the first adjustment (0 to 30 s), one a burst at 40 req/s and the rest at 4: the mean
    (64/7 per s) would size for a burst on top of a burst; with a burst headroom the base leaves out the burst's tick
    (20 arrivals where 3 Poisson deviations over the median allow 26) and the headroom carries the burst."""
    ticks = [obs(rate=4.0)] * 5 + [obs(rate=40.0)]
    config = replace(CONFIG, adjustment_interval_s=30.0)
    for headroom, expected in ((1.0, 64 / 7), (2.5, 4.0)):
        results = run(PlannerCore(replace(config, burst_headroom=headroom), MODEL), ticks + [obs(rate=4.0)])
        assert results[-1].predicted is not None
        assert results[-1].predicted.request_rate == pytest.approx(expected)


def test_the_base_rate_leaves_out_only_ticks_past_the_poisson_noise_of_the_median():
    assert base_rate([(20, 5.0), (20, 5.0), (33, 5.0)]) == pytest.approx(73 / 15)  # 33 <= 20 + 3 x sqrt(20)
    assert base_rate([(20, 5.0), (20, 5.0), (35, 5.0)]) == pytest.approx(4.0)  # 35 > 33.4: a burst's tick
    assert base_rate([(0, 5.0), (0, 5.0), (1, 5.0)]) == 0.0  # nothing arrived: no rate, and no division by zero


def test_with_a_burst_headroom_a_count_shrinks_only_once_the_load_is_under_the_calm_share_of_the_lower_one():
    """Decode at 2x the rate and 50 ms steps: 20 req/s keeps 1.34 workers busy (2), 14 req/s 0.94 (1, but 1.18 at
    80% of a worker: hold 2), 10 req/s 0.67 (1 either way). A load on a count's edge holds it; a band of zero width
    (under_budget 1.0) shrinks."""
    config = replace(CONFIG, burst_headroom=2.0, down_stabilization=1)

    def decode_after(rate: float, under_budget: float) -> int:
        core = PlannerCore(replace(config, under_budget=under_budget), MODEL)
        ticks = [obs(rate=20.0, osl=200.0)] * 5 + [obs(rate=rate, osl=200.0)] * 4
        return run(core, ticks)[-1].targets[D]

    assert decode_after(20.0, 0.8) == 2
    assert decode_after(14.0, 0.8) == 2
    assert decode_after(14.0, 1.0) == 1
    assert decode_after(10.0, 0.8) == 1
