"""The SLA judged as the target states it: the share of finished requests that missed their SLO, against the
budget the attainment target leaves (5% at 95%). A request whose own prompt cannot get its first token in time
even on an idle worker is left out: no replica count serves it in time, so it must not drive scaling (it still
counts in the reported attainment, which is the simulator's). Pure: outcomes and a model in, counts out.
"""

from collections import deque
from dataclasses import dataclass

import numpy as np

from services.planner.perf_model import PerfModel
from services.planner.types import RequestOutcome


@dataclass(frozen=True, slots=True)
class Misses:
    """One tick's (or a window's) feasible finished requests and how many missed each SLO."""

    num_judged: int = 0
    num_ttft_missed: int = 0
    num_itl_missed: int = 0
    ttft_s: float | None = None  # the quantile of the feasible requests' TTFT (None: none finished)
    itl_s: float | None = None


def is_feasible(outcome: RequestOutcome, model: PerfModel) -> bool:
    """Could this prompt meet the TTFT SLO alone on an idle worker (by the model, as calibrated)?"""
    return model.prefill_s(outcome.num_new_prompt_tokens) <= model.slo.ttft_s


def judge(outcomes: tuple[RequestOutcome, ...], model: PerfModel, quantile: float = 0.95) -> Misses:
    slo = model.slo
    feasible = [o for o in outcomes if is_feasible(o, model)]
    ttfts = [o.ttft_s for o in feasible]
    itls = [o.itl_s for o in feasible if o.itl_s is not None]
    return Misses(
        len(feasible),
        sum(t > slo.ttft_s for t in ttfts),
        sum(t > slo.itl_s for t in itls),
        float(np.quantile(ttfts, quantile)) if ttfts else None,
        float(np.quantile(itls, quantile)) if itls else None,
    )


class MissWindow:
    """The last `num_ticks` ticks' judged requests and misses of one role, summed: a share over ~15 requests a
    tick is too noisy to act on. Each tick's misses are blamed on a role when they are seen, not at the window's end
    (a window of misses from a busy prefill tick must not be blamed on decode once prefill sits idle)."""

    def __init__(self, num_ticks: int):
        self._ticks: deque[tuple[int, int]] = deque(maxlen=max(num_ticks, 1))

    def add(self, num_judged: int, num_missed: int) -> tuple[int, int]:
        self._ticks.append((num_judged, num_missed))
        return sum(j for j, _ in self._ticks), sum(m for _, m in self._ticks)
