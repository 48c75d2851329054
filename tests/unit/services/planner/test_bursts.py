"""Bursts against the interval's base (sixth pass): a burst that filled most of an interval does not size the next
one, a burst still running across an adjustment keeps the count it climbed to, and a climb is judged only on ticks
the prediction has not seen (a fall is no climb)."""

from dataclasses import replace

import pytest

from services.planner.load_window import base_rate, dispersion, peak_ratio
from services.planner.predictors import LinearTrendPredictor
from services.planner.state_machine import PlannerCore, RoleBounds
from services.planner.types import WorkerRole
from tests.unit.services.planner.test_state_machine import CONFIG, HEAVY, MODEL, obs, run

P, D = WorkerRole.PREFILL, WorkerRole.DECODE


def test_a_burst_over_most_of_the_interval_is_judged_against_the_predicted_rate():
    """Two calm ticks at 4/s, then five of a burst at 10/s: the median (10/s) sees no burst, so the base would be
    the burst's; judged against the predicted 4/s (20 arrivals, band 20 + 3 x sqrt(20) = 33.4) the burst's ticks
    are left out. Every tick over the band: the load moved, the median is the base."""
    ticks = [(20, 5.0)] * 2 + [(50, 5.0)] * 5
    assert base_rate(ticks) == pytest.approx(290 / 35)  # the old rule: the burst's own median hides it
    assert base_rate(ticks, reference=4.0) == pytest.approx(4.0)
    assert base_rate(ticks, reference=20.0) == pytest.approx(290 / 35)  # a reference over the median: the median
    assert base_rate([(50, 5.0)] * 3, reference=4.0) == pytest.approx(10.0)


def _burst(calm_ticks: int, burst_ticks: int) -> list:
    """Adjustments every 30 s from 0; 4/s (1 + 1) for `calm_ticks` ticks, then 30/s for `burst_ticks`, then 4/s
    again to 110 s. The climb (2 ticks) sizes prefill for 30/s at the SLO (3); the adjustment at 90 s is tick 18."""
    config = replace(CONFIG, adjustment_interval_s=30.0, climb_ticks=2, climb_ratio=1.3, burst_headroom=1.5)
    core = PlannerCore(replace(config, prefill=RoleBounds(1, 6)), MODEL)
    burst = obs(rate=30.0, isl=900.0, osl=20.0)
    return run(core, [obs()] * calm_ticks + [burst] * burst_ticks + [obs()] * (23 - calm_ticks - burst_ticks))


def test_a_burst_that_came_and_went_within_an_interval_is_left_out_of_the_next_base():
    """Four burst ticks of six (65-80 s) make the interval's median; the last two ticks are back at 4/s, so the
    burst is judged against the predicted 4/s and left out. Before this pass the base was the median (30/s)."""
    results = _burst(calm_ticks=13, burst_ticks=4)
    assert results[14].targets[P] == 3 and results[14].decisions[0].reason == "load climbing"
    assert results[18].predicted is not None
    assert results[18].predicted.request_rate == pytest.approx(4.0)
    assert results[18].targets[P] == 1


def test_a_burst_still_running_at_an_adjustment_keeps_the_count_it_climbed_to():
    """A burst from 80 s: three calm ticks and three of the burst at the 90 s adjustment; the median (17/s) leaves
    the burst's ticks out (4/s: one worker), but the burst still runs, so the count it climbed to stays."""
    results = _burst(calm_ticks=16, burst_ticks=4)
    assert results[17].targets[P] == 3 and results[17].decisions[0].reason == "load climbing"
    assert results[18].predicted.request_rate == pytest.approx(4.0)
    assert results[18].targets[P] == 3
    assert results[20].targets[P] == 3  # held until the next adjustment sizes again


def test_a_fall_is_not_read_as_a_climb_against_the_lower_prediction():
    """Heavy load, then none: the adjustment at 30 s predicts 0/s while the climb window still holds heavy ticks
    from before it. Judged on them, the planner climbed prefill back to 2 at 35 s (the rule this pass fixed)."""
    core = PlannerCore(replace(CONFIG, prefill=RoleBounds(1, 4)), MODEL)
    results = run(core, [HEAVY] * 5 + [obs(rate=0.0, prefill=4, decode=2)] * 4)
    assert results[6].predicted.request_rate == 0.0
    assert [r.targets[P] for r in results[6:]] == [1, 1, 1]
    assert not any(d.reason == "load climbing" for r in results for d in r.decisions)


