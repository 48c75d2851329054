"""The planner's core: every tick it takes an Observation and the time, and returns the replica targets.

Two loops: every adjustment interval the predicted load goes through the perf model (the base); every tick a
fast correction adds or removes one replica, with hysteresis, when observed SLOs are violated or every worker is
well under its budget. Zero I/O: no clock (`now` is handed in), no logging, no transport.
"""

import math
from collections import deque
from dataclasses import dataclass, field, replace

from services.planner.calibration import CalibrationConfig, SpeedCalibration
from services.planner.feedback import FeedbackConfig, SloFeedback
from services.planner.load_window import LoadWindow, base_rate, dispersion, is_within, peak_ratio
from services.planner.perf_model import PerfModel, ceil_workers
from services.planner.predictors import make_predictor
from services.planner.prefill_queue import PrefillQueue, PrefillQueueConfig
from services.planner.slo_misses import Misses, MissWindow, judge
from services.planner.types import (
    ROLES,
    Decision,
    Load,
    Observation,
    PlannerConfigError,
    RequestOutcome,
    TickResult,
    WorkerRole,
)


@dataclass(frozen=True, slots=True)
class RoleBounds:
    min_replicas: int = 1
    max_replicas: int = 8


@dataclass(frozen=True, slots=True)
class PlannerConfig:
    adjustment_interval_s: float = 60.0
    prefill: RoleBounds = RoleBounds()  # max_replicas 0: no prefill pool (aggregated serving)
    decode: RoleBounds = RoleBounds()
    up_ticks: int = 2  # consecutive violated ticks before +1
    down_ticks: int = 6  # consecutive under-budget ticks before -1
    under_budget: float = 0.8  # "well under": every worker below this fraction of its SLO
    max_correction: int = 4  # the fast loop adds at most this many replicas to the model's
    min_correction: int = 0  # and removes at most -min_correction below it
    down_stabilization: int = 2  # the model's count is the highest of its last N adjustments (slow to shrink)
    predictor: str = "constant"
    predictor_window: int = 3  # moving_average
    season_length: int = 0  # holt_winters, in adjustment intervals (0: no seasonality)
    feedback: FeedbackConfig = FeedbackConfig()  # headroom from the observed SLO error
    is_proportional_up: bool = False  # True: the fast loop adds in proportion to the violation, not one (measured
    # with the feedback on, never alone: docs/planner.md)
    calibration: CalibrationConfig = CalibrationConfig()  # the model's speed from the workers' busy-time counters
    miss_window_ticks: int = 6  # with finished requests observed, the fast loop judges the missed share over these
    miss_deviations: float = 0.0  # ... and adds a replica only when the misses exceed the budget by this many
    # binomial standard deviations (three misses among 40 requests at a low rate is noise, not a short fleet); 0: the
    # share alone
    climb_ticks: int = 6  # a climb is judged on the arrivals of this many recent ticks ...
    climb_ratio: float = 1.3  # ... at least this many times the predicted rate; 0: off (resize only each interval)
    climb_deviations: float = 0.0  # ... and this many standard deviations over it, the arrivals' measured
    # dispersion counted (a clump of arrivals is no climb); 0: the ratio alone
    burst_headroom: float = 1.0  # size for this many times the predicted rate: a burst arriving faster than a new
    # replica starts is carried by the workers already serving (1: none)
    prefill_queue: PrefillQueueConfig = PrefillQueueConfig()  # prefill sized by the TTFT tail of the prompt mix
    burst_memory: int = 0  # >0: the headroom is the largest climb-window rate over the base seen in this many
    # intervals (at most burst_headroom, at least 1); 0: burst_headroom always
    decode_burst_headroom: float = 0.0  # >0: the decode pool's headroom, at most the burst headroom (a burst's
    # first tokens wait at once; its decode steps are averaged over each request's life); 0: the burst headroom
    rise_lead: float = 0.0  # the base rate's last rise, carried this many intervals ahead (never a fall): a fleet
    # asked now serves a start delay later, when a climbing day has climbed further; 0: off

    def __post_init__(self) -> None:
        if self.miss_window_ticks < 1 or self.climb_ticks < 1:
            raise PlannerConfigError(
                f"need miss_window_ticks >= 1 and climb_ticks >= 1, got {self.miss_window_ticks} and {self.climb_ticks}"
            )
        if self.climb_deviations < 0 or self.miss_deviations < 0:
            raise PlannerConfigError(
                f"climb_deviations and miss_deviations must be >= 0, got {self.climb_deviations} and "
                f"{self.miss_deviations}"
            )
        if self.climb_ratio and self.climb_ratio < 1:
            raise PlannerConfigError(f"climb_ratio must be 0 (off) or >= 1, got {self.climb_ratio}")
        if self.burst_headroom < 1:
            raise PlannerConfigError(f"burst_headroom must be >= 1, got {self.burst_headroom}")
        if self.burst_memory < 0 or self.rise_lead < 0:
            raise PlannerConfigError(
                f"burst_memory and rise_lead must be >= 0, got {self.burst_memory}, {self.rise_lead}"
            )
        if self.decode_burst_headroom and not 1 <= self.decode_burst_headroom <= self.burst_headroom:
            raise PlannerConfigError(
                f"decode_burst_headroom must be 0 or in [1, burst_headroom], got {self.decode_burst_headroom}"
            )

    def bounds(self, role: WorkerRole) -> RoleBounds:
        return self.prefill if role is WorkerRole.PREFILL else self.decode


