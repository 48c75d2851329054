"""The perf model's speed corrected from what the workers measured: per role, the seconds the workers spent
stepping over the seconds the model predicts for the same work. A model 30% wrong is then sized as the truth.
Pure: observations in, two scales out; it never sees the engines' profile, only the workers' own counters.
"""

from dataclasses import dataclass, field

from services.planner.perf_model import PerfModel
from services.planner.types import Observation, PlannerConfigError, WorkerRole, WorkerSample

P, D = WorkerRole.PREFILL, WorkerRole.DECODE


@dataclass(frozen=True, slots=True)
class CalibrationConfig:
    is_enabled: bool = True
    min_predicted_s: float = 5.0  # an interval whose predicted busy time is less than this tells too little
    weight: float = 0.5  # how far one interval's ratio moves the scale (1: the newest alone)
    min_scale: float = 0.25
    max_scale: float = 4.0

    def __post_init__(self) -> None:
        if not 0 < self.weight <= 1 or not 0 < self.min_scale <= 1 <= self.max_scale:
            raise PlannerConfigError(
                f"calibration: need weight in (0, 1] and min_scale <= 1 <= max_scale, got {self.weight}, "
                f"{self.min_scale} and {self.max_scale}"
            )


@dataclass(slots=True)
class _Sums:
    observed_s: float = 0.0
    predicted_s: float = 0.0


@dataclass(slots=True)
class SpeedCalibration:
    """Scales 1.0 at start (the model is trusted until the workers' counters say otherwise)."""

    config: CalibrationConfig
    model: PerfModel  # the uncalibrated model: what every ratio is measured against
    scales: dict[WorkerRole, float] = field(default_factory=lambda: {P: 1.0, D: 1.0})
    _last: dict[str, WorkerSample] = field(default_factory=dict)
    _sums: dict[WorkerRole, _Sums] = field(default_factory=lambda: {P: _Sums(), D: _Sums()})

    def record(self, obs: Observation) -> None:
        """One tick: each worker's busy time since its last sample, against the model's time for that work."""
        prefill_busy = 0.0
        for sample in obs.workers:
            prev, self._last[sample.worker_id] = self._last.get(sample.worker_id), sample
            if prev is None or sample.busy_s is None or prev.busy_s is None:
                continue
            busy = sample.busy_s - prev.busy_s
            if sample.role is P:
                prefill_busy += busy
            else:
                self._add_decode(prev, sample, busy)
        if prefill_busy > 0 and obs.finished:
            # NOTE: the prompts finished in the window stand for those prefilled in it; over an adjustment interval
            # the lag of one answer's length evens out
            sums = self._sums[P]
            sums.observed_s += prefill_busy
            sums.predicted_s += sum(self.model.prefill_s(o.num_new_prompt_tokens) for o in obs.finished)

    def _add_decode(self, prev: WorkerSample, sample: WorkerSample, busy: float) -> None:
        if (
            sample.num_steps is None
            or prev.num_steps is None
            or sample.num_generated_tokens is None
            or prev.num_generated_tokens is None
        ):
            return
        num_steps = sample.num_steps - prev.num_steps
        num_tokens = sample.num_generated_tokens - prev.num_generated_tokens
        if num_steps <= 0 or num_tokens <= 0:
            return
        batch = num_tokens / num_steps
        used = sample.num_blocks_used / sample.num_blocks_total if sample.num_blocks_total else 0.0
        context = used * self.model.profile.kv_capacity_tokens  # NOTE: held by the batch at the tick's end
        sums = self._sums[D]
        sums.observed_s += busy
        sums.predicted_s += num_steps * self.model.decode_step_s(batch, context)

    def update(self) -> dict[WorkerRole, float]:
        """At the end of an adjustment interval: move each scale toward the interval's ratio, then start afresh."""
        cfg = self.config
        for role, sums in self._sums.items():
            if cfg.is_enabled and sums.predicted_s >= cfg.min_predicted_s:
                ratio = sums.observed_s / sums.predicted_s
                scale = self.scales[role] * (1 - cfg.weight) + ratio * cfg.weight
                self.scales[role] = min(max(scale, cfg.min_scale), cfg.max_scale)
            self._sums[role] = _Sums()
        return dict(self.scales)

    def calibrated(self) -> PerfModel:
        """The model with its times multiplied by the scales (on top of any it already had)."""
        m = self.model
        return m.with_speed(m.prefill_scale * self.scales[P], m.decode_scale * self.scales[D])
