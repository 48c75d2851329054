"""The simulator drives the real planner: a trace replayed against a ClusterSim that PlannerCore scales through
the virtual connector (new replicas serve after a start delay), and the same trace against static provisioning
at its peak and at its mean, in the same run. Orchestration only: every decision is the core's."""
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from engines.sim.profile import TimingProfile
from services.planner.connectors.virtual import VirtualConnector
from services.planner.perf_model import PerfModel, Sizing, Slo
from services.planner.state_machine import PlannerConfig, PlannerCore
from services.planner.types import ROLES, Load, Replicas, WorkerRole
from tandem.bench.traces import TraceRow
from tandem.sim import metrics
from tandem.sim.des import ClusterSim, SimConfig
from tandem.sim.observe import SimObserver

RUNS = ("planner", "static_peak", "static_mean")


@dataclass(frozen=True, slots=True)
class PlannerSimConfig:
    planner: PlannerConfig = field(default_factory=PlannerConfig)
    slo: Slo = Slo()
    sizing: Sizing = Sizing()
    tick_s: float = 5.0  # the fast loop's period (and the observation window)
    peak_window_s: float = 60.0  # static provisioning sizes for the busiest window of this length
    start_delay_s: float = 30.0  # a new replica serves this long after it is asked for (model load)
    policy: str = "least_loaded"
    seed: int = 0
    # NOTE: 0 = the router sees every load change at once. With a periodic heartbeat its prefill-saturation check
    # counts every route since the last report as queued, and sends most long prompts to decode workers
    heartbeat_interval_s: float = 0.0
    # NOTE: 0 = every prompt goes to a prefill worker when one can take it, as the perf model assumes; with a
    # threshold, decode workers also prefill short prompts, which the model does not charge them for
    disagg_min_tokens: int = 0

    @property
    def has_prefill(self) -> bool:
        return self.planner.prefill.max_replicas > 0