@dataclass(slots=True)
class _RoleState:
    base: int = -1  # the model's replicas (before the first adjustment: the count found at start)
    history: list[int] = field(default_factory=list)  # the model's last counts, newest last
    correction: int = 0
    num_over: int = 0
    num_under: int = 0
    reason: str = "initial count"


class PlannerCore:
    def __init__(self, config: PlannerConfig, model: PerfModel):
        self.config, self.model = config, model
        self.calibration = SpeedCalibration(config.calibration, model)
        self._miss_windows = {role: MissWindow(config.miss_window_ticks) for role in ROLES}
        self.roles = tuple(r for r in ROLES if config.bounds(r).max_replicas > 0)
        self.state = {role: _RoleState() for role in self.roles}
        self.predictors = {
            k: make_predictor(config.predictor, config.predictor_window, config.season_length)
            for k in ("rate", "isl", "osl")
        }
        self.feedback = SloFeedback(config.feedback, self.roles)
        self.last_load = Load(0.0, 1.0, 1.0)
        self.last_predicted = Load(0.0, 1.0, 1.0)
        self._window = LoadWindow()
        self._dispersion = 1.0  # the last interval's calm arrivals' variance over mean
        self._peaks: deque[float] = deque(maxlen=max(config.burst_memory, 1))  # each interval's peak over its base
        self._recent: deque[Observation] = deque(maxlen=max(config.climb_ticks, 1))
        self._next_adjust_at: float | None = None
        self._last_base = -1.0  # the last interval's observed base rate (-1: none yet)
        self._uncovered = False
        self._is_warm = False  # the first interval only observes: a planner starting cold sees a biased OSL
        self.prefill_queue = PrefillQueue(config.prefill_queue)
        self._ready = {role: -1 for role in ROLES}  # each role's serving count at the last tick
        self._fleet_since = {role: float("-inf") for role in ROLES}  # when a role's last new replica began serving

    def on_tick(self, obs: Observation, now: float) -> TickResult:
        if self._next_adjust_at is None:
            self._start(obs, now)
        if obs.num_requests is None or any(r not in obs.replicas for r in self.roles):
            self._window.is_missing = True
            return TickResult(targets=self.targets(), warnings=("metrics missing: holding every replica count",))
        self._window.add(obs)
        self.calibration.record(obs)
        predicted: Load | None = None
        warnings: list[str] = []
        self._recent.append(obs)
        if self._next_adjust_at is None or now >= self._next_adjust_at:
            climbed = {role: s.base for role, s in self.state.items() if s.reason == "load climbing"}
            was_predicted = self.last_predicted.request_rate
            predicted, warnings = self._adjust(now)
            # NOTE: a burst still running keeps the count it climbed to
            if self._is_climbing(self._recent_rate(), was_predicted):
                self._window.has_climbed = True
                for role, base in climbed.items():
                    self.state[role].base = max(self.state[role].base, base)
            self._recent.clear()  # NOTE: a climb is judged on ticks the new prediction has not seen (after a fall,
            # the old interval's ticks would read as one)
        else:
            self._maybe_climb()
        self._note_new_replicas(obs, now)
        misses, fresh = None, None
        if obs.finished is not None:  # NOTE: the loops then see only the requests a fleet can serve in time
            self.prefill_queue.record(obs.finished)
            has_pool = WorkerRole.PREFILL in self.state
            misses = judge(obs.finished, self.model, has_prefill_pool=has_pool)
            fresh = {r: judge(self._fresh(obs.finished, r), self.model, has_prefill_pool=has_pool) for r in ROLES}
            obs = replace(obs, ttft_s=misses.ttft_s, itl_s=misses.itl_s)
        budgets = self._budgets(obs)
        self._correct(obs, budgets, fresh)
        return TickResult(self._decisions(obs), self.targets(), predicted, budgets, tuple(warnings))

    def targets(self) -> dict[WorkerRole, int]:
        out = {}
        for role, s in self.state.items():
            b = self.config.bounds(role)
            out[role] = min(max(s.base + s.correction, b.min_replicas, 1), b.max_replicas)
        return out

    # -- the adjustment loop -----------------------------------------------------------------
    def _start(self, obs: Observation, now: float) -> None:
        self._next_adjust_at = now + self.config.adjustment_interval_s
        for role in self.roles:
            replicas = obs.replicas.get(role)
            self.state[role].base = replicas.desired if replicas is not None else self.config.bounds(role).min_replicas

    def _adjust(self, now: float) -> tuple[Load | None, list[str]]:
        window, self._window = self._window, LoadWindow()
        self._next_adjust_at = now + self.config.adjustment_interval_s
        if window.is_missing or window.seconds <= 0:
            return None, ["metrics missing during the interval: holding the model's replica counts"]
        observed = self._observed_load(window)
        self._dispersion = dispersion(window.ticks) if window.ticks else 1.0
        self._peaks.append(peak_ratio(window.ticks, self.config.climb_ticks, observed.request_rate))
        for key, value in (("rate", observed.request_rate), ("isl", observed.isl), ("osl", observed.osl)):
            self.predictors[key].observe(value)
        predicted = Load(*(max(self.predictors[k].predict() or 0.0, 0.0) for k in ("rate", "isl", "osl")))
        rise = max(observed.request_rate - self._last_base, 0.0) if self._last_base >= 0 else 0.0
        self._last_base = observed.request_rate
        predicted = replace(predicted, request_rate=predicted.request_rate + self.config.rise_lead * rise)
        self.last_predicted = predicted
        self.feedback.update()
        self.calibration.update()
        self.model = self.calibration.calibrated()
        if self._is_warm:
            for role, count in self._sized(predicted).items():
                if role in self.state:
                    bounds = self.config.bounds(role)  # NOTE: a base below the floor would absorb a correction
                    self._rebase(self.state[role], min(max(count, bounds.min_replicas, 1), bounds.max_replicas))
        self._is_warm = True
        return predicted, self._coverage_warning(predicted.isl)

    def _recent_rate(self) -> float | None:
        """Arrivals per second over the climb rule's recent ticks; None until they are all seen (or none arrived)."""
        recent = self._recent
        seconds = sum(o.window_s for o in recent)
        num = sum(o.num_requests or 0 for o in recent)
        if not (self._is_warm and self.config.climb_ratio and len(recent) == recent.maxlen and seconds > 0 and num):
            return None
        return num / seconds

    def _is_climbing(self, rate: float | None, predicted_rate: float) -> bool:
        """Do the recent ticks' arrivals (`rate`, from `_recent_rate`) run at least the climb ratio over
        `predicted_rate`, and (with climb deviations) past what noise of the measured dispersion would bring?"""
        cfg = self.config
        if rate is None or rate < cfg.climb_ratio * predicted_rate:
            return False
        seconds = sum(o.window_s for o in self._recent)
        expected = predicted_rate * seconds
        return rate * seconds >= expected + cfg.climb_deviations * math.sqrt(self._dispersion * expected)

    def _maybe_climb(self) -> None:
        """Scale up at once on a climb: when the recent ticks' arrivals run well over the predicted rate, size from
        them now instead of waiting for the interval's end (shrinking stays with the slow adjustment loop)."""
        cfg, recent, rate = self.config, self._recent, self._recent_rate()
        if rate is None or not self._is_climbing(rate, self.last_predicted.request_rate):
            return
        self._window.has_climbed = True
        num = sum(o.num_requests or 0 for o in recent)
        isl = sum((o.mean_isl or 0.0) * (o.num_requests or 0) for o in recent) / num
        load = Load(rate, isl, self.last_predicted.osl)
        # NOTE: a rate measured in the burst itself is carried at the SLO, with no headroom on it (a burst's burst)
        for role, raw in self._at_slo(load).items():
            s = self.state.get(role)
            bounds = self.config.bounds(role)
            count = min(max(raw, 1), bounds.max_replicas)
            if s is not None and count > s.base:
                s.correction -= min(max(s.correction, 0), count - s.base)  # NOTE: what the climb now covers
                s.base, s.reason = count, "load climbing"
                s.history = [*s.history, count][-cfg.down_stabilization :]

    def _sized(self, predicted: Load) -> dict[WorkerRole, int]:
        """The model's count per role for the next interval. With a burst headroom a role shrinks only to the count
        that would carry the load at `under_budget` of it (the fast loop's calm test): a load sitting on a count's
        edge would otherwise cross it with each interval's noise, one direction change a minute."""
        headroom = self._headroom()
        counts = self._counts(predicted, headroom)
        if headroom <= 1:
            return counts
        calm = self._counts(
            replace(predicted, request_rate=predicted.request_rate / self.config.under_budget), headroom
        )
        return {
            role: count
            if role not in self.state or count >= self.state[role].base
            else min(calm[role], self.state[role].base)
            for role, count in counts.items()
        }

    def _headroom(self) -> float:
        """The burst headroom: fixed, or the largest burst the recent intervals showed (the fixed one as a cap)."""
        cap = self.config.burst_headroom
        if not self.config.burst_memory or not self._peaks:
            return cap
        return min(cap, max(1.0, max(self._peaks)))

    def _counts(self, load: Load, headroom: float) -> dict[WorkerRole, int]:
        """Workers per role for `load`: the model's busy workers at its sizing targets (prefill: from the TTFT
        tail of the recent prompt mix once enough prompts were seen), and at least what `headroom` x the rate
        keeps busy at the SLO itself (a burst must be carried, not served with margin, while replicas start);
        each times the feedback's factor."""
        has_prefill = WorkerRole.PREFILL in self.roles
        factors = self.feedback.factors
        out = {role: ceil_workers(b * factors[role]) for role, b in self.model.busy(load, has_prefill).items()}
        if has_prefill:
            queued = self.prefill_queue.workers(load.request_rate, self.model, self.config.prefill.max_replicas)
            if queued is not None:
                out[WorkerRole.PREFILL] = ceil_workers(queued * factors[WorkerRole.PREFILL])
        if headroom > 1:
            burst = replace(load, request_rate=load.request_rate * headroom)
            counts = self._at_slo(burst)
            if self.config.decode_burst_headroom and WorkerRole.DECODE in counts:
                rate = load.request_rate * min(headroom, self.config.decode_burst_headroom)
                counts[WorkerRole.DECODE] = self._at_slo(replace(load, request_rate=rate))[WorkerRole.DECODE]
            for role, count in counts.items():
                out[role] = max(out[role], count)
        return out

    def _at_slo(self, load: Load) -> dict[WorkerRole, int]:
        """Workers per role that `load` keeps busy with decode steps at the ITL SLO and prefill busy all the time."""
        busy = self.model.at_slo().busy(load, WorkerRole.PREFILL in self.roles)
        return {role: ceil_workers(b * self.feedback.factors[role]) for role, b in busy.items()}

    def _rebase(self, s: _RoleState, count: int) -> None:
        """A new model count; shrinking waits for `down_stabilization` adjustments, and a correction the model
        now covers is given back."""
        s.history = [*s.history, count][-self.config.down_stabilization :]
        base = max(s.history)
        if base > s.base and s.correction > 0:
            s.correction -= min(s.correction, base - s.base)
        if base != s.base:
            s.reason = "predicted load"
        s.base = base

    def _observed_load(self, window: LoadWindow) -> Load:
        """The interval's load. With a burst headroom the rate leaves out the burst's ticks: the headroom is what
        carries a burst, so a burst must not also raise the base it multiplies (it would be paid twice). When the
        load climbed in the interval and its last ticks are back at the predicted rate, the burst came and went:
        its ticks are judged against the prediction, not the median they may have become."""
        isl = window.isl_sum / window.num_requests if window.num_requests else self.last_load.isl
        osl = window.osl() or self.last_load.osl
        rate = window.num_requests / window.seconds
        if self.config.burst_headroom > 1 and window.ticks:
            predicted = self.last_predicted.request_rate
            last = window.ticks[-self.config.climb_ticks :]
            is_gone = window.has_climbed and predicted > 0 and is_within(last, predicted)
            rate = base_rate(window.ticks, predicted if is_gone else None)
        self.last_load = Load(rate, isl, osl)
        return self.last_load

    def _coverage_warning(self, isl: float) -> list[str]:
        """Warn once each time the ISL leaves the profile's measured range (the model then extrapolates)."""
        uncovered = not self.model.covers(isl)
        is_new, self._uncovered = uncovered and not self._uncovered, uncovered
        if not is_new:
            return []
        return [
            f"predicted ISL {isl:.0f} is past the profile's longest measured prompt "
            f"({self.model.profile.max_measured_isl:.0f} tokens): extrapolating its prefill time"
        ]

    # -- the fast correction loop ------------------------------------------------------------
    def _budgets(self, obs: Observation) -> dict[WorkerRole, float]:
        isl = obs.mean_isl or self.last_load.isl
        out: dict[WorkerRole, float] = {}
        for sample in obs.workers:
            if sample.role in self.state:
                out[sample.role] = max(out.get(sample.role, 0.0), self.model.budget(sample, isl))
        return out

    def _correct(
        self, obs: Observation, budgets: dict[WorkerRole, float], misses: dict[WorkerRole, Misses] | None
    ) -> None:
        under = self._under(obs, budgets)
        if misses is None:
            over = self._over(obs, budgets)
            judged = {role: (1, int(over[role])) for role in self.state}
        else:
            judged = self._blamed(obs, misses)
            over = self._over_share(judged)
        under = {role: under[role] and not over[role] for role in under}  # NOTE: a role short of its SLO is not calm
        for role, s in self.state.items():
            is_starting = obs.replicas[role].starting > 0
            # NOTE: a violation while replicas start is still evidence of too few; calm is judged on serving ones
            self.feedback.record(role, *judged[role], under[role] and not is_starting)
            if is_starting:  # NOTE: what it asked for is still coming: judge afresh once it serves
                s.num_over = s.num_under = 0
                continue
            s.num_over = s.num_over + 1 if over[role] else 0
            s.num_under = s.num_under + 1 if under[role] else 0
            room = min(
                self.config.max_correction - s.correction, self.config.bounds(role).max_replicas - s.base - s.correction
            )
            if s.num_over >= self.config.up_ticks and room > 0:
                step = min(self._up_step(role, obs, budgets), room)
                s.correction, s.num_over, s.reason = s.correction + step, 0, "SLO violated"
            elif s.num_under >= self.config.down_ticks and s.correction > -self.config.min_correction:
                s.correction, s.num_under, s.reason = s.correction - 1, 0, "every worker under budget"

    def _up_step(self, role: WorkerRole, obs: Observation, budgets: dict[WorkerRole, float]) -> int:
        """Replicas to add on a violation: one, or on a climb as many as the latency's excess over the SLO asks
        (latency / SLO - 1 of today's count, at most doubling it)."""
        n = max(obs.replicas[role].desired, 1)
        if not self.config.is_proportional_up:
            return 1
        excess = self._excess(role, obs, budgets)
        return max(1, min(n, ceil_workers(n * (excess - 1))))

    def _excess(self, role: WorkerRole, obs: Observation, budgets: dict[WorkerRole, float]) -> float:
        """The observed latency over its SLO that the role is blamed for (the model's budget when unobserved)."""
        slo = self.model.slo
        ttft = obs.ttft_s / slo.ttft_s if obs.ttft_s is not None else budgets.get(WorkerRole.PREFILL, 0.0)
        if role is WorkerRole.PREFILL:
            return ttft
        itl = obs.itl_s / slo.itl_s if obs.itl_s is not None else budgets.get(WorkerRole.DECODE, 0.0)
        return max(itl, ttft if self._blames_decode(obs) else 0.0)

    def _over(self, obs: Observation, budgets: dict[WorkerRole, float]) -> dict[WorkerRole, bool]:
        slo = self.model.slo
        ttft = obs.ttft_s > slo.ttft_s if obs.ttft_s is not None else budgets.get(WorkerRole.PREFILL, 0.0) > 1
        itl = obs.itl_s > slo.itl_s if obs.itl_s is not None else budgets.get(WorkerRole.DECODE, 0.0) > 1
        return {
            WorkerRole.PREFILL: ttft and not self._blames_decode(obs),
            WorkerRole.DECODE: itl or (ttft and self._blames_decode(obs)),
        }

    def _over_share(self, judged: dict[WorkerRole, tuple[int, int]]) -> dict[WorkerRole, bool]:
        """Per role: did more of the window's feasible requests miss an SLO blamed on it than the target allows
        (with miss deviations: by more than a binomial draw at the budget's rate would)?"""
        out, budget, z = {}, self.config.feedback.budget, self.config.miss_deviations
        for role in ROLES:
            num_judged, num_missed = self._miss_windows[role].add(*judged[role])
            noise = z * math.sqrt(budget * (1.0 - budget) * num_judged) if z else 0.0
            out[role] = num_missed > budget * num_judged + noise
        return out

    def _blamed(self, obs: Observation, misses: dict[WorkerRole, Misses]) -> dict[WorkerRole, tuple[int, int]]:
        """Per role: this tick's judged requests and the misses blamed on it (of the requests that arrived since
        its newest replica served). A TTFT miss goes where its request says it waited; only one that does not
        say is blamed by the pools' state at this tick."""
        blames_decode = self._blames_decode(obs)

        def on_decode(m: Misses) -> int:
            return m.num_ttft_on_decode + (m.num_ttft_unknown if m.num_ttft_unknown and blames_decode else 0)

        p, d = misses[WorkerRole.PREFILL], misses[WorkerRole.DECODE]
        return {
            WorkerRole.PREFILL: (p.num_judged, p.num_ttft_missed - on_decode(p)),
            WorkerRole.DECODE: (d.num_judged, d.num_itl_missed + on_decode(d)),
        }

    def _note_new_replicas(self, obs: Observation, now: float) -> None:
        """A role whose serving count grew starts its evidence afresh: misses of requests that arrived before its
        new replica served say nothing about the fleet it has now (they would add a replica per burst twice)."""
        for role, replicas in obs.replicas.items():
            if self._ready[role] >= 0 and replicas.ready > self._ready[role]:
                self._fleet_since[role] = now
                self._miss_windows[role] = MissWindow(self.config.miss_window_ticks)
            self._ready[role] = replicas.ready

    def _fresh(self, outcomes: tuple[RequestOutcome, ...], role: WorkerRole) -> tuple[RequestOutcome, ...]:
        since = self._fleet_since[role]
        return tuple(o for o in outcomes if o.arrival_s is None or o.arrival_s >= since)

    def _blames_decode(self, obs: Observation) -> bool:
        """Without per-request attribution: a slow first token is the prefill pool's doing when the load of this very window needs more prefill
        workers than there are, or they are busy (the router then overflows prompts to decode workers); the
        decode pool's only when the prefill workers sit idle."""
        if WorkerRole.PREFILL not in self.state:
            return True
        if obs.window_s > 0 and obs.num_requests:
            now = Load(obs.num_requests / obs.window_s, obs.mean_isl or self.last_load.isl, self.last_load.osl)
            if self.model.replicas(now, True)[WorkerRole.PREFILL] > obs.replicas[WorkerRole.PREFILL].desired:
                return False
        return not any(w.num_waiting or w.num_running for w in obs.workers if w.role is WorkerRole.PREFILL)

    def _under(self, obs: Observation, budgets: dict[WorkerRole, float]) -> dict[WorkerRole, bool]:
        """Per role: would every worker stay well under its SLO with one worker fewer? Each latency and budget is
        scaled by n/(n-1), the share each remaining worker would carry: judged at today's load alone, a pool that
        is calm because it has one worker too many gives it back and is short again a minute later (the 2 <-> 1
        oscillation Dynamo's users report under constant load)."""
        slo, limit = self.model.slo, self.config.under_budget
        seen = {w.role for w in obs.workers}
        out: dict[WorkerRole, bool] = {}
        for role in ROLES:
            n = obs.replicas[role].desired if role in obs.replicas else 0
            grow = n / (n - 1) if n > 1 else 1.0
            ttft_ok = obs.ttft_s is None or obs.ttft_s * grow < limit * slo.ttft_s
            itl_ok = obs.itl_s is None or obs.itl_s * grow < limit * slo.itl_s
            calm = role in seen and budgets.get(role, 0.0) * grow < limit
            if role is WorkerRole.PREFILL:
                out[role] = calm and ttft_ok
            else:
                out[role] = calm and itl_ok and (ttft_ok or WorkerRole.PREFILL in self.state)
        return out

    def _decisions(self, obs: Observation) -> tuple[Decision, ...]:
        out = []
        for role, target in self.targets().items():
            replicas = obs.replicas[role]
            if target == replicas.desired or replicas.is_held or (target < replicas.desired and replicas.starting):
                continue  # NOTE: never scale down while a replica it added has not started serving
            out.append(Decision(role, replicas.desired, target, self.state[role].reason))
        return tuple(out)
