"""`tandem bench serve --structured`: what a grammar costs at serving time. The same load without and with a
`json_schema`, in rounds that alternate which goes first (plain, schema; schema, plain; ...) at each concurrency, so
drift on a shared host cannot favour a side, in one invocation; each round's rows, the ITL p50 ratio of the rounds'
medians, and the workers' mask time per token read from their /metrics. Wires the serve benchmark; no statistics."""

import asyncio
import dataclasses
import logging
import statistics

import httpx
from prometheus_client.parser import text_string_to_metric_families

from tandem.bench.http_client import ServerError
from tandem.bench.serve_report import format_rows, ms
from tandem.bench.serve_stats import ServeSummary

log = logging.getLogger(__name__)
TARGET_RATIO = 1.10  # issue 25: ITL p50 with a json_schema within 1.10x of the same run without
GRAMMAR_COUNTERS = (
    "tandem_worker_grammar_masks",
    "tandem_worker_grammar_mask_seconds",
    "tandem_worker_grammar_wait_seconds",
)


def story_schema(osl: int) -> dict:
    """One string the grammar will not let end within `osl` tokens (no token is 16 characters long), so a
    constrained answer is text all the way, as long as the unconstrained one: each token makes one chunk in both."""
    return {
        "type": "object",
        "additionalProperties": False,
        "required": ["story"],
        "properties": {"story": {"type": "string", "minLength": 16 * osl}},
    }


def with_schema(cfg, schema: dict | None, concurrency: int):
    """`cfg` at `concurrency` (with at least that many requests, so all of them are in flight), every request
    making --osl tokens (ignore_eos) and carrying `schema` (vLLM's structured_outputs) when given."""
    extra = {"ignore_eos": True} | {k: v for k, v in cfg.endpoint.extra_body.items() if k != "structured_outputs"}
    if schema is not None:
        extra["structured_outputs"] = {"json": schema}
    endpoint = dataclasses.replace(cfg.endpoint, extra_body=extra)
    return dataclasses.replace(
        cfg,
        endpoint=endpoint,
        concurrency=concurrency,
        request_rate=None,
        trace=None,
        num_requests=max(cfg.num_requests, concurrency),
    )


def round_order(index: int) -> tuple[bool, bool]:
    """Which side runs first in round `index` (json_schema?): plain first in even rounds, the schema in odd ones."""
    return (False, True) if index % 2 == 0 else (True, False)


async def read_counters(urls: tuple[str, ...]) -> dict[str, float]:
    """The grammar counters summed over the workers' /metrics (absent ones count 0)."""
    totals = dict.fromkeys(GRAMMAR_COUNTERS, 0.0)
    async with httpx.AsyncClient(timeout=10) as http:
        for url in urls:
            try:
                reply = await http.get(url)
                reply.raise_for_status()
            except httpx.HTTPError as exc:
                raise ServerError(f"cannot read the worker metrics at {url}: {exc}") from None
            for family in text_string_to_metric_families(reply.text):
                if family.name in totals:
                    totals[family.name] += sum(s.value for s in family.samples if s.name.endswith("_total"))
    return totals


def mask_costs(before: dict[str, float], after: dict[str, float]) -> dict:
    """Per constrained token: the mask's time on the grammar thread, and the step thread's (starting it, waiting
    for it)."""
    masks, fill, wait = (after[name] - before[name] for name in GRAMMAR_COUNTERS)

    def per(seconds: float) -> float:
        return seconds / masks if masks else float("nan")

    return {"num_masks": int(masks), "mask_s_per_token": per(fill), "wait_s_per_token": per(wait)}


