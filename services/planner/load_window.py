"""What the adjustment loop accumulates over one interval (arrivals, lengths, each tick's arrivals) and the base
rate it reads from them with bursts left out. Pure: observations in, figures out; no clock, no I/O."""

import math
import statistics
from dataclasses import dataclass, field

from services.planner.types import Observation


@dataclass(slots=True)
class LoadWindow:
    """Arrivals and lengths accumulated over one adjustment interval."""

    seconds: float = 0.0
    num_requests: int = 0
    isl_sum: float = 0.0
    osl_sum: float = 0.0
    num_osl: int = 0
    num_output_tokens: int = 0
    has_output_tokens: bool = True
    is_missing: bool = False
    has_climbed: bool = False  # the climb rule fired in this interval: a burst may fill it
    ticks: list[tuple[int, float]] = field(default_factory=list)  # each tick's arrivals and seconds

    def add(self, obs: Observation) -> None:
        self.seconds += obs.window_s
        self.num_requests += obs.num_requests or 0
        if obs.window_s > 0:
            self.ticks.append((obs.num_requests or 0, obs.window_s))
        if obs.num_requests and obs.mean_isl is not None:
            self.isl_sum += obs.mean_isl * obs.num_requests
        if obs.num_requests and obs.mean_osl is not None:
            self.osl_sum += obs.mean_osl * obs.num_requests
            self.num_osl += obs.num_requests
        if obs.num_output_tokens is None:
            self.has_output_tokens = False
        else:
            self.num_output_tokens += obs.num_output_tokens

    def osl(self) -> float | None:
        """Tokens generated per arrival (unbiased by which requests happen to finish), else finished OSL."""
        if self.has_output_tokens and self.num_requests and self.num_output_tokens:
            return self.num_output_tokens / self.num_requests
        return self.osl_sum / self.num_osl if self.num_osl else None


def base_rate(ticks: list[tuple[int, float]], reference: float | None = None) -> float:
    """Arrivals per second over the ticks that are not a burst: a tick counts as one when its arrivals exceed the
    median tick's rate, or `reference` when lower, by more than three Poisson standard deviations (noise almost
    never does; a burst of 2x or more at a few arrivals a tick does). The reference is the rate predicted for an
    interval in which a burst came and went: one that filled most of it is its median, and would size the next
    interval. Only when every tick is over the band is the median the base (the load moved there). The median
    itself would be as robust, but twice as noisy a base."""
    kept = _calm(ticks, reference)
    if not kept:
        return statistics.median(n / s for n, s in ticks)
    return sum(n for n, _ in kept) / sum(s for _, s in kept)


def is_within(ticks: list[tuple[int, float]], rate: float) -> bool:
    """Do these ticks' arrivals together stay within three Poisson standard deviations over `rate`?"""
    return _in_band(sum(n for n, _ in ticks), rate * sum(s for _, s in ticks))


def _in_band(count: float, expected: float) -> bool:
    """`count` arrivals within three Poisson standard deviations over the `expected` number (noise almost never
    leaves the band; a burst of 2x or more at a few arrivals a tick does)."""
    return count <= expected + 3.0 * math.sqrt(expected)


def peak_ratio(ticks: list[tuple[int, float]], num_ticks: int, base: float) -> float:
    """The largest rate over `num_ticks` consecutive ticks, over `base` (1 without a base or enough ticks)."""
    if base <= 0 or len(ticks) < num_ticks:
        return 1.0
    rates = (
        sum(n for n, _ in ticks[i : i + num_ticks]) / sum(s for _, s in ticks[i : i + num_ticks])
        for i in range(len(ticks) - num_ticks + 1)
    )
    return max(rates) / base


def dispersion(ticks: list[tuple[int, float]]) -> float:
    """The variance of the ticks' arrivals over their mean (1 for Poisson arrivals; more when they come in clumps,
    or a burst came), at least 1; 1 with fewer than three ticks or none arrived. Every tick counts: the Poisson
    band that finds a burst would call a clump one."""
    counts = [n for n, _ in ticks]
    if len(counts) < 3 or not sum(counts):
        return 1.0
    return max(1.0, statistics.variance(counts) / statistics.mean(counts))


def _calm(ticks: list[tuple[int, float]], reference: float | None) -> list[tuple[int, float]]:
    median = statistics.median(n / s for n, s in ticks)
    rate = median if reference is None else min(median, reference)
    return [(n, s) for n, s in ticks if _in_band(n, rate * s)]
