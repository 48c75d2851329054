"""The simulator's outputs: a printed table, the JSON document (top-level `policies`), and PNG plots
(TTFT CDF per policy; load per worker). Formatting and file writing only."""

import json
from pathlib import Path

import numpy as np

from tandem.bench.jsonsafe import json_safe

_ROWS = (  # (label, key, scale)
    ("TTFT mean (s)", "ttft_mean_s", 1.0),
    ("TTFT p50 (s)", "ttft_p50_s", 1.0),
    ("TTFT p90 (s)", "ttft_p90_s", 1.0),
    ("TTFT p99 (s)", "ttft_p99_s", 1.0),
    ("ITL mean (ms)", "itl_mean_s", 1e3),
    ("ITL p50 (ms)", "itl_p50_s", 1e3),
    ("ITL p90 (ms)", "itl_p90_s", 1e3),
    ("ITL p99 (ms)", "itl_p99_s", 1e3),
    ("E2E mean (s)", "e2e_mean_s", 1.0),
    ("E2E p99 (s)", "e2e_p99_s", 1.0),
    ("prefix hit rate", "prefix_hit_rate", 1.0),
    ("goodput (req/s)", "goodput_rps", 1.0),
    ("SLO attainment", "slo_attainment", 1.0),
    ("throughput (req/s)", "throughput_rps", 1.0),
    ("preemptions", "num_preemptions", 1.0),
    ("sim wall (s)", "sim_wall_s", 1.0),
)


def format_table(policies: dict[str, dict]) -> str:
    names = list(policies)
    lines = [f"{'metric':<22}" + "".join(f"{n:>14}" for n in names)]
    for label, key, scale in _ROWS:
        lines.append(f"{label:<22}" + "".join(f"{_fmt(policies[n][key] * scale):>14}" for n in names))
    for tier in ("device", "host", "disk"):
        lines.append(
            f"{'hit rate ' + tier:<22}"
            + "".join(f"{_fmt(policies[n]['prefix_hit_rate_by_tier'][tier]):>14}" for n in names)
        )
    lines.append(
        f"{'KV onboarded (GB)':<22}" + "".join(f"{_fmt(policies[n]['kv_bytes_onboarded'] / 1e9):>14}" for n in names)
    )
    for key in ("num_requests", "busy_fraction"):
        lines.append(
            f"{'load spread ' + key:<22}"
            + "".join(f"{_fmt(policies[n]['load_spread_max_over_mean'][key]):>14}" for n in names)
        )
    return "\n".join(lines)


def write_json(path: Path, header: dict, policies: dict[str, dict]) -> None:
    body = {n: {k: v for k, v in p.items() if k != "ttft_values_s"} for n, p in policies.items()}
    Path(path).write_text(json.dumps(json_safe({**header, "policies": body}), indent=2) + "\n")


def write_plots(prefix: Path, policies: dict[str, dict]) -> list[Path]:
    """`<prefix>_ttft_cdf.png` and `<prefix>_load.png`; returns their paths."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cdf_path, load_path = Path(f"{prefix}_ttft_cdf.png"), Path(f"{prefix}_load.png")
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for name, p in policies.items():
        values = np.sort(np.asarray(p["ttft_values_s"]))
        ax.plot(values, np.arange(1, values.size + 1) / max(values.size, 1), label=name)
    ax.set(xscale="log", xlabel="TTFT (s)", ylabel="fraction of requests", title="TTFT CDF per policy")
    ax.grid(True, alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(cdf_path, dpi=110)
    plt.close(fig)
    _plot_load(plt, load_path, policies)
    return [cdf_path, load_path]


def _plot_load(plt, path: Path, policies: dict[str, dict]) -> None:
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.5))
    width = 0.8 / max(len(policies), 1)
    for k, (name, p) in enumerate(policies.items()):
        workers = list(p["load_per_worker"])
        x = np.arange(len(workers)) + k * width
        for ax, key in zip(axes, ("num_requests", "busy_fraction")):
            ax.bar(x, [p["load_per_worker"][w][key] for w in workers], width, label=name)
            ax.set_xticks(np.arange(len(workers)) + 0.4 - width / 2, workers, rotation=45, fontsize=7)
            ax.set_title(f"{key} per worker")
    axes[0].legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _fmt(value) -> str:
    if value is None or (isinstance(value, float) and not np.isfinite(value)):
        return "-"
    return f"{value:.3f}" if abs(value) < 10 else f"{value:.1f}"