def static_counts(rows: list[TraceRow], model: PerfModel, cfg: PlannerSimConfig) -> dict[str, dict]:
    """Replicas the perf model gives for the trace's busiest window, and for its mean load."""
    window = cfg.peak_window_s
    buckets: dict[int, list[TraceRow]] = {}
    for row in rows:
        buckets.setdefault(int(row.arrival_s // window), []).append(row)
    peak = {role: 1 for role in _roles(cfg)}
    for group in buckets.values():
        for role, count in model.replicas(_load(group, window), cfg.has_prefill).items():
            peak[role] = max(peak[role], count)
    span = max(rows[-1].arrival_s - rows[0].arrival_s, window)
    mean = {role: max(count, 1) for role, count in model.replicas(_load(rows, span), cfg.has_prefill).items()}
    return {"static_peak": peak, "static_mean": mean}


def perfect_foresight_share(rows: list[TraceRow], model: PerfModel, cfg: PlannerSimConfig) -> float:
    """A bound, not a run: the replicas the perf model gives each window's actual load (no prediction error, no
    start delay, no hysteresis), averaged over the trace, as a share of static peak's."""
    window = cfg.peak_window_s
    counts: dict[int, int] = {}
    for k in range(int(rows[-1].arrival_s // window) + 1):
        group = [r for r in rows if int(r.arrival_s // window) == k]
        load = _load(group, window) if group else Load(0.0, 1.0, 1.0)
        counts[k] = sum(max(n, 1) for n in model.replicas(load, cfg.has_prefill).values())
    peak = sum(static_counts(rows, model, cfg)["static_peak"].values())
    return sum(counts.values()) / len(counts) / peak


def run_all(profile: TimingProfile, rows: list[TraceRow], cfg: PlannerSimConfig) -> dict[str, dict]:
    """The planner run and both static runs: each one's summary, replicas over time and TTFT samples. GPU-hours
    of all three are counted over the same window: until the last of them has finished its last request."""
    model = PerfModel(profile, cfg.slo, cfg.sizing)
    counts = static_counts(rows, model, cfg)
    runs = {"planner": run_planned(profile, rows, cfg, counts["static_mean"])}
    for name, fixed in counts.items():
        runs[name] = run_static(profile, rows, cfg, fixed)
    window = max(run["end_s"] for run in runs.values())
    for run in runs.values():
        run["gpu_hours_own_end"] = run["gpu_hours"](run["end_s"])
        run["gpu_hours"], run["window_s"] = run["gpu_hours"](window), window
    runs["planner"]["perfect_foresight_share"] = perfect_foresight_share(rows, model, cfg)
    return runs


def run_planned(profile: TimingProfile, rows: list[TraceRow], cfg: PlannerSimConfig, initial: dict) -> dict:
    sim = _cluster(profile, cfg, initial)
    connector = VirtualConnector(sim, lambda: sim.now, cfg.start_delay_s)
    for view in sim.registry.views():
        connector.adopt(view.info.role, view.worker_id)
    core = PlannerCore(cfg.planner, PerfModel(profile, cfg.slo, cfg.sizing))
    decisions: list[dict] = []

    def act(now: float, replicas: dict, obs) -> dict:
        result = core.on_tick(obs, now)
        for d in result.decisions:
            connector.scale(d.role, d.target)
            decisions.append({"t_s": round(now, 3), "role": d.role.value, "from": d.current, "to": d.target,
                              "reason": d.reason})
        return connector.replicas()

    return _replay(sim, rows, cfg, connector.replicas, act, connector.gpu_hours, decisions, initial)


def run_static(profile: TimingProfile, rows: list[TraceRow], cfg: PlannerSimConfig, counts: dict) -> dict:
    sim = _cluster(profile, cfg, counts)
    fixed = {role: Replicas(counts.get(role, 0)) for role in ROLES}
    total = sum(counts.values())
    return _replay(sim, rows, cfg, lambda: fixed, lambda now, replicas, obs: replicas,
                   lambda end: total * end / 3600, [], counts)


def _replay(sim: ClusterSim, rows: list[TraceRow], cfg: PlannerSimConfig, replicas: Callable[[], dict],
            act: Callable, gpu_hours: Callable[[float], float], decisions: list[dict], start: dict) -> dict:
    observer = SimObserver(sim, rows)
    timeline: list[dict] = []

    def tick(now: float) -> None:
        current = replicas()
        obs = observer.observe(now, current)
        after = act(now, current, obs)
        timeline.append({"t_s": now, "request_rate": obs.num_requests / obs.window_s,
                         "replicas": {r.value: after[r].desired for r in ROLES}, "ttft_s": obs.ttft_s})

    wall = time.perf_counter()
    sim.every(cfg.tick_s, tick)
    records = sim.run(rows)
    end = max([r.finish_s for r in records] + [rows[-1].arrival_s])
    summary = metrics.summarize(sim, records, metrics.Slo(cfg.slo.ttft_s, cfg.slo.itl_s), time.perf_counter() - wall)
    return {"sla_attainment": summary["slo_attainment"], "gpu_hours": gpu_hours,  # a function of the window's end
            "replicas": {role.value: count for role, count in start.items()},
            "peak_replicas": max((sum(t["replicas"].values()) for t in timeline), default=0),
            "decisions": decisions, "num_requests": summary["num_requests"], "num_finished": summary["num_finished"],
            **{k: summary[k] for k in ("ttft_p50_s", "ttft_p90_s", "ttft_p99_s", "itl_mean_s", "itl_p99_s",
                                       "sim_wall_s")},
            "end_s": end, "timeline": timeline, "ttft_values_s": summary["ttft_values_s"]}


def _cluster(profile: TimingProfile, cfg: PlannerSimConfig, counts: dict) -> ClusterSim:
    config = SimConfig(counts[WorkerRole.DECODE], counts.get(WorkerRole.PREFILL, 0), cfg.seed,
                       disagg_min_tokens=cfg.disagg_min_tokens, heartbeat_interval_s=cfg.heartbeat_interval_s)
    return ClusterSim(profile, config, cfg.policy)


def _roles(cfg: PlannerSimConfig) -> tuple[WorkerRole, ...]:
    return ROLES if cfg.has_prefill else (WorkerRole.DECODE,)


def _load(rows: list[TraceRow], seconds: float) -> Load:
    return Load(len(rows) / seconds, sum(r.isl for r in rows) / len(rows), sum(r.osl for r in rows) / len(rows))
