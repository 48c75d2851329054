"""The host KV tier in the cluster simulator against its anchor, the same run without tiers: one trace, one profile,
one policy, side by side in one invocation. Prints a table, writes JSON.

    .venv/bin/python bench/kv_tiers_sim.py --json bench/results/sim/kv_tiers_mooncake_8w.json

The third column bounds what any tier can do: a device pool no trace fills, decode steps still priced as at the
real pool's occupancy (the timing model prices a decode step by the fraction of the pool in use). The row "hit rate,
routing's reach" replays each run's routing into caches that never evict (every block a worker was sent stays
there): what that run's routing allowed at most, whatever the capacity, so that a hit rate short of the bound's is
told apart from capacity (tiers) and from where the router sent the requests.

Targets (issue 17): prefix hit rate >= 0.25 and mean TTFT <= 0.8x the run without a host tier, on the Mooncake
conversation trace, 8 workers, time scale 0.5, 7,000 blocks of 64 tokens per worker, a 256 GB host tier.
"""

import argparse
import datetime
import json
import platform
import sys
import time
from dataclasses import replace
from pathlib import Path

from engines.base.block_hash import chain_block_hashes
from engines.timing.profile import load_profile
from tandem.bench.jsonsafe import json_safe
from tandem.bench.traces import load_trace
from tandem.cluster.des import ClusterSim, SimConfig
from tandem.cluster.metrics import DEFAULT_SLO_ITL_S, DEFAULT_SLO_TTFT_S, Slo, summarize
from tandem.cluster.tokens import prompt_tokens

TRACE = Path(__file__).resolve().parent / "traces" / "mooncake_conversation_trace.jsonl"  # vendored in bench/traces/
UNLIMITED_BLOCKS = 400_000  # 25.6M tokens a worker: more than the trace sends any one
_KEYS = ("ttft_mean_s", "ttft_p50_s", "ttft_p99_s", "prefix_hit_rate", "goodput_rps", "sim_wall_s")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--trace", type=Path, default=TRACE)
    p.add_argument("--workers", type=int, default=8)
    p.add_argument("--time-scale", type=float, default=0.5)
    p.add_argument("--num-blocks", type=int, default=7000, help="device blocks of the profile's 64 tokens per worker")
    p.add_argument("--kv-host-gb", type=float, default=256.0)
    p.add_argument("--kv-disk-gb", type=float, default=0.0)
    p.add_argument("--policy", default="kv")
    p.add_argument("--kv-overlap-weight", type=float, default=1.0, help="the kv policy's overlap_weight")
    p.add_argument("--kv-inflight-weight", type=float, default=0.1, help="the kv policy's inflight_weight")
    p.add_argument("--max-requests", type=int, default=None)
    p.add_argument("--json", type=Path, default=None)
    args = p.parse_args(argv)
    profile = replace(load_profile(), num_blocks=args.num_blocks)
    rows = load_trace(args.trace, args.max_requests, args.time_scale)
    slo = Slo(DEFAULT_SLO_TTFT_S, DEFAULT_SLO_ITL_S)
    base = SimConfig(args.workers, kv_overlap_weight=args.kv_overlap_weight, kv_inflight_weight=args.kv_inflight_weight)
    runs = {
        "device only": simulate(profile, base, args.policy, rows, slo),
        f"+ host {args.kv_host_gb:g} GB": simulate(
            profile, replace(base, kv_host_gb=args.kv_host_gb, kv_disk_gb=args.kv_disk_gb), args.policy, rows, slo
        ),
        "device unlimited": simulate(unlimited(profile), base, args.policy, rows, slo),
    }
    anchor, tiered, bound = runs.values()
    ratio = tiered["ttft_mean_s"] / anchor["ttft_mean_s"]
    print(_table(runs))
    print(f"\nmean TTFT ratio (tiers / device only): {ratio:.3f}  (target <= 0.8)")
    print(
        f"bound (device unlimited, decode cost as at {args.num_blocks} blocks): mean TTFT ratio "
        f"{bound['ttft_mean_s'] / anchor['ttft_mean_s']:.3f}, hit rate {bound['prefix_hit_rate']:.3f}"
    )
    print(f"prefix hit rate with tiers: {tiered['prefix_hit_rate']:.3f}  (target >= 0.25)")
    if args.json:
        header = {
            "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
            "machine": f"{platform.node()} {platform.machine()} python {platform.python_version()}",
            "command": " ".join(sys.argv),
            "trace": str(args.trace),
            "num_requests": len(rows),
            "time_scale": args.time_scale,
            "num_workers": args.workers,
            "policy": args.policy,
            "kv_overlap_weight": args.kv_overlap_weight,
            "kv_inflight_weight": args.kv_inflight_weight,
            "profile": profile.to_dict(),
            "ttft_mean_ratio": ratio,
        }
        body = {n: {k: v for k, v in r.items() if k != "ttft_values_s"} for n, r in runs.items()}
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(json_safe({**header, "runs": body}), indent=2) + "\n")
        print(f"wrote {args.json}")
    return 0


