"""`tandem sim --planner`'s outputs: the table against the targets, the JSON document (`planner`, `static_peak`,
`static_mean`) and a PNG of load, replicas and TTFT over time. Formatting and file writing only."""
import json
from pathlib import Path

from tandem.bench.jsonsafe import json_safe
from tandem.sim.planner_sim import RUNS

TARGET_ATTAINMENT = 0.95
TARGET_GPU_SHARE = 0.70  # of static peak's GPU-hours

_ROWS = (("SLA attainment", "sla_attainment", "{:.3f}"), ("GPU-hours", "gpu_hours", "{:.3f}"),
         ("  to own last req", "gpu_hours_own_end", "{:.3f}"),
         ("peak replicas", "peak_replicas", "{}"), ("TTFT p50 (s)", "ttft_p50_s", "{:.3f}"),
         ("TTFT p99 (s)", "ttft_p99_s", "{:.3f}"), ("ITL mean (ms)", "itl_mean_ms", "{:.1f}"),
         ("sim wall (s)", "sim_wall_s", "{:.1f}"))


def verdict(runs: dict[str, dict]) -> dict[str, bool | float]:
    """The issue's targets, checked on this run's numbers."""
    planner, peak, mean = (runs[name] for name in RUNS)
    share = planner["gpu_hours"] / peak["gpu_hours"] if peak["gpu_hours"] else float("nan")
    return {"gpu_share_of_static_peak": share,
            "perfect_foresight_share": planner.get("perfect_foresight_share", float("nan")),
            "attainment_at_least_95pct": planner["sla_attainment"] >= TARGET_ATTAINMENT,
            "gpu_hours_at_most_70pct_of_static_peak": share <= TARGET_GPU_SHARE,
            "attainment_above_static_mean": planner["sla_attainment"] > mean["sla_attainment"]}


def format_table(runs: dict[str, dict]) -> str:
    lines = [f"{'':<18}" + "".join(f"{name:>14}" for name in RUNS)]
    for label, key, fmt in _ROWS:
        values = [runs[n]["itl_mean_s"] * 1e3 if key == "itl_mean_ms" else runs[n][key] for n in RUNS]
        lines.append(f"{label:<18}" + "".join(f"{fmt.format(v):>14}" for v in values))
    lines.append(f"{'decisions':<18}" + "".join(f"{len(runs[n]['decisions']):>14}" for n in RUNS))
    lines.append(f"{'replicas':<18}" + "".join(f"{_counts(runs[n]['replicas']):>14}" for n in RUNS))
    v = verdict(runs)
    lines.append(f"GPU-hours over the same {runs['planner']['window_s']:.1f} s for every run (to the last request of "
                 f"the slowest); the row below each counts to that run's own last request")
    lines.append(f"a planner with perfect foresight, no start delay and no hysteresis would pay "
                 f"{v['perfect_foresight_share']:.1%} of static peak")
    lines.append(f"targets: attainment >= {TARGET_ATTAINMENT:.0%}: {_mark(v['attainment_at_least_95pct'])}; "
                 f"GPU-hours {v['gpu_share_of_static_peak']:.1%} of static peak (<= {TARGET_GPU_SHARE:.0%}): "
                 f"{_mark(v['gpu_hours_at_most_70pct_of_static_peak'])}; attainment above static mean: "
                 f"{_mark(v['attainment_above_static_mean'])}")
    return "\n".join(lines)


def write_json(path: Path, header: dict, runs: dict[str, dict]) -> None:
    body = {name: {k: v for k, v in run.items() if k != "ttft_values_s"} for name, run in runs.items()}
    doc = {**header, **body, "targets": verdict(runs)}
    Path(path).write_text(json.dumps(json_safe(doc), indent=1) + "\n")


def write_plot(prefix: Path, runs: dict[str, dict], slo_ttft_s: float) -> Path:
    """`<prefix>_planner.png`: arrivals, replicas (the planner's per role; static totals) and TTFT p95 per tick."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    path = Path(f"{prefix}_planner.png")
    fig, (load, replicas, ttft) = plt.subplots(3, 1, figsize=(10, 9), sharex=True)
    timeline = runs["planner"]["timeline"]
    t = [p["t_s"] for p in timeline]
    load.plot(t, [p["request_rate"] for p in timeline], color="black")
    load.set(ylabel="arrivals / s", title="load, replicas and TTFT over time")
    for role in ("prefill", "decode"):
        replicas.step(t, [p["replicas"].get(role, 0) for p in timeline], where="post", label=f"planner {role}")
    replicas.step(t, [sum(p["replicas"].values()) for p in timeline], where="post", label="planner total", lw=2)
    for name in ("static_peak", "static_mean"):
        replicas.axhline(sum(runs[name]["replicas"].values()), ls="--", label=name, color="grey" if "peak" in name else "red")
    replicas.set(ylabel="replicas")
    replicas.legend(fontsize=8, ncol=3)
    for name in RUNS:
        points = [(p["t_s"], p["ttft_s"]) for p in runs[name]["timeline"] if p["ttft_s"] is not None]
        ttft.plot([x for x, _ in points], [y for _, y in points], label=name, lw=1)
    ttft.axhline(slo_ttft_s, ls=":", color="black", label="TTFT SLO")
    ttft.set(yscale="log", ylabel="TTFT p95 per tick (s)", xlabel="simulated time (s)")
    ttft.legend(fontsize=8)
    for ax in (load, replicas, ttft):
        ax.grid(True, alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _counts(replicas: dict) -> str:
    return "/".join(str(replicas.get(role, 0)) for role in ("prefill", "decode")) + " P/D"


def _mark(ok: bool) -> str:
    return "met" if ok else "MISSED"
