"""Predictors: constant and moving average exactly; Holt-Winters (statsmodels) follows a trend and a season."""

import math

import pytest

from services.planner.predictors import (
    MIN_POINTS_TO_FIT,
    ConstantPredictor,
    HoltWintersPredictor,
    MovingAveragePredictor,
    make_predictor,
)


def fed(predictor, values):
    for v in values:
        predictor.observe(v)
    return predictor


def test_nothing_observed_predicts_nothing():
    for name in ("constant", "moving_average", "holt_winters"):
        assert make_predictor(name).predict() is None


def test_constant_and_moving_average():
    assert fed(ConstantPredictor(), [3.0, 7.0]).predict() == 7.0
    assert fed(MovingAveragePredictor(window=3), [1.0, 2.0, 3.0, 10.0]).predict() == 5.0
    assert fed(MovingAveragePredictor(window=3), [4.0]).predict() == 4.0
    with pytest.raises(ValueError):
        MovingAveragePredictor(window=0)


def test_holt_winters_follows_a_rising_trend():
    forecast = fed(HoltWintersPredictor(), [10.0 * i for i in range(1, 21)]).predict()
    assert 195.0 < forecast <= 211.0  # the next point is 210; the damped trend may fall a little short
    assert fed(ConstantPredictor(), [10.0 * i for i in range(1, 21)]).predict() == 200.0  # what it improves on


def test_holt_winters_learns_a_season():
    season = [10.0, 20.0, 40.0, 20.0]
    forecast = fed(HoltWintersPredictor(season_length=4), season * 6).predict()
    assert forecast == pytest.approx(10.0, abs=2.0)  # the cycle starts again; a trend alone would say ~20


def test_holt_winters_falls_back_on_short_flat_or_degenerate_series():
    assert fed(HoltWintersPredictor(), [5.0] * (MIN_POINTS_TO_FIT - 1) + [9.0]).predict() is not None
    assert fed(HoltWintersPredictor(), [1.0, 2.0]).predict() == 2.0  # too few points to fit
    assert fed(HoltWintersPredictor(), [4.0] * 20).predict() == 4.0
    falling = fed(HoltWintersPredictor(), [100.0, 80.0, 60.0, 40.0, 20.0, 1.0, 0.5, 0.1]).predict()
    assert falling >= 0.0 and math.isfinite(falling)  # a rate never goes negative


def test_unknown_predictor():
    with pytest.raises(ValueError, match="holt_winters"):
        make_predictor("prophet")
