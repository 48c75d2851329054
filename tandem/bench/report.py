"""Turns measured results into the benchmark's JSON document and its printed table. Pure formatting."""

import math
from dataclasses import asdict, dataclass

from tandem.bench.roofline import GemmRate, roofline_fraction
from tandem.bench.stats import RunSummary
from tandem.bench.workload import Workload

NATIVE, TRANSFORMERS = "native", "transformers"
RATIO_KEYS = ("output_tokens_per_s", "ttft_s_p50", "itl_s_p50", "decode_tokens_per_s", "roofline_fraction")
# (label, key, scale) rows of the table
_ROWS = (
    ("output tok/s (aggregate)", "output_tokens_per_s", 1.0),
    ("TTFT p50 (ms)", "ttft_s_p50", 1e3),
    ("ITL p50 (ms)", "itl_s_p50", 1e3),
    ("ITL p90 (ms)", "itl_s_p90", 1e3),
    ("decode tok/s per request", "decode_tokens_per_s", 1.0),
    ("roofline fraction", "roofline_fraction", 1.0),
)


@dataclass(frozen=True, slots=True)
class WorkloadResult:
    workload: Workload
    gemm: GemmRate  # measured at M = workload.num_requests
    summaries: dict[str, RunSummary]  # engine name -> summary


def engine_entry(summary: RunSummary, num_parameters: int, gemm: GemmRate) -> dict:
    entry = asdict(summary)
    entry["roofline_fraction"] = roofline_fraction(summary.output_tokens_per_s, num_parameters, gemm.flops_per_s)
    return entry


def workload_entry(result: WorkloadResult, num_parameters: int) -> dict:
    w = result.workload
    engines = {name: engine_entry(s, num_parameters, result.gemm) for name, s in result.summaries.items()}
    return {
        "num_requests": w.num_requests,
        "isl": w.isl,
        "osl": w.osl,
        "roofline": result.gemm.to_dict(),
        "engines": engines,
        "ratio_native_over_transformers": ratios(engines),
    }


def ratios(engines: dict[str, dict]) -> dict[str, float | None]:
    if NATIVE not in engines or TRANSFORMERS not in engines:
        return {key: None for key in RATIO_KEYS}
    native, hf = engines[NATIVE], engines[TRANSFORMERS]
    return {key: _safe_div(native[key], hf[key]) for key in RATIO_KEYS}


def build_report(header: dict, results: list[WorkloadResult], num_parameters: int) -> dict:
    """`header` carries the run's settings (model, dtype, threads, versions, transformers mode)."""
    workloads = {r.workload.name: workload_entry(r, num_parameters) for r in results}
    return {**header, "num_parameters": num_parameters, "workloads": workloads}


def format_report(report: dict) -> str:
    lines = [
        f"model: {report['model']}",
        f"dtype: {report['dtype']} (both engines)   threads: {report['threads']} (both engines)   "
        f"parameters: {report['num_parameters'] / 1e6:.1f}M",
        f"transformers mode: {report['transformers_mode']}",
    ]
    for name, entry in report["workloads"].items():
        lines += ["", *_format_workload(name, entry)]
    return "\n".join(lines)


def _format_workload(name: str, entry: dict) -> list[str]:
    gflops = entry["roofline"]["gemm_flops_per_s"] / 1e9
    title = (
        f"{name}: {entry['num_requests']} request(s) x {entry['isl']} in / {entry['osl']} out, greedy; "
        f"GEMM roofline at M={entry['roofline']['m']}: {gflops:.1f} GFLOP/s"
    )
    engines, ratio = entry["engines"], entry["ratio_native_over_transformers"]
    lines = [title, f"  {'metric':<26}{NATIVE:>14}{TRANSFORMERS:>14}{'native/hf':>12}"]
    for label, key, scale in _ROWS:
        cells = [_fmt(engines[e][key] * scale) if e in engines else "-" for e in (NATIVE, TRANSFORMERS)]
        lines.append(f"  {label:<26}{cells[0]:>14}{cells[1]:>14}{_fmt(ratio.get(key)):>12}")
    return lines


def _fmt(value: float | None) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    return f"{value:.3f}" if abs(value) < 10 else f"{value:.1f}"


def _safe_div(a: float, b: float) -> float | None:
    return a / b if b and not math.isnan(a) and not math.isnan(b) else None
