"""The SLA judged as the target states it: the share of finished requests that missed their SLO, against the
budget the attainment target leaves (5% at 95%). A request whose own prompt cannot get its first token in time
even on an idle worker is left out: no replica count serves it in time, so it must not drive scaling (it still
counts in the reported attainment, which is the simulator's). Each TTFT miss is blamed on the pool whose queue or
compute delayed that request's first token. Pure: outcomes and a model in, counts out.
"""

from collections import deque
from dataclasses import dataclass

import numpy as np

from services.planner.perf_model import PerfModel
from services.planner.types import RequestOutcome, WorkerRole


@dataclass(frozen=True, slots=True)
class Misses:
    """One tick's (or a window's) feasible finished requests and how many missed each SLO."""

    num_judged: int = 0
    num_ttft_missed: int = 0
    num_itl_missed: int = 0
    ttft_s: float | None = None  # the quantile of the feasible requests' TTFT (None: none finished)
    itl_s: float | None = None
    num_ttft_on_prefill: int = 0  # TTFT misses whose request says which pool delayed it (the rest: not known)
    num_ttft_on_decode: int = 0

    @property
    def num_ttft_unknown(self) -> int:
        return self.num_ttft_missed - self.num_ttft_on_prefill - self.num_ttft_on_decode


def blamed_role(outcome: RequestOutcome, has_prefill_pool: bool) -> WorkerRole | None:
    """The pool that delayed this request's first token. A disaggregated request's first token is the prefill
    worker's (the gateway streams it at once), so its wait is that worker's queue or compute; a prompt the router
    overflowed to a decode worker waited there because the prefill pool was saturated. Only a prompt the decode
    worker was meant to prefill (short, or no prefill pool) was delayed by the decode side. None: not known."""
    if not has_prefill_pool:
        return WorkerRole.DECODE
    if outcome.first_token_role is None:
        return None
    if outcome.first_token_role is WorkerRole.PREFILL or outcome.is_overflow:
        return WorkerRole.PREFILL
    return WorkerRole.DECODE


def is_feasible(outcome: RequestOutcome, model: PerfModel) -> bool:
    """Could this prompt meet the TTFT SLO alone on an idle worker (by the model, as calibrated)?"""
    return model.prefill_s(outcome.num_new_prompt_tokens) <= model.slo.ttft_s


def judge(
    outcomes: tuple[RequestOutcome, ...], model: PerfModel, quantile: float = 0.95, has_prefill_pool: bool = True
) -> Misses:
    slo = model.slo
    feasible = [o for o in outcomes if is_feasible(o, model)]
    ttfts = [o.ttft_s for o in feasible]
    itls = [o.itl_s for o in feasible if o.itl_s is not None]
    blamed = [blamed_role(o, has_prefill_pool) for o in feasible if o.ttft_s > slo.ttft_s]
    return Misses(
        len(feasible),
        len(blamed),
        sum(t > slo.itl_s for t in itls),
        float(np.quantile(ttfts, quantile)) if ttfts else None,
        float(np.quantile(itls, quantile)) if itls else None,
        blamed.count(WorkerRole.PREFILL),
        blamed.count(WorkerRole.DECODE),
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
