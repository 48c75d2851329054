"""A clairvoyant schedule, built from the trace (pure) and replayed: the fleet set from (t_s, prefill, decode) steps
known in advance, through the planner's virtual connector, so its cost and attainment compare with a planner's run.
No planner runs here: it bounds what any planner could reach, and never stands in for one."""

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace

from engines.timing.profile import TimingProfile
from services.planner.types import ROLES, WorkerRole
from tandem.bench.trace_gen import day_rate
from tandem.bench.traces import TraceRow
from tandem.cluster.planner_sim import PlannerSimConfig, replay_scaled

Fleet = tuple[int, int]  # (prefill, decode) replicas
_EPS = 1e-9


class ScheduleError(ValueError):
    """A schedule that cannot be replayed: unsorted, off the tick grid, or a count outside the bounds."""


@dataclass(frozen=True, slots=True)
class Step:
    """The fleet that must be SERVING from `t_s` on (until the next step)."""

    t_s: float
    prefill: int
    decode: int

    @property
    def fleet(self) -> Fleet:
        return self.prefill, self.decode


def parse_schedule(schedule: Sequence[tuple[float, int, int]], cfg: PlannerSimConfig) -> list[Step]:
    """Checked steps: the first at 0, times strictly ascending on the tick grid, counts within the bounds."""
    steps = [Step(float(t), int(p), int(d)) for t, p, d in schedule]
    if not steps or steps[0].t_s != 0.0:
        raise ScheduleError("a schedule starts at t_s = 0 (the first fleet serves from the start)")
    for before, after in zip(steps, steps[1:]):
        if after.t_s <= before.t_s:
            raise ScheduleError(f"step times must ascend strictly: {before.t_s} then {after.t_s}")
    for step in steps:
        _check_step(step, cfg)
    return steps


def _check_step(step: Step, cfg: PlannerSimConfig) -> None:
    ticks = step.t_s / cfg.tick_s
    if abs(ticks - round(ticks)) > _EPS:
        raise ScheduleError(
            f"t_s {step.t_s} is not a multiple of the tick ({cfg.tick_s} s): the fleet changes on ticks"
        )
    p, d = cfg.planner.prefill, cfg.planner.decode
    p_min = p.min_replicas if cfg.has_prefill else 0
    if not p_min <= step.prefill <= p.max_replicas:
        raise ScheduleError(f"prefill {step.prefill} at {step.t_s} s is outside [{p_min}, {p.max_replicas}]")
    if not max(d.min_replicas, 1) <= step.decode <= d.max_replicas:
        raise ScheduleError(
            f"decode {step.decode} at {step.t_s} s is outside [{max(d.min_replicas, 1)}, {d.max_replicas}]"
        )


