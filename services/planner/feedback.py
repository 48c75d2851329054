"""Headroom learned from the observed SLO error, not from the model: per role, a factor on the workers the perf model
says the load keeps busy. It grows after an adjustment interval in which the role's observed latency broke its SLO
and shrinks slowly while one worker fewer would have stayed calm, so a model wrong in either direction is corrected.
Pure: tick verdicts in, factors out; no clock, no I/O.
"""
from dataclasses import dataclass, field

from services.router.types import WorkerRole


class FeedbackError(ValueError):
    """A feedback setting out of its range."""


@dataclass(frozen=True, slots=True)
class FeedbackConfig:
    # NOTE: off by default (gain 0, factor 1): with up_gain 1.0 and down_factor 0.9 it cost 110-220% of the cheapest
    # static fleet on the scoring traces, chasing a per-tick latency quantile no fleet brings under the SLO
    # (docs/planner.md, "Second pass")
    is_enabled: bool = True
    up_gain: float = 0.0  # after an interval: factor *= 1 + up_gain x (share of its ticks that broke the SLO)
    down_factor: float = 1.0  # factor *= this after an interval calm with one worker fewer ...
    min_calm_share: float = 0.75  # ... on at least this share of its ticks, and none broke the SLO
    min_factor: float = 0.5
    max_factor: float = 3.0

    def __post_init__(self) -> None:
        if self.up_gain < 0 or not 0 < self.down_factor <= 1 or not 0 < self.min_calm_share <= 1:
            raise FeedbackError("need up_gain >= 0, down_factor in (0, 1] and min_calm_share in (0, 1]")
        if not 0 < self.min_factor <= 1 <= self.max_factor:
            raise FeedbackError(f"need 0 < min_factor <= 1 <= max_factor, got {self.min_factor} and "
                                f"{self.max_factor}")


@dataclass(slots=True)
class _Tally:
    num_ticks: int = 0
    num_over: int = 0
    num_calm: int = 0


@dataclass(slots=True)
class SloFeedback:
    """One factor per role, 1.0 at start (the model is trusted until the SLO says otherwise)."""

    config: FeedbackConfig
    roles: tuple[WorkerRole, ...]
    factors: dict[WorkerRole, float] = field(default_factory=dict)
    _tallies: dict[WorkerRole, _Tally] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.factors = {role: 1.0 for role in self.roles}
        self._tallies = {role: _Tally() for role in self.roles}

    def record(self, role: WorkerRole, is_over: bool, is_calm: bool) -> None:
        """One tick's verdict for `role`: its SLO was broken (and blamed on it), or one worker fewer would be calm."""
        tally = self._tallies[role]
        tally.num_ticks += 1
        tally.num_over += is_over
        tally.num_calm += is_calm and not is_over

    def update(self) -> dict[WorkerRole, float]:
        """At the end of an adjustment interval: move each factor by what its ticks saw, then start afresh."""
        cfg = self.config
        for role, tally in self._tallies.items():
            if cfg.is_enabled and tally.num_ticks:
                factor = self.factors[role]
                if tally.num_over:
                    factor *= 1 + cfg.up_gain * tally.num_over / tally.num_ticks
                elif tally.num_calm >= cfg.min_calm_share * tally.num_ticks:
                    factor *= cfg.down_factor
                self.factors[role] = min(max(factor, cfg.min_factor), cfg.max_factor)
            self._tallies[role] = _Tally()
        return dict(self.factors)
