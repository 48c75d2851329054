"""Next-interval load predictors, one series each (request rate, ISL or OSL): constant, moving average, a linear
trend, and Holt-Winters exponential smoothing from statsmodels. Pure: values in, a forecast out."""

import warnings
from collections import deque
from typing import Protocol

PREDICTORS = ("constant", "moving_average", "linear_trend", "holt_winters")
MIN_POINTS_TO_FIT = 6  # fewer points than this: Holt-Winters forecasts the last value


class Predictor(Protocol):
    def observe(self, value: float) -> None: ...

    def predict(self) -> float | None:
        """The next interval's value; None before anything was observed."""
        ...


class ConstantPredictor:
    """Tomorrow is today: the last value observed."""

    def __init__(self):
        self.last: float | None = None

    def observe(self, value: float) -> None:
        self.last = value

    def predict(self) -> float | None:
        return self.last


class MovingAveragePredictor:
    def __init__(self, window: int = 3):
        if window < 1:
            raise ValueError(f"moving average window must be >= 1, got {window}")
        self.values: deque[float] = deque(maxlen=window)

    def observe(self, value: float) -> None:
        self.values.append(value)

    def predict(self) -> float | None:
        return sum(self.values) / len(self.values) if self.values else None


class LinearTrendPredictor:
    """The least-squares line through the last `window` values, one interval ahead: a load climbing (or falling)
    at a steady pace is met where it will be, not where it was (the constant predictor trails a climb by one
    interval). Fewer than two values: the last one. Never below 0."""

    def __init__(self, window: int = 3):
        if window < 2:
            raise ValueError(f"linear trend window must be >= 2, got {window}")
        self.values: deque[float] = deque(maxlen=window)

    def observe(self, value: float) -> None:
        self.values.append(value)

    def predict(self) -> float | None:
        n = len(self.values)
        if n < 2:
            return self.values[-1] if self.values else None
        mean_x, mean_y = (n - 1) / 2, sum(self.values) / n
        spread = sum((x - mean_x) ** 2 for x in range(n))
        slope = sum((x - mean_x) * (y - mean_y) for x, y in enumerate(self.values)) / spread
        return max(0.0, mean_y + slope * (n - mean_x))


class HoltWintersPredictor:
    """Additive damped trend, plus additive seasonality of `season_length` intervals once two seasons are seen
    (statsmodels' ExponentialSmoothing, refitted on each forecast over the last `max_history` points)."""

    def __init__(self, season_length: int = 0, max_history: int = 240):
        self.season_length = season_length
        self.values: deque[float] = deque(maxlen=max(max_history, 2 * season_length + 1))

    def observe(self, value: float) -> None:
        self.values.append(value)

    def predict(self) -> float | None:
        if len(self.values) < MIN_POINTS_TO_FIT or len(set(self.values)) == 1:
            return self.values[-1] if self.values else None
        try:
            return max(0.0, self._forecast())
        except (ValueError, ArithmeticError, IndexError):  # NOTE: a degenerate series must never stop the planner
            return self.values[-1]

    def _forecast(self) -> float:
        from statsmodels.tsa.holtwinters import ExponentialSmoothing  # NOTE: heavy; only this predictor pays it

        seasonal = self.season_length > 1 and len(self.values) >= 2 * self.season_length
        model = ExponentialSmoothing(
            list(self.values),
            trend="add",
            damped_trend=True,
            seasonal="add" if seasonal else None,
            seasonal_periods=self.season_length if seasonal else None,
            initialization_method="estimated",
        )
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # convergence chatter on short series
            forecast = float(model.fit().forecast(1)[0])
        if forecast != forecast:  # NaN
            raise ValueError("Holt-Winters forecast is NaN")
        return forecast


def make_predictor(name: str, window: int = 3, season_length: int = 0) -> Predictor:
    if name == "constant":
        return ConstantPredictor()
    if name == "moving_average":
        return MovingAveragePredictor(window)
    if name == "linear_trend":
        return LinearTrendPredictor(window)
    if name == "holt_winters":
        return HoltWintersPredictor(season_length)
    raise ValueError(f"unknown predictor {name!r}; choose from {', '.join(PREDICTORS)}")
