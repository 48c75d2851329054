"""llm-d's precise-prefix benchmark replayed in tandem's simulator: its published shape (8 pods, 150 tenants x a
6k-token context, 5 users each with 1.2k-token queries, QPS stages 3 to 60, KV demand ~73% of the cluster) through
the kv policy, a load-only policy and random; output tok/s and TTFT p90 per QPS beside llm-d's figures.

    python bench/llmd_precise_prefix.py --json bench/results/llmd_precise_prefix.json
"""
import argparse
import datetime
import json
import math
import multiprocessing
import platform
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from engines.sim.profile import TimingProfile, load_profile  # noqa: E402
from tandem.bench.trace_gen import PrefixShape, precise_prefix  # noqa: E402
from tandem.sim.des import ClusterSim, SimConfig  # noqa: E402

# llm-d.ai, "KV-cache wins you can see" (see /work/shared ANCHORS): precise / approximate / random scheduling
LLMD = {"precise": {"output_tok_s": 8730.0, "ttft_p90_s": 0.54}, "approximate": {"output_tok_s": 6944.0,
        "ttft_p90_s": 31.1}, "random": {"output_tok_s": 4429.0, "ttft_p90_s": 92.6}}
POLICIES = {"kv": "precise", "least_loaded": "approximate", "random": "random"}  # tandem's policy: llm-d's column


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    shape = PrefixShape(num_tenants=args.tenants, qps=args.qps, stage_s=args.stage_s,
                        output_tokens=args.output_tokens)
    rows = precise_prefix(args.seed, shape)
    profile = sized_profile(load_profile(args.profile), shape, args.workers, args.kv_demand)
    with ProcessPoolExecutor(max(args.jobs, 1), multiprocessing.get_context("fork")) as pool:
        futures = {p: pool.submit(replay, profile, rows, shape, args.workers, args.seed, p) for p in args.policies}
        results = {policy: future.result() for policy, future in futures.items()}
    for policy, res in results.items():
        print(f"{policy}: simulated in {res['sim_wall_s']:.0f} s", flush=True)
    ratios = compare(results)
    print(format_table(results, shape, ratios))
    if args.json:
        write(args, shape, profile, len(rows), results, ratios)
    return 0


def replay(profile: TimingProfile, rows, shape: PrefixShape, workers: int, seed: int, policy: str) -> dict:
    start = time.perf_counter()
    records = ClusterSim(profile, SimConfig(workers, 0, seed), policy).run(rows)
    return summarize(records, shape, time.perf_counter() - start)


def parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--qps", type=lambda s: tuple(float(q) for q in s.split(",")), default=PrefixShape().qps)
    p.add_argument("--stage-s", type=float, default=PrefixShape().stage_s)
    p.add_argument("--tenants", type=int, default=PrefixShape().num_tenants)
    p.add_argument("--output-tokens", type=int, default=PrefixShape().output_tokens)
    p.add_argument("--workers", type=int, default=8, help="pods")
    p.add_argument("--kv-demand", type=float, default=0.73, help="the tenants' contexts over the cluster's KV")
    p.add_argument("--profile", default="h100-native-llama3.1-8b-bf16")
    p.add_argument("--policies", type=lambda s: s.split(","), default=list(POLICIES))
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--jobs", type=int, default=1, help="replay the policies in this many processes")
    p.add_argument("--json", type=Path, default=None, help="also write the report and a PNG beside it")
    return p.parse_args(argv)


def sized_profile(profile: TimingProfile, shape: PrefixShape, workers: int, demand: float) -> TimingProfile:
    """The profile with each worker's KV cut so that the tenants' contexts fill `demand` of the cluster's."""
    tokens = shape.context_demand_tokens() / demand / workers
    num_blocks = math.ceil(tokens / profile.block_size)
    return TimingProfile.from_dict({**profile.to_dict(), "num_blocks": num_blocks})


def summarize(records, shape: PrefixShape, wall_s: float) -> dict:
    """Per QPS stage (by arrival): output tok/s from the stage's start to its last request's finish, TTFT p90;
    and the same over the whole run."""
    stages = []
    for k, qps in enumerate(shape.qps):
        start = k * shape.stage_s
        group = [r for r in records if start <= r.arrival_s < start + shape.stage_s]
        stages.append({"qps": qps, **_figures(group, start)})
    return {"stages": stages, "overall": _figures(records, 0.0), "sim_wall_s": wall_s}


def _figures(group, start: float) -> dict:
    done = [r for r in group if r.finish_s >= 0]
    if not done:
        return {"num_requests": len(group), "output_tok_s": 0.0, "ttft_p90_s": float("nan"), "prefix_hit_rate": 0.0}
    end = max(r.finish_s for r in done)
    ttft = np.array([r.first_token_s - r.arrival_s for r in done])
    return {"num_requests": len(group), "output_tok_s": sum(r.num_output_tokens for r in done) / (end - start),
            "ttft_p90_s": float(np.quantile(ttft, 0.9)),
            "prefix_hit_rate": sum(r.num_cached_tokens for r in done) / sum(r.num_prompt_tokens for r in done)}


