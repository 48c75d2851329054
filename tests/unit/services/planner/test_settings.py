"""The planner's constants an operator tunes (miss budget and window, calibration weight, climb rule): read from
TANDEM_PLANNER_* and flags into the core's config, a value out of range refused at start-up naming the setting."""

import argparse

import pytest

from services.common.settings import SettingsError
from services.planner.settings import SOURCE, PlannerSettings, add_arguments, settings_from


def test_defaults_are_the_cores_own():
    config = PlannerSettings().planner_config
    assert (config.feedback.budget, config.miss_window_ticks) == (0.05, 6)
    assert (config.calibration.is_enabled, config.calibration.weight) == (True, 0.5)
    assert (config.climb_ticks, config.climb_ratio, config.burst_headroom) == (6, 1.3, 1.0)


def test_variables_and_flags_reach_the_core(monkeypatch):
    monkeypatch.setenv("TANDEM_PLANNER_MISS_BUDGET", "0.02")
    monkeypatch.setenv("TANDEM_PLANNER_CALIBRATION_WEIGHT", "1")
    monkeypatch.setenv("TANDEM_PLANNER_CLIMB_RATIO", "0")
    monkeypatch.setenv("TANDEM_PLANNER_BURST_HEADROOM", "1.5")
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    args = parser.parse_args(["--miss-window-ticks", "12", "--climb-ticks", "3", "--miss-budget", "0.03"])
    config = settings_from(args).planner_config
    assert (config.feedback.budget, config.miss_window_ticks) == (0.03, 12)  # the flag over the variable
    assert (config.calibration.weight, config.climb_ticks, config.climb_ratio) == (1.0, 3, 0.0)
    assert config.burst_headroom == 1.5


def test_a_calibration_weight_of_zero_trusts_the_model():
    assert not PlannerSettings(calibration_weight=0.0).planner_config.calibration.is_enabled


@pytest.mark.parametrize(
    "env, message",
    [
        ({"TANDEM_PLANNER_MISS_BUDGET": "0"}, "miss_budget must be in (0, 1), got 0.0"),
        ({"TANDEM_PLANNER_MISS_WINDOW_TICKS": "0"}, "need miss_window_ticks >= 1"),
        ({"TANDEM_PLANNER_CALIBRATION_WEIGHT": "1.5"}, "calibration_weight must be in [0, 1], got 1.5"),
        ({"TANDEM_PLANNER_CLIMB_TICKS": "0"}, "climb_ticks >= 1"),
        ({"TANDEM_PLANNER_CLIMB_RATIO": "0.5"}, "climb_ratio must be 0 (off) or >= 1, got 0.5"),
        ({"TANDEM_PLANNER_BURST_HEADROOM": "0.9"}, "burst_headroom must be >= 1, got 0.9"),
    ],
)
def test_a_value_out_of_range_is_refused_at_start_up(monkeypatch, env, message):
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    with pytest.raises(SettingsError) as raised:
        SOURCE.load()
    assert message in str(raised.value)