def ask_tick(t_s: float, cfg: PlannerSimConfig) -> float:
    """When a replica that must serve from `t_s` is asked for: a start delay earlier, on the tick at or before."""
    return cfg.tick_s * (((t_s - cfg.start_delay_s) / cfg.tick_s + _EPS) // 1)


def wanted(steps: list[Step], now: float, cfg: PlannerSimConfig) -> Fleet:
    """The count to hold (serving or starting) at tick `now`: the fleet serving now, and every later step whose
    replicas must already be asked for. NOTE: a replica that would be removed and asked for again within a start
    delay is kept instead: keeping it costs less than the overlap and it serves sooner."""
    current = [s for s in steps if s.t_s <= now + _EPS][-1]
    ahead = [s for s in steps if s.t_s > now + _EPS and ask_tick(s.t_s, cfg) <= now + _EPS]
    return (
        max([current.prefill] + [s.prefill for s in ahead]),
        max([current.decode] + [s.decode for s in ahead]),
    )


def run_scheduled(
    truth: TimingProfile, rows: list[TraceRow], cfg: PlannerSimConfig, schedule: Sequence[tuple[float, int, int]]
) -> dict:
    """Replay `rows` with the fleet `schedule` names; the dict `run_planned` returns (attainment, GPU-hours to the
    run's own end, end_s, timeline, decisions). The first fleet (with any step due within a start delay) serves
    from 0, as a planner's initial fleet; later additions are billed from their ask, removals drain."""
    steps = parse_schedule(schedule, cfg)

    def decide(now: float, replicas: dict, obs) -> list[tuple[WorkerRole, int, dict]]:
        targets = zip(ROLES, wanted(steps, now, cfg))
        return [(role, target, {}) for role, target in targets if target != replicas[role].desired]

    run = replay_scaled(truth, rows, cfg, dict(zip(ROLES, wanted(steps, 0.0, cfg))), decide)
    return {**run, "schedule": [list(s) for s in schedule]}


def fleet_seconds(schedule: Sequence[tuple[float, int, int]], end_s: float) -> dict[Fleet, float]:
    """How long each fleet is scheduled to serve within [0, end_s]."""
    out: dict[Fleet, float] = {}
    for (t, p, d), nxt in zip(schedule, [*schedule[1:], (end_s, 0, 0)]):
        span = max(0.0, min(nxt[0], end_s) - min(t, end_s))
        out[(p, d)] = out.get((p, d), 0.0) + span
    return out


def planned_seconds(
    schedule: Sequence[tuple[float, int, int]], cfg: PlannerSimConfig, end_s: float
) -> dict[Fleet, float]:
    """How long each fleet will be held within [0, end_s] (tick by tick, as `run_scheduled` asks), before any
    replay: a cheap block is held a start delay less than it serves when a larger fleet follows it."""
    steps, out = parse_schedule(schedule, cfg), dict[Fleet, float]()
    t = 0.0
    while t < end_s - _EPS:
        fleet = wanted(steps, t, cfg)
        out[fleet] = out.get(fleet, 0.0) + min(cfg.tick_s, end_s - t)
        t += cfg.tick_s
    return out


def held_seconds(start: dict[str, int], decisions: list[dict], end_s: float) -> dict[Fleet, float]:
    """How long each fleet was held (paid for: serving or starting) within [0, end_s], from a run's decisions:
    what a schedule bought, where `fleet_seconds` says what it asked to serve."""
    held, out, t = dict(start), dict[Fleet, float](), 0.0
    for d in [*sorted(decisions, key=lambda d: d["t_s"]), {"t_s": end_s}]:
        at = min(d["t_s"], end_s)
        fleet = (held.get("prefill", 0), held.get("decode", 0))
        out[fleet] = out.get(fleet, 0.0) + max(0.0, at - t)
        t = max(t, at)
        if "role" in d:
            held[d["role"]] = d["to"]
    return out


def needed_hold_share(cheap_cost: int, static_cost: int, target_share: float = 0.85) -> float:
    """The least share of the window a cheaper fleet must be held, the static pair the rest, for the schedule to cost
    at most `target_share` of the static pair: f * c + (1 - f) * s <= target * s, so f >= (1 - target) s / (s - c)."""
    if not 0 < cheap_cost < static_cost:
        raise ValueError(f"need 0 < cheap cost ({cheap_cost}) < static cost ({static_cost})")
    return (1.0 - target_share) * static_cost / (static_cost - cheap_cost)


def cheaper_fleets(static: Fleet, cfg: PlannerSimConfig) -> list[Fleet]:
    """Every (prefill, decode) within the bounds with fewer workers than `static`, cheapest first."""
    p, d = cfg.planner.prefill, cfg.planner.decode
    prefill = range(p.min_replicas, p.max_replicas + 1) if cfg.has_prefill else range(0, 1)
    decode = range(max(d.min_replicas, 1), d.max_replicas + 1)
    fleets = [(a, b) for a in prefill for b in decode if a + b < sum(static)]
    return sorted(fleets, key=lambda f: (sum(f), f))


# -- schedules a clairvoyant planner could choose (pure: trace rows and counts in, steps out) ---------------------
def on_grid(t_s: float, tick_s: float, up: bool = False) -> float:
    """`t_s` rounded down (or up) to a multiple of the tick."""
    ticks = t_s / tick_s
    return tick_s * (-((-ticks + _EPS) // 1) if up else (ticks + _EPS) // 1)


def contiguous(cheap: Fleet, generous: Fleet, start_s: float, hold_s: float) -> list[tuple[float, int, int]]:
    """`cheap` for `hold_s` from `start_s`, `generous` before and after."""
    steps = [(0.0, *generous)] if start_s > 0 else []
    return [*steps, (start_s, *cheap), (start_s + hold_s, *generous)]


def alternating(
    cheap: Fleet, generous: Fleet, cheap_s: float, generous_s: float, end_s: float, cheap_first: bool = True
) -> list[tuple[float, int, int]]:
    """Blocks of `cheap_s` with `cheap` and `generous_s` with `generous`, in turn, until `end_s`."""
    blocks = [(cheap, cheap_s), (generous, generous_s)]
    if not cheap_first:
        blocks.reverse()
    steps, t, i = [], 0.0, 0
    while t < end_s:
        fleet, span = blocks[i % 2]
        steps.append((t, *fleet))
        t, i = t + span, i + 1
    return steps


def num_bins(end_s: float, bin_s: float) -> int:
    """Bins of `bin_s` covering [0, end_s), at least one."""
    return max(1, int(-(-end_s // bin_s)))


def bin_loads(rows: list[TraceRow], bin_s: float, end_s: float, measure: str = "tokens") -> list[float]:
    """Per bin of `bin_s` over [0, end_s): the arrivals' tokens (prompt + output) or their count."""
    loads = [0.0] * num_bins(end_s, bin_s)
    for row in rows:
        i = min(int(row.arrival_s // bin_s), len(loads) - 1)  # NOTE: a late arrival counts in the last bin
        loads[i] += (row.isl + row.osl) if measure == "tokens" else 1.0
    return loads


def bin_slices(rows: list[TraceRow], bin_s: float, end_s: float) -> list[list[TraceRow]]:
    """The rows of each bin of `bin_s` over [0, end_s), their arrivals shifted so that each bin starts at 0."""
    slices: list[list[TraceRow]] = [[] for _ in range(num_bins(end_s, bin_s))]
    for row in rows:
        i = min(int(row.arrival_s // bin_s), len(slices) - 1)
        slices[i].append(replace(row, arrival_s=row.arrival_s - i * bin_s))
    return slices


def lightest_bins(loads: list[float], num_bins: int) -> set[int]:
    """The `num_bins` bins with the least load (ties: the earlier bin)."""
    return set(sorted(range(len(loads)), key=lambda i: (loads[i], i))[:num_bins])


def from_bins(fleets: list[Fleet], bin_s: float) -> list[tuple[float, int, int]]:
    """One fleet per bin, consecutive equal fleets merged into one step."""
    steps: list[tuple[float, int, int]] = []
    for i, fleet in enumerate(fleets):
        if not steps or steps[-1][1:] != fleet:
            steps.append((i * bin_s, *fleet))
    return steps


def look_ahead(fleets: list[Fleet]) -> list[Fleet]:
    """Each bin's fleet raised to the next bin's, role by role: a queue one bin leaves, the next bin's ramp."""
    nxt = [*fleets[1:], fleets[-1]]
    return [(max(a[0], b[0]), max(a[1], b[1])) for a, b in zip(fleets, nxt)]


def held_block(cheap: Fleet, generous: Fleet, where: float, need: float, window: float, cfg: PlannerSimConfig) -> list:
    """One block of `cheap`, placed `where` (0: at the start, 1: at the end) of the room left, lengthened tick by
    tick until it is billed (`planned_seconds`) for `need` of the window; `generous` before and after."""
    hold = on_grid(need * window, cfg.tick_s, up=True)
    while True:
        start = on_grid((window - hold) * where, cfg.tick_s) if hold < window else 0.0
        schedule = contiguous(cheap, generous, start, hold)
        if start + hold >= window:  # NOTE: nothing after the window to serve: no fleet to bring back
            schedule = schedule[:-1]
        if hold >= window or planned_seconds(schedule, cfg, window).get(cheap, 0.0) >= need * window:
            return schedule
        hold += cfg.tick_s


def lightest(loads: list[float], cheap: Fleet, generous: Fleet, bin_s: float, need: float, window: float, cfg) -> list:
    """`cheap` in the bins of least load, one more bin at a time until it is billed for `need` of the window."""
    for n in range(1, len(loads) + 1):
        light = lightest_bins(loads, n)
        schedule = from_bins([cheap if i in light else generous for i in range(len(loads))], bin_s)
        if planned_seconds(schedule, cfg, window).get(cheap, 0.0) >= need * window:
            break
    return schedule


@dataclass(frozen=True, slots=True)
class DayShape:
    """The diurnal trace's base curve and burst factor, as `tandem bench traces diurnal` generated it: what a planner
    that knows the day (a seasonal forecast, an operator's schedule) could know, bursts' times excepted."""

    mean_rate: float
    amplitude: float
    period_s: float
    burst_factor: float

    def rate(self, t_s: float) -> float:
        return day_rate(t_s, self.mean_rate, self.amplitude, self.period_s)


def day_fleets(day: DayShape, capacity: tuple[float, float], bin_s: float, end_s: float, cfg) -> list[Fleet]:
    """Per bin: enough workers of each role to carry the burst factor x the day's highest base rate in the bin, at
    `capacity` (prefill, decode) requests/s per worker, within the bounds. Bursts are never looked at."""

    def workers(rate: float, per_worker: float, bounds) -> int:
        return min(max(math.ceil(rate / per_worker - _EPS), bounds.min_replicas, 1), bounds.max_replicas)

    fleets = []
    for i in range(num_bins(end_s, bin_s)):
        top = max(day.rate(i * bin_s + k * bin_s / 10) for k in range(11)) * day.burst_factor
        fleets.append((workers(top, capacity[0], cfg.planner.prefill), workers(top, capacity[1], cfg.planner.decode)))
    return fleets
