"""`tandem sim --planner`'s outputs: the table against the targets (one column per planner model, one for the
searched static baseline), the JSON document and a PNG of load, replicas and TTFT over time. Formatting and file
writing only."""

import json
from pathlib import Path

from tandem.bench.jsonsafe import json_safe
from tandem.cluster.planner_sim import BASELINE
from tandem.cluster.planner_stability import stability

TARGET_ATTAINMENT = 0.95
TARGET_GPU_SHARE = 0.85  # of the cheapest static pair meeting TARGET_ATTAINMENT
MAX_CHANGES_PER_5_MIN = 1  # scale direction changes in any 5 minutes of trace

_ROWS = (
    ("SLA attainment", "sla_attainment", "{:.3f}"),
    ("GPU-hours", "gpu_hours", "{:.3f}"),
    ("  to own last req", "gpu_hours_own_end", "{:.3f}"),
    ("peak replicas", "peak_replicas", "{}"),
    ("TTFT p50 (s)", "ttft_p50_s", "{:.3f}"),
    ("TTFT p99 (s)", "ttft_p99_s", "{:.3f}"),
    ("ITL mean (ms)", "itl_mean_ms", "{:.1f}"),
    ("disaggregated", "disaggregated_share", "{:.1%}"),
    ("sim wall (s)", "sim_wall_s", "{:.1f}"),
)


def planner_names(runs: dict[str, dict]) -> list[str]:
    return [name for name in runs if name.startswith("planner_")]


def has_baseline(runs: dict[str, dict]) -> bool:
    """A static pair met the target (the search may have found none within the bounds)."""
    return BASELINE in runs and not runs[BASELINE].get("not_found")


def verdict(runs: dict[str, dict], five_minutes_s: float) -> dict[str, dict]:
    """The issue's targets, checked for each planner run on this run's numbers."""
    base = runs[BASELINE]["gpu_hours"] if has_baseline(runs) else 0.0
    out = {}
    for name in planner_names(runs):
        run = runs[name]
        share = run["gpu_hours"] / base if base else float("nan")
        steady = stability(run["decisions"], five_minutes_s)
        out[name] = {
            "gpu_share_of_static_best": share,
            **steady,
            "attainment_at_least_95pct": run["sla_attainment"] >= TARGET_ATTAINMENT,
            "gpu_hours_at_most_85pct_of_static_best": share <= TARGET_GPU_SHARE if base else None,
            "at_most_one_direction_change_per_5_min": steady["max_changes_per_window"] <= MAX_CHANGES_PER_5_MIN,
        }
    return out


def format_table(runs: dict[str, dict], five_minutes_s: float) -> str:
    names = [*planner_names(runs), *([BASELINE] if has_baseline(runs) else [])]
    lines = [f"{'':<18}" + "".join(f"{name:>16}" for name in names)]
    for label, key, fmt in _ROWS:
        values = [runs[n]["itl_mean_s"] * 1e3 if key == "itl_mean_ms" else runs[n][key] for n in names]
        lines.append(f"{label:<18}" + "".join(f"{fmt.format(v):>16}" for v in values))
    lines.append(f"{'decisions':<18}" + "".join(f"{len(runs[n]['decisions']):>16}" for n in names))
    lines.append(f"{'start replicas':<18}" + "".join(f"{_counts(runs[n]['replicas']):>16}" for n in names))
    if BASELINE in runs and not has_baseline(runs):
        lines.append(
            f"{BASELINE}: NO static pair within the bounds met {TARGET_ATTAINMENT:.0%} attainment "
            f"({len(runs[BASELINE]['search'])} pairs replayed)"
        )
    if has_baseline(runs):
        lines.append(
            f"{BASELINE}: the cheapest static pair meeting {TARGET_ATTAINMENT:.0%} attainment, of "
            f"{len(runs[BASELINE]['search'])} pairs replayed against the engine's truth"
        )
    if BASELINE in runs:
        lines.append(search_bounds_line(runs[BASELINE]["search"]))
    lines.append(
        f"GPU-hours over the same {runs[names[0]]['window_s']:.1f} s for every run (to the last request "
        f"of the slowest); the row below counts to each run's own last request"
    )
    for name, v in verdict(runs, five_minutes_s).items():
        lines.append(
            f"{name}: attainment >= {TARGET_ATTAINMENT:.0%}: {_mark(v['attainment_at_least_95pct'])}; "
            f"GPU-hours {v['gpu_share_of_static_best']:.1%} of {BASELINE} (<= {TARGET_GPU_SHARE:.0%}): "
            f"{_mark(v['gpu_hours_at_most_85pct_of_static_best'])}; direction changes "
            f"{v['direction_changes']}, at most {v['max_changes_per_window']} in any 5 trace minutes "
            f"(<= {MAX_CHANGES_PER_5_MIN}): {_mark(v['at_most_one_direction_change_per_5_min'])}"
        )
    return "\n".join(lines)


def search_bounds_line(tried: list[dict]) -> str:
    """Which searched pairs were stopped early: their attainment is at most the figure listed, not a measurement."""
    stopped = [t for t in tried if t.get("attainment_is_upper_bound")]
    if not stopped:
        return "every searched pair was replayed whole: each attainment is measured"
    pairs = ", ".join(f"{t['prefill']}+{t['decode']} <= {t['sla_attainment']:.3f}" for t in stopped)
    return f"stopped early once below the target, attainment AT MOST: {pairs}"


def write_json(path: Path, header: dict, runs: dict[str, dict], five_minutes_s: float) -> None:
    body = {name: {k: v for k, v in run.items() if k != "ttft_values_s"} for name, run in runs.items()}
    doc = {**header, **body, "targets": verdict(runs, five_minutes_s)}
    Path(path).write_text(json.dumps(json_safe(doc), indent=1) + "\n")


def write_plot(prefix: Path, runs: dict[str, dict], slo_ttft_s: float) -> Path:
    """`<prefix>_planner.png`: arrivals, total replicas of each run and TTFT p95 per tick."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    path = Path(f"{prefix}_planner.png")
    fig, (load, replicas, ttft) = plt.subplots(3, 1, figsize=(10, 9), sharex=True)
    names = planner_names(runs)
    timeline = runs[names[0]]["timeline"]
    load.plot([p["t_s"] for p in timeline], [p["request_rate"] for p in timeline], color="black")
    load.set(ylabel="arrivals / s", title="load, replicas and TTFT over time")
    for name in names:
        tl = runs[name]["timeline"]
        replicas.step([p["t_s"] for p in tl], [sum(p["replicas"].values()) for p in tl], where="post", label=name)
    if has_baseline(runs):
        replicas.axhline(sum(runs[BASELINE]["replicas"].values()), ls="--", color="grey", label=BASELINE)
    replicas.set(ylabel="replicas (prefill + decode)")
    replicas.legend(fontsize=8, ncol=2)
    for name in [*names, *([BASELINE] if has_baseline(runs) else [])]:
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


def _mark(ok: bool | None) -> str:
    return "n/a" if ok is None else "met" if ok else "MISSED"
