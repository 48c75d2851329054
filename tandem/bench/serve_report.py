"""Plain-text tables for the serving benchmarks (`bench serve`, `bench overhead`) and their JSON writer.
Formatting only: the numbers come from serve_stats."""

import json
import math
from pathlib import Path

from tandem.bench.jsonsafe import json_safe
from tandem.bench.serve_stats import Distribution, ServeSummary, Slo

_LATENCIES = (
    ("TTFT", "ttft_s"),
    ("ITL (chunk gaps)", "itl_s"),
    ("mean ITL per request", "mean_itl_s"),
    ("end-to-end", "e2e_s"),
)


def ms(seconds: float) -> str:
    return "-" if not math.isfinite(seconds) else f"{seconds * 1e3:.2f}"


def rate(value: float) -> str:
    return "-" if not math.isfinite(value) else f"{value:,.1f}"


def format_summary(s: ServeSummary, slo: Slo) -> str:
    lines = [
        f"requests     {s.num_requests} sent, {s.num_completed} completed, {s.num_errors} errors "
        f"in {s.duration_s:.2f} s",
        f"throughput   {rate(s.requests_per_s)} req/s, {rate(s.output_tokens_per_s)} output tokens/s "
        f"({s.num_output_tokens} tokens)",
        f"goodput      {rate(s.goodput_requests_per_s)} req/s ({s.num_good} of {s.num_requests} {describe_slo(slo)})",
        "",
        f"{'latency (ms)':<22}{'mean':>10}{'p50':>10}{'p90':>10}{'p99':>10}",
    ]
    for label, name in _LATENCIES:
        d: Distribution = getattr(s, name)
        lines.append(f"{label:<22}{ms(d.mean):>10}{ms(d.p50):>10}{ms(d.p90):>10}{ms(d.p99):>10}")
    lines += [f"error: {e}" for e in s.first_errors]
    return "\n".join(lines)


def format_rounds(rounds: list[dict]) -> str:
    """TTFT by round of a multi-turn run."""
    return format_rows(
        ("round", "requests", "TTFT mean (ms)", "TTFT p50 (ms)"),
        [(str(r["round"]), str(r["num_requests"]), ms(r["ttft_mean_s"]), ms(r["ttft_p50_s"])) for r in rounds],
    )


def describe_slo(slo: Slo) -> str:
    parts = ([f"TTFT <= {slo.ttft_s * 1e3:g} ms"] if slo.ttft_s is not None else []) + (
        [f"mean ITL <= {slo.itl_s * 1e3:g} ms"] if slo.itl_s is not None else []
    )
    return "met " + " and ".join(parts) if parts else "completed; no --slo-ttft/--slo-itl given"


def format_rows(header: tuple[str, ...], rows: list[tuple[str, ...]]) -> str:
    """Left-aligned first column, right-aligned others, widths from the content."""
    table = [header, *rows]
    widths = [max(len(r[i]) for r in table) for i in range(len(header))]

    def line(row: tuple[str, ...]) -> str:
        return "  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(row, widths)))

    return "\n".join([line(header), "  ".join("-" * w for w in widths), *map(line, rows)])


def write_json(path: Path, report: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(json_safe(report), indent=2) + "\n")