def test_the_linear_trend_predictor_extends_the_least_squares_line_one_interval():
    assert LinearTrendPredictor(3).predict() is None
    predictor = LinearTrendPredictor(3)
    for value in (5.0, 1.0, 2.0, 3.0):  # the window keeps the last three
        predictor.observe(value)
    assert predictor.predict() == pytest.approx(4.0)
    predictor.observe(0.0)  # 2, 3, 0: slope -1, mean 5/3 at x = 1 -> 5/3 - 2 < 0
    assert predictor.predict() == 0.0
    with pytest.raises(ValueError):
        LinearTrendPredictor(1)


def test_dispersion_is_the_ticks_variance_over_their_mean_and_never_under_one():
    assert dispersion([(10, 5.0)] * 4) == 1.0  # no spread at all: Poisson's 1 is the floor
    assert dispersion([(0, 5.0), (20, 5.0)] * 3) == pytest.approx(120 / 10)  # clumps: variance 120, mean 10
    assert dispersion([(0, 5.0)] * 4) == 1.0  # nothing arrived


def test_with_climb_deviations_a_clump_the_measured_dispersion_explains_is_no_climb():
    """4/s predicted (one worker of each role), arriving in clumps (0 or 40 a tick: dispersion 480 / 20 = 24): two
    ticks at 12/s (120 arrivals, 3x the rate) pass the ratio and 3 Poisson deviations (40 + 3 x sqrt(40) = 59),
    but not 3 of the clumps' own (40 + 3 x sqrt(24 x 40) = 133). A climb to 24/s (240) passes both."""
    config = replace(CONFIG, adjustment_interval_s=30.0, climb_ticks=2, climb_ratio=1.5)
    clumpy = [obs(rate=0.0), obs(rate=8.0)] * 6 + [obs(rate=0.0)]  # adjustments at 30 and 60 s
    for deviations, jump, expected in ((0.0, 12.0, 2), (3.0, 12.0, 1), (3.0, 24.0, 3)):
        core = PlannerCore(replace(config, climb_deviations=deviations, prefill=RoleBounds(1, 6)), MODEL)
        results = run(core, clumpy + [obs(rate=jump, isl=900.0, osl=20.0)] * 2)
        assert results[-1].predicted is None and results[-2].predicted is None
        assert results[-3].targets[P] == 1
        assert results[-1].targets[P] == expected


def test_peak_ratio_is_the_busiest_window_over_the_base():
    ticks = [(20, 5.0), (20, 5.0), (60, 5.0), (40, 5.0), (20, 5.0)]
    assert peak_ratio(ticks, 2, 4.0) == pytest.approx(10.0 / 4.0)  # 60 + 40 in 10 s
    assert peak_ratio(ticks, 1, 4.0) == pytest.approx(3.0)
    assert peak_ratio(ticks, 2, 0.0) == 1.0 and peak_ratio(ticks[:1], 2, 4.0) == 1.0


def test_with_a_burst_memory_the_headroom_is_the_largest_burst_seen_capped_by_the_fixed_one():
    """Decode at 50 ms steps carries ~6,700 tokens/s a worker; 20 req/s of 200 tokens is 4,000/s. A fixed 2.5x
    headroom sizes for 50 req/s (2 workers); with a memory, steady ticks show a headroom of 1 (one worker), and once
    an interval held a 2x window the headroom is 2 (40 req/s: 2 workers) until it leaves the memory."""
    config = replace(CONFIG, adjustment_interval_s=30.0, climb_ticks=2, climb_ratio=0.0, burst_headroom=2.5)
    steady = [obs(rate=20.0, osl=200.0)] * 13  # adjustments at 30 and 60 s
    burst = [obs(rate=20.0, osl=200.0)] * 4 + [obs(rate=40.0, osl=200.0)] * 2  # in 65-90 s
    for memory, ticks, expected in ((0, steady, 2), (2, steady, 1), (2, steady + burst, 2)):
        core = PlannerCore(replace(config, burst_memory=memory), MODEL)
        assert run(core, ticks)[-1].targets[D] == expected
