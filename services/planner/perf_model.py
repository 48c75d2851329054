"""Replicas from a timing profile (the one the sim engine runs): prefill tokens/s per worker at an ISL, and
decode tokens/s per worker at the largest batch whose step stays within the ITL target at a context length.
Pure: no I/O; the profile is handed in."""

import math
from dataclasses import dataclass

from engines.timing.profile import TimingProfile
from services.planner.types import Load, WorkerRole, WorkerSample


@dataclass(frozen=True, slots=True)
class Slo:
    ttft_s: float = 0.5
    itl_s: float = 0.05


@dataclass(frozen=True, slots=True)
class Sizing:
    """How close to the SLO the model sizes: decode steps at `itl_headroom` x the ITL SLO, prefill workers
    busy at most `prefill_max_utilization` of the time (queueing eats the rest of the TTFT budget)."""

    itl_headroom: float = 0.8
    prefill_max_utilization: float = 0.8


class PerfModel:
    def __init__(
        self,
        profile: TimingProfile,
        slo: Slo,
        sizing: Sizing = Sizing(),
        prefill_scale: float = 1.0,
        decode_scale: float = 1.0,
    ):
        self.profile, self.slo, self.sizing = profile, slo, sizing
        # NOTE: what observed step times say the profile's times must be multiplied by (1: trusted as is)
        self.prefill_scale, self.decode_scale = prefill_scale, decode_scale

    def with_speed(self, prefill_scale: float, decode_scale: float) -> "PerfModel":
        """The same profile with its prefill and decode times multiplied (a calibration from observations)."""
        return PerfModel(self.profile, self.slo, self.sizing, prefill_scale, decode_scale)

    def at_slo(self) -> "PerfModel":
        """The same model sizing at the SLO itself: decode steps at the ITL SLO, prefill busy all the time."""
        return PerfModel(self.profile, self.slo, Sizing(1.0, 1.0), self.prefill_scale, self.decode_scale)

    def decode_step_s(self, num_seqs: float, num_context_tokens: float) -> float:
        return self.profile.decode_step_s(num_seqs, num_context_tokens) * self.decode_scale

    # -- per worker --------------------------------------------------------------------------
    def prefill_s(self, isl: float) -> float:
        """One prompt of `isl` tokens alone on a worker, in chunks of the step's token budget."""
        chunk = self.profile.max_num_batched_tokens
        full, rest = divmod(max(int(round(isl)), 1), chunk)
        return (full * self.profile.prefill_s(chunk) + self.profile.prefill_s(rest)) * self.prefill_scale

    def step_prefill_s(self, num_tokens: int) -> float:
        """One step computing `num_tokens` prompt tokens (of one prompt or several batched)."""
        return self.profile.prefill_s(num_tokens) * self.prefill_scale

    def prefill_tokens_per_s(self, isl: float) -> float:
        return max(isl, 1.0) / self.prefill_s(isl)

    def decode_batch(self, context: float, itl_s: float) -> int:
        """The most sequences of `context` tokens one worker can step within `itl_s` (at least 1)."""
        p = self.profile
        most = max(1, min(p.max_num_seqs, int(p.kv_capacity_tokens // max(context, 1.0))))
        lo, hi = 1, most
        while lo < hi:  # NOTE: step time grows with the batch, so the fitting batches are a prefix
            mid = (lo + hi + 1) // 2
            lo, hi = (mid, hi) if self.decode_step_s(mid, mid * context) <= itl_s else (lo, mid - 1)
        return lo

    def decode_tokens_per_s(self, context: float) -> float:
        itl = self.slo.itl_s * self.sizing.itl_headroom
        batch = self.decode_batch(context, itl)
        return batch / self.decode_step_s(batch, batch * context)

    # -- replicas ----------------------------------------------------------------------------
    def replicas(self, load: Load, has_prefill: bool) -> dict[WorkerRole, int]:
        """Workers per role for `load`; without a prefill role, decode workers also prefill every prompt."""
        return {role: ceil_workers(busy) for role, busy in self.busy(load, has_prefill).items()}

    def busy(self, load: Load, has_prefill: bool) -> dict[WorkerRole, float]:
        """Workers per role `load` keeps busy at the sizing's targets, before rounding up."""
        prefill_busy = load.request_rate * self.prefill_s(load.isl)  # worker-seconds of prefill per second
        decode_busy = load.request_rate * load.osl / self.decode_tokens_per_s(load.isl + load.osl / 2)
        if not has_prefill:
            return {WorkerRole.DECODE: prefill_busy + decode_busy}
        return {WorkerRole.PREFILL: prefill_busy / self.sizing.prefill_max_utilization, WorkerRole.DECODE: decode_busy}

    def covers(self, isl: float) -> bool:
        """False when `isl` lies past the profile's longest measured prompt (the model extrapolates)."""
        return not self.profile.max_measured_isl or isl <= self.profile.max_measured_isl

    # -- SLO budgets from a worker's own load ------------------------------------------------
    def budget(self, sample: WorkerSample, isl: float) -> float:
        """The worker's estimated latency over its SLO: the next prompt's TTFT behind its queue (prefill),
        or its current step time (decode)."""
        if sample.role is WorkerRole.PREFILL:
            ahead = sample.num_waiting + sample.num_running
            return (ahead + 1) * self.prefill_s(isl) / self.slo.ttft_s
        if sample.num_running <= 0:
            return 0.0
        used = sample.num_blocks_used / sample.num_blocks_total if sample.num_blocks_total else 0.0
        step = self.decode_step_s(sample.num_running, used * self.profile.kv_capacity_tokens)
        return step / self.slo.itl_s


def ceil_workers(workers: float) -> int:
    """Whole workers for a busy count (a hair over an integer from float error is that integer)."""
    return math.ceil(workers - 1e-9)
