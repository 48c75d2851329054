"""Prefill workers sized by the TTFT tail, not by a utilization cap: the recent prompts' own prefill times (by the
calibrated model) replayed as Poisson arrivals through c first-come-first-served workers, and the fewest c whose
share of feasible prompts missing the TTFT SLO stays within a target. A cap of 80% busy lets one worker carry a
load whose long prompts queue behind each other (the fifth pass's misses); a low load of short prompts needs none
of that headroom. Pure: prompt sizes and a model in, a count out; the random draws are seeded (same input, same
count).
"""

import math
from collections import deque
from dataclasses import dataclass, field

import numpy as np

from services.planner.perf_model import PerfModel
from services.planner.types import PlannerConfigError, RequestOutcome


@dataclass(frozen=True, slots=True)
class PrefillQueueConfig:
    miss_share: float = 0.025  # the share of feasible prompts let queue past the TTFT SLO; 0: off (utilization cap)
    num_prompts: int = 512  # the most recent finished prompts kept as the size mix
    min_prompts: int = 50  # fewer seen than this: the utilization cap decides
    num_arrivals: int = 2000  # arrivals replayed per candidate count
    seed: int = 0

    def __post_init__(self) -> None:
        if not 0 <= self.miss_share < 1 or min(self.num_prompts, self.min_prompts, self.num_arrivals) < 1:
            raise PlannerConfigError(
                f"prefill_miss_share must be in [0, 1) (and the queue's counts >= 1), got {self.miss_share}"
            )

    @property
    def is_enabled(self) -> bool:
        return self.miss_share > 0


class PrefillQueue:
    """The recent prompt mix, and the prefill count it needs at a given arrival rate."""

    def __init__(self, config: PrefillQueueConfig):
        self.config = config
        self._prompts: deque[int] = deque(maxlen=config.num_prompts)

    def record(self, finished: tuple[RequestOutcome, ...]) -> None:
        self._prompts.extend(o.num_new_prompt_tokens for o in finished)

    @property
    def is_ready(self) -> bool:
        return self.config.is_enabled and len(self._prompts) >= self.config.min_prompts

    def workers(self, rate: float, model: PerfModel, most: int) -> int | None:
        """The fewest workers (at most `most`) whose replayed missed share is within the target; None when not
        ready (too few prompts seen, or off). At `most` workers still over it, `most`."""
        if not self.is_ready or most < 1:
            return None
        if rate <= 0:
            return 1
        prompts = np.array(self._prompts)
        rng = np.random.default_rng(self.config.seed)
        arrivals = np.cumsum(rng.exponential(1.0 / rate, self.config.num_arrivals))
        drawn = rng.choice(prompts, self.config.num_arrivals)
        mean_s = float(np.mean([model.prefill_s(n) for n in prompts]))
        least = max(1, math.ceil(rate * mean_s - 1e-9))  # fewer cannot keep up at all
        feasible = feasible_alone(drawn, model)  # NOTE: the same draws for every count: judged once
        for c in range(min(least, most), most + 1):
            if missed_share(arrivals, drawn, c, model, feasible) <= self.config.miss_share:
                return c
        return most


@dataclass(slots=True)
class _Worker:
    """One simulated prefill worker: prompts waiting (index, tokens left), the step running and its end."""

    queue: deque[list[int]] = field(default_factory=deque)
    step: list[int] = field(default_factory=list)  # prompts whose last chunk the running step computes
    ends_at: float = 0.0

    @property
    def num_held(self) -> int:
        return len(self.queue) + len(self.step)


def feasible_alone(prompts: np.ndarray, model: PerfModel) -> np.ndarray:
    """Which prompts could meet the TTFT SLO on an idle worker."""
    return np.array([model.prefill_s(n) for n in prompts.tolist()]) <= model.slo.ttft_s


def missed_share(
    arrivals: np.ndarray, prompts: np.ndarray, num_workers: int, model: PerfModel, feasible: np.ndarray | None = None
) -> float:
    """The engine's prefill as it runs: each arrival joins the worker holding the fewest prompts; a free worker
    steps over its queue first come, first served, up to the step's token budget (a long prompt in chunks), and a
    prompt's first token comes at the end of the step computing its last chunk. The share of prompts that could
    meet the TTFT SLO alone (`feasible`, computed when not given) whose first token does not."""
    slo, budget = model.slo.ttft_s, model.profile.max_num_batched_tokens
    workers = [_Worker() for _ in range(num_workers)]
    first = np.full(len(arrivals), np.inf)
    times = arrivals.tolist()
    for i, (t, n) in enumerate(zip(times, prompts.tolist())):
        for w in workers:
            _advance(w, t, first, arrivals, model, budget)
        w = min(workers, key=lambda w: w.num_held)
        w.queue.append([i, int(n)])
        _advance(w, t, first, arrivals, model, budget)
    for w in workers:
        _advance(w, math.inf, first, arrivals, model, budget)
    if feasible is None:
        feasible = feasible_alone(prompts, model)
    late = first - arrivals > slo
    return float(np.sum(late & feasible) / max(np.sum(feasible), 1))


def _advance(w: _Worker, now: float, first: np.ndarray, arrivals: np.ndarray, model: PerfModel, budget: int) -> None:
    """Run `w`'s steps that end by `now`: a step's prompts get their first token at its end, and the next step
    starts as soon as the worker is free and a prompt has arrived."""
    while True:
        if w.step:
            if w.ends_at > now:
                return
            first[w.step] = w.ends_at
            w.step = []
        if not w.queue:
            return
        start = max(w.ends_at, float(arrivals[w.queue[0][0]]))
        if start > now:
            return
        tokens = 0
        while w.queue and tokens < budget:
            head = w.queue[0]
            take = min(head[1], budget - tokens)
            head[1] -= take
            tokens += take
            if head[1] == 0:
                w.step.append(w.queue.popleft()[0])
        w.ends_at = start + model.step_prefill_s(tokens)
