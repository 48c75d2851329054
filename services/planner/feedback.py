"""Headroom learned from the observed SLO error, not from the model: per role, a factor on the workers the perf model
says the load keeps busy. It grows after an adjustment interval in which more of the role's requests missed their
SLO than the attainment target allows, and shrinks slowly while few missed and one worker fewer would have stayed
calm. Pure: per-tick counts in, factors out; no clock, no I/O.
"""

from dataclasses import dataclass, field

from services.router.types import WorkerRole


class FeedbackError(ValueError):
    """A feedback setting out of its range."""


@dataclass(frozen=True, slots=True)
class FeedbackConfig:
    # NOTE: off by default (gain 0, factor 1): judged per tick by a latency quantile it cost 110-220% of the
    # cheapest static fleet (docs/planner.md, "Second pass"); judged by the share of requests missed, see "Third pass"
    is_enabled: bool = True
    budget: float = 0.05  # the share of requests the attainment target lets miss their SLO
    up_gain: float = 0.0  # after an interval: factor *= 1 + up_gain x min(missed share / budget - 1, 1)
    down_factor: float = 1.0  # factor *= this after an interval with at most half the budget missed ...
    min_calm_share: float = 0.75  # ... and calm with one worker fewer on at least this share of its ticks
    min_judged: int = 20  # fewer requests than this in an interval: the factor holds
    min_factor: float = 0.5
    max_factor: float = 3.0

    def __post_init__(self) -> None:
        if self.up_gain < 0 or not 0 < self.down_factor <= 1 or not 0 < self.min_calm_share <= 1:
            raise FeedbackError("need up_gain >= 0, down_factor in (0, 1] and min_calm_share in (0, 1]")
        if not 0 < self.budget < 1 or self.min_judged < 1:
            raise FeedbackError(f"need budget in (0, 1) and min_judged >= 1, got {self.budget} and {self.min_judged}")
        if not 0 < self.min_factor <= 1 <= self.max_factor:
            raise FeedbackError(f"need 0 < min_factor <= 1 <= max_factor, got {self.min_factor} and {self.max_factor}")


@dataclass(slots=True)
class _Tally:
    num_ticks: int = 0
    num_calm: int = 0
    num_judged: int = 0
    num_missed: int = 0


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

    def record(self, role: WorkerRole, num_judged: int, num_missed: int, is_calm: bool) -> None:
        """One tick for `role`: requests judged, those that missed an SLO blamed on it, and whether one worker
        fewer would have been calm."""
        tally = self._tallies[role]
        tally.num_ticks += 1
        tally.num_calm += is_calm
        tally.num_judged += num_judged
        tally.num_missed += num_missed

    def update(self) -> dict[WorkerRole, float]:
        """At the end of an adjustment interval: move each factor by its missed share, then start afresh."""
        cfg = self.config
        for role, tally in self._tallies.items():
            if cfg.is_enabled and tally.num_judged >= cfg.min_judged:
                self.factors[role] = min(max(self._moved(self.factors[role], tally), cfg.min_factor), cfg.max_factor)
            self._tallies[role] = _Tally()
        return dict(self.factors)

    def _moved(self, factor: float, tally: _Tally) -> float:
        cfg = self.config
        share = tally.num_missed / tally.num_judged
        if share > cfg.budget:
            return factor * (1 + cfg.up_gain * min(share / cfg.budget - 1, 1.0))
        if share <= cfg.budget / 2 and tally.num_calm >= cfg.min_calm_share * tally.num_ticks:
            return factor * cfg.down_factor
        return factor