def simulate(profile, config: SimConfig, policy: str, rows, slo: Slo) -> dict:
    """One run's summary (as `tandem sim` reports it), with its routing's reach."""
    start = time.perf_counter()
    sim = ClusterSim(profile, config, policy)
    records = sim.run(rows)
    summary = summarize(sim, records, slo, time.perf_counter() - start)
    summary["routing_reach"] = routing_reach(rows, [r.worker_id for r in records], profile.block_size)
    return summary


def routing_reach(rows, worker_ids: list[str], block_size: int) -> float:
    """The prefix hit rate had every worker kept every block of every prompt sent to it (in arrival order):
    the most this routing allows, at any capacity. Counts as the engine does: the last prompt token is computed."""
    held: dict[str, set[int]] = {}
    hits = total = 0
    for i, (row, worker_id) in enumerate(zip(rows, worker_ids)):
        tokens = prompt_tokens(row, i)
        hashes = chain_block_hashes(tokens, block_size)
        cache = held.setdefault(worker_id, set())
        n = next(
            (k for k, h in enumerate(hashes[: (len(tokens) - 1) // block_size]) if h not in cache),
            (len(tokens) - 1) // block_size,
        )
        hits, total = hits + n * block_size, total + len(tokens)
        cache.update(hashes)
    return hits / total if total else 0.0


def unlimited(profile):
    """The profile with a device pool no trace fills, its decode step still costed as the real pool's: the timing
    model prices a decode step by the fraction of the pool in use, so a huge pool alone would make decode cheap."""
    scale = UNLIMITED_BLOCKS / profile.num_blocks
    a, b, c = profile.decode_ms_coeffs
    return replace(profile, num_blocks=UNLIMITED_BLOCKS, decode_ms_coeffs=(a * scale * scale, b * scale, c))


def _table(runs: dict[str, dict]) -> str:
    names = list(runs)
    lines = [f"{'':<22}" + "".join(f"{n:>18}" for n in names)]
    keys = _KEYS + ("itl_mean_s", "num_preemptions")
    lines += [f"{k:<22}" + "".join(f"{runs[n][k]:>18.3f}" for n in names) for k in keys]
    for tier in ("device", "host", "disk"):
        lines.append(
            f"{'hit rate ' + tier:<22}" + "".join(f"{runs[n]['prefix_hit_rate_by_tier'][tier]:>18.3f}" for n in names)
        )
    lines.append(f"{'hit rate, routing reach':<22}" + "".join(f"{runs[n]['routing_reach']:>18.3f}" for n in names))
    lines.append(f"{'KV onboarded (GB)':<22}" + "".join(f"{runs[n]['kv_bytes_onboarded'] / 1e9:>18.1f}" for n in names))
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
