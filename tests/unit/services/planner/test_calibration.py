"""The model's speed corrected from the workers' busy-time counters, and the SLA judged by the share of feasible
requests that missed it: each alone, and inside PlannerCore."""

from dataclasses import replace

import pytest

from services.planner.calibration import CalibrationConfig, SpeedCalibration
from services.planner.slo_misses import MissWindow, is_feasible, judge
from services.planner.state_machine import PlannerCore
from services.planner.types import RequestOutcome, WorkerRole, WorkerSample
from tests.unit.services.planner.test_state_machine import CONFIG, MODEL, obs, run

P, D = WorkerRole.PREFILL, WorkerRole.DECODE
NOW = CalibrationConfig(weight=1.0, min_predicted_s=0.1)  # each interval's ratio alone, so the arithmetic shows


def decode(busy_s, num_steps, num_tokens, worker_id="d0"):
    # 100 of 20,000 blocks used: 1,000 tokens of context (10 ms a step for one sequence, 20 ms for 101 by the model)
    return WorkerSample(
        worker_id,
        D,
        num_running=1,
        num_blocks_used=100,
        num_blocks_total=20_000,
        busy_s=busy_s,
        num_steps=num_steps,
        num_generated_tokens=num_tokens,
    )


def test_decode_steps_slower_than_the_model_raise_its_decode_scale():
    calibration = SpeedCalibration(NOW, MODEL)
    calibration.record(obs(workers=(decode(0.0, 0, 0),)))
    calibration.record(obs(workers=(decode(2.6, 200, 200),)))  # 200 one-sequence steps of 13 ms: the model says 10
    assert calibration.update()[D] == pytest.approx(1.3)
    assert calibration.calibrated().decode_step_s(1, 1000) == pytest.approx(0.013)


def test_prefill_busy_time_against_the_models_time_for_the_prompts_finished():
    calibration = SpeedCalibration(NOW, MODEL)
    done = tuple(RequestOutcome(1000, 0.2, 0.02) for _ in range(10))  # 100 ms each by the model: 1 s
    calibration.record(obs(workers=(WorkerSample("p0", P, busy_s=5.0),), finished=done))
    calibration.record(obs(workers=(WorkerSample("p0", P, busy_s=5.7),), finished=done))
    assert calibration.update() == {P: pytest.approx(0.7), D: 1.0}  # the first sample only sets the baseline


def test_too_little_work_or_no_counters_leaves_the_scales_alone_and_weight_smooths():
    calibration = SpeedCalibration(CalibrationConfig(weight=0.5, min_predicted_s=1.0), MODEL)
    calibration.record(obs(workers=(decode(0.0, 0, 0), WorkerSample("d1", D, num_running=1))))
    calibration.record(obs(workers=(decode(0.26, 20, 20), WorkerSample("d1", D, num_running=1))))
    assert calibration.update() == {P: 1.0, D: 1.0}  # 0.2 s predicted: too little to tell
    calibration.record(obs(workers=(decode(2.86, 220, 220),)))
    assert calibration.update()[D] == pytest.approx(1.15)  # halfway from 1.0 to 1.3


def test_an_optimistic_model_sizes_as_the_truth_once_calibrated():
    """The workers measure exactly MODEL's times; a model that believes every step half as long sizes fewer
    workers than the truth needs without calibration, and with it the same count as the true model."""
    optimistic = MODEL.with_speed(0.5, 0.5)
    heavy = dict(rate=30.0, isl=900.0, osl=200.0)

    def sized(model, calibration):
        core = PlannerCore(replace(CONFIG, calibration=calibration), model)
        ticks = [
            obs(
                **heavy,
                workers=(
                    decode(1.0 * i, 100 * i, 100 * i),  # 10 ms steps of one sequence
                    WorkerSample("p0", P, busy_s=0.45 * i),
                ),  # 5 prompts of 90 ms a tick
                finished=(RequestOutcome(900, 0.2, 0.02),) * 5,
            )
            for i in range(5)
        ]
        return run(core, ticks)[-1].targets

    truth = sized(MODEL, NOW)
    assert sized(optimistic, CalibrationConfig(is_enabled=False))[D] < truth[D]
    assert sized(optimistic, NOW) == truth


def test_a_prompt_no_worker_prefills_in_time_is_left_out_of_the_judgement():
    ok, late, impossible = RequestOutcome(900, 0.2, 0.02), RequestOutcome(900, 0.7, 0.02), RequestOutcome(9000, 1.0)
    assert is_feasible(ok, MODEL) and not is_feasible(impossible, MODEL)  # 0.9 s of prefill alone > 0.5 s
    misses = judge((ok, late, impossible), MODEL)
    assert (misses.num_judged, misses.num_ttft_missed, misses.num_itl_missed) == (2, 1, 0)
    assert misses.ttft_s == pytest.approx(0.2 + 0.95 * 0.5)  # the quantile of the feasible two only
    window = MissWindow(2)
    assert window.add(2, 1) == (2, 1)
    assert window.add(10, 0) == (12, 1)
    assert window.add(5, 0) == (15, 0)  # the oldest tick left


def test_impossible_prompts_alone_never_scale_up_but_a_missed_share_over_the_budget_does():
    """Every tick holds one prompt that cannot meet the TTFT SLO on an idle worker: the observed p95 TTFT is over
    the SLO, and the quantile rule adds prefill workers; judged by share of the feasible requests, nothing moves.
    When 2 of 20 feasible requests miss (10% > 5%), prefill is added."""
    busy = (WorkerSample("p0", P, num_running=1), decode(0.0, 0, 0))
    fine = (RequestOutcome(900, 0.2, 0.02),) * 19 + (RequestOutcome(9000, 1.2, 0.02),)
    quantile = obs(prefill=2, workers=busy, ttft_s=1.2)
    assert run(PlannerCore(CONFIG, MODEL), [quantile] * 3, step=1.0)[-1].targets[P] == 3
    shared = replace(quantile, finished=fine)
    assert run(PlannerCore(CONFIG, MODEL), [shared] * 3, step=1.0)[-1].targets[P] == 2
    late = (RequestOutcome(900, 0.2, 0.02),) * 18 + (RequestOutcome(900, 0.8, 0.02),) * 2
    assert run(PlannerCore(CONFIG, MODEL), [replace(quantile, finished=late)] * 3, step=1.0)[-1].targets[P] == 3


def test_a_climb_is_sized_at_once_from_recent_arrivals_and_noise_is_not():
    """After two adjustments at 4 requests/s (one worker of each role), arrivals jump to 30/s: within the climb
    window the planner sizes for 30/s without waiting for the interval's end, at the SLO itself (2.7 prefill-seconds
    per second: 3 workers busy all the time, not 6 at the model's 50% cap: the burst is carried while they start).
    A rise under the climb ratio waits."""
    config = replace(CONFIG, adjustment_interval_s=30.0, climb_ticks=2, climb_ratio=1.3)
    calm = [obs() for _ in range(13)]  # adjustments at 30 and 60 s: warm, predicted 4/s
    climb = obs(rate=30.0, isl=900.0, osl=20.0)
    for ratio, jump, expected in ((1.3, climb, 3), (1.3, obs(rate=5.0), 1), (0.0, climb, 1)):  # 0: climbing off
        core = PlannerCore(replace(config, climb_ratio=ratio), MODEL)
        results = run(core, calm + [jump] * 2)  # ticks at 65 and 70 s: before the next adjustment (90 s)
        assert results[-1].predicted is None
        assert results[-1].targets[P] == expected
