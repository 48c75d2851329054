"""One policy's simulated run summarised: TTFT, ITL, end-to-end latency, prefix hit rate, goodput under SLOs,
per-worker load. Pure: numbers in, a dict out."""

from dataclasses import dataclass

import numpy as np

from tandem.cluster.des import ClusterSim, RequestRecord

DEFAULT_SLO_TTFT_S, DEFAULT_SLO_ITL_S = 2.0, 0.1


@dataclass(frozen=True, slots=True)
class Slo:
    ttft_s: float = DEFAULT_SLO_TTFT_S
    itl_s: float = DEFAULT_SLO_ITL_S  # per request: (last token - first token) / (output tokens - 1)


def _dist(values: np.ndarray, prefix: str) -> dict[str, float]:
    if values.size == 0:
        return {f"{prefix}_{k}": float("nan") for k in ("mean_s", "p50_s", "p90_s", "p99_s")}
    p50, p90, p99 = np.percentile(values, [50, 90, 99])
    return {
        f"{prefix}_mean_s": float(values.mean()),
        f"{prefix}_p50_s": float(p50),
        f"{prefix}_p90_s": float(p90),
        f"{prefix}_p99_s": float(p99),
    }


def request_itls(records: list[RequestRecord]) -> np.ndarray:
    return np.array(
        [(r.finish_s - r.first_token_s) / (r.num_output_tokens - 1) for r in records if r.num_output_tokens > 1],
        dtype=np.float64,
    )


def summarize(sim: ClusterSim, records: list[RequestRecord], slo: Slo, wall_s: float) -> dict:
    """The policy's entry of the JSON report (the `ttft_*` arrays feed the CDF plot, then are dropped)."""
    done = [r for r in records if r.finish_s >= 0]
    ttft = np.array([r.first_token_s - r.arrival_s for r in done], dtype=np.float64)
    e2e = np.array([r.finish_s - r.arrival_s for r in done], dtype=np.float64)
    itl_by_req = {
        r.req_id: (r.finish_s - r.first_token_s) / (r.num_output_tokens - 1) for r in done if r.num_output_tokens > 1
    }
    good = sum(1 for r, t in zip(done, ttft) if t <= slo.ttft_s and itl_by_req.get(r.req_id, 0.0) <= slo.itl_s)
    start = min((r.arrival_s for r in records), default=0.0)
    makespan = max((r.finish_s for r in done), default=start) - start
    prompt = sum(r.num_prompt_tokens for r in done)
    return {
        "num_requests": len(records),
        "num_finished": len(done),
        **_dist(ttft, "ttft"),
        **_dist(request_itls(done), "itl"),
        **_dist(e2e, "e2e"),
        "prefix_hit_rate": sum(r.num_cached_tokens for r in done) / prompt if prompt else 0.0,
        "goodput_rps": good / makespan if makespan > 0 else 0.0,
        "slo_attainment": good / len(done) if done else 0.0,
        "throughput_rps": len(done) / makespan if makespan > 0 else 0.0,
        "makespan_s": makespan,
        "sim_wall_s": wall_s,
        "num_preemptions": sum(w.scheduler.num_preemptions for w in sim.workers.values()),
        **tier_summary(sim),
        **worker_load(sim, makespan),
        "ttft_values_s": ttft.tolist(),
    }


def tier_summary(sim: ClusterSim) -> dict:
    """Prompt tokens served from each KV tier over prompt tokens looked up (the engines' own counts, so the three
    add up to their hit rate), and the KV bytes onboarded from the host and disk tiers."""
    stats = [w.core.stats() for w in sim.workers.values()]
    queries = sum(s.prefix_queries for s in stats)
    host, disk = sum(s.prefix_hits_host for s in stats), sum(s.prefix_hits_disk for s in stats)
    device = sum(s.prefix_hits for s in stats) - host - disk
    onboarded = {
        "host": sum(s.num_blocks_onboarded_host * s.kv_block_bytes for s in stats),
        "disk": sum(s.num_blocks_onboarded_disk * s.kv_block_bytes for s in stats),
    }
    return {
        "prefix_hit_rate_by_tier": {
            t: n / queries if queries else 0.0 for t, n in (("device", device), ("host", host), ("disk", disk))
        },
        "kv_bytes_onboarded": sum(onboarded.values()),
        "kv_bytes_onboarded_by_tier": onboarded,
    }


def worker_load(sim: ClusterSim, makespan: float) -> dict:
    """Per worker: requests routed, busy fraction, generated tokens; spread = max / mean across workers."""
    per_worker = {
        w: {
            "num_requests": sim.num_routed.get(w, 0),
            "busy_fraction": worker.busy_s / makespan if makespan > 0 else 0.0,
            "num_generated_tokens": worker.num_generated_tokens,
        }
        for w, worker in sim.workers.items()
    }
    spread = {}
    for key in ("num_requests", "busy_fraction", "num_generated_tokens"):
        values = np.array([v[key] for v in per_worker.values()], dtype=np.float64)
        mean = values.mean() if values.size else 0.0
        spread[key] = float(values.max() / mean) if mean > 0 else 0.0
    return {"load_per_worker": per_worker, "load_spread_max_over_mean": spread}