async def run_structured(
    cfg, concurrencies: tuple[int, ...], metrics_urls: tuple[str, ...], run_serve, num_rounds: int = 1
) -> dict:
    """Each concurrency: `num_rounds` rounds of a plain and a json_schema run, alternating which goes first;
    `run_serve` is serve_bench.run_serve."""
    schema, rows = story_schema(cfg.osl), []
    for concurrency in concurrencies:
        for index in range(num_rounds):
            for constrained in round_order(index):
                before = await read_counters(metrics_urls) if metrics_urls else None
                summary, _ = await run_serve(with_schema(cfg, schema if constrained else None, concurrency))
                row = summary_row(summary, concurrency, constrained, index)
                if before is not None:
                    row |= mask_costs(before, await read_counters(metrics_urls))
                rows.append(row)
                log.info(
                    "bench serve --structured: concurrency %d, round %d, json_schema %s: ITL p50 %.2f ms",
                    concurrency,
                    index,
                    constrained,
                    1e3 * summary.itl_s.p50,
                )
    return {
        "benchmark": "serve-structured",
        "schema": schema,
        "num_rounds": num_rounds,
        "rows": rows,
        "ratios": ratios(rows),
        "round_ratios": round_ratios(rows),
        "target_ratio": TARGET_RATIO,
    }


def summary_row(s: ServeSummary, concurrency: int, constrained: bool, index: int = 0) -> dict:
    return {
        "concurrency": concurrency,
        "round": index,
        "json_schema": constrained,
        "num_completed": s.num_completed,
        "num_errors": s.num_errors,
        "num_output_tokens": s.num_output_tokens,
        "itl_p50_s": s.itl_s.p50,
        "itl_p90_s": s.itl_s.p90,
        "mean_itl_p50_s": s.mean_itl_s.p50,
        "ttft_p50_s": s.ttft_s.p50,
        "output_tokens_per_s": s.output_tokens_per_s,
        "first_errors": list(s.first_errors),
    }


def median_p50s(rows: list[dict]) -> dict[tuple[int, bool], float]:
    """(concurrency, json_schema) -> the median over its rounds of the rows' ITL p50."""
    by: dict[tuple[int, bool], list[float]] = {}
    for r in rows:
        by.setdefault((r["concurrency"], r["json_schema"]), []).append(r["itl_p50_s"])
    return {key: statistics.median(values) for key, values in by.items()}


def ratios(rows: list[dict]) -> dict[str, float]:
    """Per concurrency: the rounds' median ITL p50 with the schema over the rounds' median without."""
    by = median_p50s(rows)
    return {str(c): by[(c, True)] / by[(c, False)] for c, constrained in by if constrained and (c, False) in by}


def round_ratios(rows: list[dict]) -> dict[str, list[float]]:
    """Per concurrency: each round's ITL p50 with the schema over the same round's without."""
    by = {(r["concurrency"], r.get("round", 0), r["json_schema"]): r["itl_p50_s"] for r in rows}
    out: dict[str, list[float]] = {}
    for c, index, constrained in by:
        if constrained and (c, index, False) in by:
            out.setdefault(str(c), []).append(by[(c, index, True)] / by[(c, index, False)])
    return out


def format_structured(report: dict) -> str:
    header = (
        "concurrency",
        "round",
        "json_schema",
        "requests",
        "ITL p50 (ms)",
        "ITL p90 (ms)",
        "TPOT p50 (ms)",
        "tok/s",
        "mask µs/token",
        "wait µs/token",
    )
    rows = [
        (
            str(r["concurrency"]),
            str(r.get("round", 0)),
            "yes" if r["json_schema"] else "no",
            str(r["num_completed"]),
            ms(r["itl_p50_s"]),
            ms(r["itl_p90_s"]),
            ms(r["mean_itl_p50_s"]),
            f"{r['output_tokens_per_s']:.1f}",
            _us(r, "mask_s_per_token"),
            _us(r, "wait_s_per_token"),
        )
        for r in report["rows"]
    ]
    each = report.get("round_ratios", {})
    verdicts = [
        f"concurrency {c}: ITL p50 ratio {v:.3f} ({'meets' if v <= TARGET_RATIO else 'misses'} "
        f"<= {TARGET_RATIO})" + (f"; per round {', '.join(f'{x:.3f}' for x in each[c])}" if c in each else "")
        for c, v in report["ratios"].items()
    ]
    return "\n".join([format_rows(header, rows), "", *verdicts])


def _us(row: dict, key: str) -> str:
    value = row.get(key)
    return "-" if value is None or value != value else f"{value * 1e6:.1f}"


def run_structured_sync(
    cfg, concurrencies: tuple[int, ...], metrics_urls: tuple[str, ...], run_serve, num_rounds: int = 1
) -> dict:
    return asyncio.run(run_structured(cfg, concurrencies, metrics_urls, run_serve, num_rounds))