def compare(results: dict) -> dict:
    """kv over random on both figures (throughput up, TTFT p90 down), tandem's beside llm-d's."""
    out = {"llmd": {"tok_s_ratio": LLMD["precise"]["output_tok_s"] / LLMD["random"]["output_tok_s"],
                    "ttft_p90_ratio": LLMD["random"]["ttft_p90_s"] / LLMD["precise"]["ttft_p90_s"]}}
    if "kv" in results and "random" in results:
        kv, rnd = results["kv"]["overall"], results["random"]["overall"]
        out["tandem"] = {"tok_s_ratio": kv["output_tok_s"] / rnd["output_tok_s"],
                         "ttft_p90_ratio": rnd["ttft_p90_s"] / kv["ttft_p90_s"]}
        out["tandem_at_least_llmd"] = {k: out["tandem"][k] >= out["llmd"][k] for k in out["llmd"]}
    return out


def format_table(results: dict, shape: PrefixShape, ratios: dict) -> str:
    names = list(results)
    lines = [f"{'QPS':>6}" + "".join(f"{n + ' tok/s':>20}{n + ' TTFT p90':>20}" for n in names)]
    for k, qps in enumerate(shape.qps):
        cells = [(results[n]["stages"][k]["output_tok_s"], results[n]["stages"][k]["ttft_p90_s"]) for n in names]
        lines.append(f"{qps:>6g}" + "".join(f"{t:>20,.0f}{p:>19.2f}s" for t, p in cells))
    cells = [(results[n]["overall"]["output_tok_s"], results[n]["overall"]["ttft_p90_s"]) for n in names]
    lines.append(f"{'all':>6}" + "".join(f"{t:>20,.0f}{p:>19.2f}s" for t, p in cells))
    lines.append("llm-d published (precise / approximate / random): " + " / ".join(
        f"{v['output_tok_s']:,.0f} tok/s, TTFT p90 {v['ttft_p90_s']} s" for v in LLMD.values()))
    for who in ("tandem", "llmd"):
        if who in ratios:
            r = ratios[who]
            lines.append(f"{who}: kv/random output tok/s {r['tok_s_ratio']:.2f}x; random/kv TTFT p90 "
                         f"{r['ttft_p90_ratio']:.1f}x")
    return "\n".join(lines)


def write(args, shape: PrefixShape, profile: TimingProfile, num_rows: int, results: dict, ratios: dict) -> None:
    doc = {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
           "machine": f"{platform.node()} {platform.machine()} python {platform.python_version()}",
           "shape": {"tenants": shape.num_tenants, "users_per_tenant": shape.users_per_tenant,
                     "context_tokens": shape.context_tokens, "query_tokens": shape.query_tokens,
                     "output_tokens": shape.output_tokens, "qps": list(shape.qps), "stage_s": shape.stage_s},
           "workers": args.workers, "kv_demand": args.kv_demand, "num_requests": num_rows, "seed": args.seed,
           "profile": profile.name, "num_blocks_per_worker": profile.num_blocks, "block_size": profile.block_size,
           "heartbeat_interval_s": SimConfig(1).heartbeat_interval_s, "llmd_published": LLMD, "results": results,
           "ratios": ratios}
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(doc, indent=1, default=lambda x: None) + "\n")
    print(f"wrote {args.json}")
    print(f"wrote {plot(args.json.with_suffix('.png'), results, shape)}")


def plot(path: Path, results: dict, shape: PrefixShape) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (tok, ttft) = plt.subplots(1, 2, figsize=(11, 4.2))
    for name, res in results.items():
        tok.plot(shape.qps, [s["output_tok_s"] for s in res["stages"]], marker="o", label=f"tandem {name}")
        ttft.plot(shape.qps, [s["ttft_p90_s"] for s in res["stages"]], marker="o", label=f"tandem {name}")
    for (label, v), color in zip(LLMD.items(), ("C0", "C1", "C2")):
        tok.axhline(v["output_tok_s"], ls=":", color=color, label=f"llm-d {label} (published)")
        ttft.axhline(v["ttft_p90_s"], ls=":", color=color, label=f"llm-d {label} (published)")
    tok.set(xlabel="QPS stage", ylabel="output tokens / s", title="throughput per QPS stage")
    ttft.set(xlabel="QPS stage", ylabel="TTFT p90 (s)", yscale="log", title="TTFT p90 per QPS stage")
    for ax in (tok, ttft):
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


if __name__ == "__main__":
    raise SystemExit(main())
