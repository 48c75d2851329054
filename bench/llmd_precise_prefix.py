"""llm-d's precise-prefix benchmark replayed in tandem's simulator: its published shape and load (8 pods of
Qwen3-32B on 2 x H100, 307,328 KV tokens each; 150 tenants x a 6k-token context, 5 users each with a 1.2k-token
question of their own; a 15 QPS warm-up, then stages from 3 to 60 QPS) through the kv policy, a load-only policy and
random; output tok/s and TTFT p90 per QPS beside llm-d's published figures.

    python bench/llmd_precise_prefix.py --jobs 3 --json bench/results/llmd_precise_prefix.json
"""

import argparse
import datetime
import json
import multiprocessing
import platform
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from engines.base.block_hash import num_blocks_for  # noqa: E402
from engines.timing.profile import TimingProfile, load_profile  # noqa: E402
from tandem.bench.trace_gen import PrefixShape, precise_prefix  # noqa: E402
from tandem.cluster.des import ClusterSim, SimConfig  # noqa: E402

# llm-d.ai, "KV-cache wins you can see", and its inference-perf report: whole run, then per QPS stage
# (output tok/s, TTFT p90 s). Their "load" scheduler (queue + KV-usage scorers) is the load-only one.
LLMD = {
    "precise": {"output_tok_s": 8730.0, "ttft_p90_s": 0.542},
    "approximate": {"output_tok_s": 6944.4, "ttft_p90_s": 31.083},
    "load": {"output_tok_s": 4266.4, "ttft_p90_s": 94.865},
    "random": {"output_tok_s": 4428.7, "ttft_p90_s": 92.551},
}
_QPS = (3, 10, 15, 20, 22, 25, 30, 35, 40, 43, 46, 49, 52, 55, 57, 60)
LLMD_STAGES = {
    name: dict(zip(_QPS, rows))
    for name, rows in {
        "precise": (
            (1219.1, 0.498),
            (3902.1, 0.600),
            (5761.1, 0.400),
            (9184.5, 0.600),
            (9382.0, 0.500),
            (9242.2, 0.583),
            (9221.8, 0.509),
            (9780.6, 0.500),
            (10270.8, 0.488),
            (10054.8, 0.500),
            (10128.7, 0.589),
            (10296.5, 0.600),
            (10284.6, 0.507),
            (10140.9, 0.600),
            (10313.9, 0.600),
            (10496.9, 0.500),
        ),
        "approximate": (
            (1310.9, 0.497),
            (3842.4, 0.499),
            (5152.9, 0.400),
            (8082.6, 0.600),
            (8415.7, 0.700),
            (8445.1, 0.609),
            (8435.9, 0.708),
            (7443.5, 2.459),
            (8045.9, 43.018),
            (7969.6, 43.515),
            (7695.2, 44.930),
            (7455.9, 46.335),
            (7452.3, 47.284),
            (7100.7, 50.108),
            (7013.8, 49.930),
            (7247.9, 50.226),
        ),
        "random": (
            (1314.0, 0.820),
            (3568.5, 1.398),
            (3791.1, 2.299),
            (4933.1, 70.273),
            (4765.4, 78.420),
            (4781.3, 82.943),
            (4636.3, 86.182),
            (4332.6, 91.519),
            (4773.8, 101.272),
            (4844.6, 101.142),
            (4969.5, 101.265),
            (4783.2, 103.514),
            (4845.1, 105.004),
            (4921.7, 104.321),
            (4764.2, 106.816),
            (4835.2, 105.988),
        ),
    }.items()
}
POLICIES = {"kv": "precise", "kv-approx": "approximate", "least_loaded": "load", "random": "random"}
LLMD_KV_TOKENS_PER_POD = 307_328  # their config: 8 x 307,328; 150 x 12,000 resident tokens = 73.2% of it
# Qwen3-32B (32.8B parameters) on two H100s against an 8B model on one: per GPU, 2.05x the FLOPs per token and 2.05x
# the weight bytes per decode step; the KV bytes per token per GPU are equal (64 layers x 8 KV heads over 2 GPUs
# against 32 x 8 on one), so the part of a decode step that reads KV stays as it is
QWEN32B_TP2_OVER_8B = 32.8 / 8.0 / 2
# the decode step's KV-reading part (the base's u-terms), scaled so that a pod's step at llm-d's mean KV use (59%)
# is llm-d's published ITL mean at 60 QPS (29 ms): (29 - 5.74 x 2.05) / (54.01 x 0.59 - 25.74 x 0.59^2) = 0.75.
# Conservative: their ITL mean includes the steps that also prefill.
LLMD_KV_READ_FACTOR = 0.75


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    kw = {"num_tenants": args.tenants, "output_tokens": args.output_tokens}
    shape = PrefixShape.uniform(args.qps, args.stage_s, **kw) if args.qps else PrefixShape(**kw)
    rows = precise_prefix(args.seed, shape)
    profile = pod_profile(load_profile(args.profile), args.compute_factor, args.kv_tokens, args.kv_read_factor)
    print(calibration(profile, shape), flush=True)
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
    p.add_argument(
        "--qps",
        type=lambda s: tuple(float(q) for q in s.split(",")),
        default=None,
        help="uniform stages of --stage-s each, no warm-up (default: llm-d's published stages)",
    )
    p.add_argument("--stage-s", type=float, default=60.0)
    p.add_argument("--tenants", type=int, default=PrefixShape().num_tenants)
    p.add_argument("--output-tokens", type=int, default=PrefixShape().output_tokens)
    p.add_argument("--workers", type=int, default=8, help="pods")
    p.add_argument("--kv-tokens", type=int, default=LLMD_KV_TOKENS_PER_POD, help="KV capacity per pod, in tokens")
    p.add_argument("--profile", default="h100-llama3.1-8b", help="the per-GPU base profile (8B on one H100)")
    p.add_argument(
        "--compute-factor",
        type=float,
        default=QWEN32B_TP2_OVER_8B,
        help="a pod's prefill and weights-pass time over the base profile's",
    )
    p.add_argument(
        "--kv-read-factor",
        type=float,
        default=LLMD_KV_READ_FACTOR,
        help="the decode step's KV-reading part over the base profile's (1: as the base has it)",
    )
    p.add_argument("--policies", type=lambda s: s.split(","), default=list(POLICIES))
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--jobs", type=int, default=1, help="replay the policies in this many processes")
    p.add_argument("--json", type=Path, default=None, help="also write the report and a PNG beside it")
    return p.parse_args(argv)


def pod_profile(base: TimingProfile, factor: float, kv_tokens: int, kv_read_factor: float = 1.0) -> TimingProfile:
    """The base profile as one pod: prefill and the decode step's weights pass `factor` times as long, the
    decode step's KV-reading part `kv_read_factor` times, and `kv_tokens` of KV."""
    if base.prefill_ms_points or base.decode_ms_points:
        raise SystemExit(f"profile {base.name!r} carries measured tables; give a coefficient profile")
    a, b, c = base.prefill_ms_coeffs
    da, db, dc = base.decode_ms_coeffs
    return TimingProfile.from_dict(
        {
            **base.to_dict(),
            "name": f"{base.name} x{factor:.3g} compute, {kv_tokens} KV tokens",
            "num_blocks": num_blocks_for(kv_tokens, base.block_size),
            "prefill_ms_coeffs": (a * factor, b * factor, c * factor),
            "decode_ms_coeffs": (da * kv_read_factor, db * kv_read_factor, dc * factor),
            "min_step_ms": base.min_step_ms * factor,
        }
    )


def calibration(profile: TimingProfile, shape: PrefixShape) -> str:
    """The modelled pod beside what llm-d measured on theirs."""
    isl = shape.context_tokens + shape.query_tokens
    return (
        f"pod model: prefill of a whole {isl}-token prompt {profile.prefill_s(isl):.2f} s (llm-d, random at "
        f"3 QPS: TTFT mean 0.62 s); decode step {profile.decode_s(0.1) * 1e3:.0f} ms at 10% of the KV active, "
        f"{profile.decode_s(0.6) * 1e3:.0f} ms at 60% (llm-d: ITL mean 11 ms at 3 QPS, 29 ms at 60 QPS, "
        f"KV 59% used on average); KV {profile.kv_capacity_tokens:,} tokens per pod, the residents "
        f"{shape.resident_tokens():,} tokens = {shape.resident_tokens() / 8 / profile.kv_capacity_tokens:.1%} "
        "of 8 pods"
    )


def summarize(records, shape: PrefixShape, wall_s: float) -> dict:
    """Per stage: the output tokens the cluster produced during the stage over its length (a request's tokens
    spread evenly from its first token to its finish), and the TTFT p90 of the requests that arrived in it. "ladder"
    is llm-d's summary: the mean of the ladder stages' tok/s (it gives their 8,730.0 / 6,944.4 / 4,428.7 exactly) and
    the TTFT p90 of every ladder request; "overall": all output over the time to the last finish."""
    stages, starts = [], shape.stage_starts()
    first, finish = (np.array([getattr(r, f) for r in records]) for f in ("first_token_s", "finish_s"))
    arrival = np.array([r.arrival_s for r in records])
    tokens = np.array([r.num_output_tokens for r in records], dtype=np.float64)
    for k, (qps, seconds) in enumerate(shape.stages):
        group = [r for r in records if starts[k] <= r.arrival_s < starts[k + 1]]
        produced = _produced(first, finish, tokens, starts[k], starts[k + 1])
        stages.append(
            {
                "qps": qps,
                "warmup": k < shape.num_warmup_stages,
                **_figures(group, starts[k]),
                "window_tok_s": produced / seconds,
            }
        )
    ladder = stages[shape.num_warmup_stages :]
    in_ladder = arrival >= starts[shape.num_warmup_stages]
    ttft = (first - arrival)[in_ladder & (first >= 0)]
    return {
        "stages": stages,
        "overall": _figures(records, 0.0),
        "sim_wall_s": wall_s,
        "ladder": {
            "output_tok_s": float(np.mean([s["window_tok_s"] for s in ladder])),
            "ttft_p90_s": float(np.quantile(ttft, 0.9)) if ttft.size else float("nan"),
        },
    }


def _produced(first: np.ndarray, finish: np.ndarray, tokens: np.ndarray, start: float, end: float) -> float:
    """Output tokens produced in [start, end): each request's spread evenly over [first token, finish]."""
    done = finish >= 0
    first, finish, tokens = first[done], finish[done], tokens[done]
    span = finish - first
    overlap = np.clip(np.minimum(finish, end) - np.maximum(first, start), 0.0, None)
    share = np.where(span > 0, overlap / np.where(span > 0, span, 1.0), (first >= start) & (first < end))
    return float((tokens * share).sum())


def _figures(group, start: float) -> dict:
    done = [r for r in group if r.finish_s >= 0]
    if not done:
        return {"num_requests": len(group), "output_tok_s": 0.0, "ttft_p90_s": float("nan"), "prefix_hit_rate": 0.0}
    end = max(r.finish_s for r in done)
    ttft = np.array([r.first_token_s - r.arrival_s for r in done])
    return {
        "num_requests": len(group),
        "output_tok_s": sum(r.num_output_tokens for r in done) / (end - start),
        "ttft_p90_s": float(np.quantile(ttft, 0.9)),
        "ttft_mean_s": float(ttft.mean()),
        "prefix_hit_rate": sum(r.num_cached_tokens for r in done) / sum(r.num_prompt_tokens for r in done),
    }


def compare(results: dict) -> dict:
    """kv over random on both figures (throughput up, TTFT p90 down), as llm-d summarises them, beside llm-d's."""
    out = {
        "llmd": {
            "tok_s_ratio": LLMD["precise"]["output_tok_s"] / LLMD["random"]["output_tok_s"],
            "ttft_p90_ratio": LLMD["random"]["ttft_p90_s"] / LLMD["precise"]["ttft_p90_s"],
        }
    }
    if "kv" in results and "random" in results:
        kv, rnd = results["kv"]["ladder"], results["random"]["ladder"]
        out["tandem"] = {
            "tok_s_ratio": kv["output_tok_s"] / rnd["output_tok_s"],
            "ttft_p90_ratio": rnd["ttft_p90_s"] / kv["ttft_p90_s"],
        }
        out["tandem_at_least_llmd"] = {k: out["tandem"][k] >= out["llmd"][k] for k in out["llmd"]}
    return out


def format_table(results: dict, shape: PrefixShape, ratios: dict) -> str:
    names = list(results)
    lines = [
        f"{'QPS':>8}"
        + "".join(f"{n + ' tok/s':>20}{n + ' p90':>16}" for n in names)
        + "   llm-d precise / approximate / random (tok/s, p90 s)"
    ]
    for k, qps in enumerate(shape.qps):
        cells = [(results[n]["stages"][k]["window_tok_s"], results[n]["stages"][k]["ttft_p90_s"]) for n in names]
        label = f"{qps:g}" + ("w" if k < shape.num_warmup_stages else "")
        published = [LLMD_STAGES[p].get(qps) for p in ("precise", "approximate", "random")]
        theirs = (
            ""
            if k < shape.num_warmup_stages or None in published
            else "   " + " / ".join(f"{t:,.0f}, {q:.2f}" for t, q in published)
        )
        lines.append(f"{label:>8}" + "".join(f"{t:>20,.0f}{p:>15.2f}s" for t, p in cells) + theirs)
    cells = [(results[n]["ladder"]["output_tok_s"], results[n]["ladder"]["ttft_p90_s"]) for n in names]
    lines.append(
        f"{'summary':>8}"
        + "".join(f"{t:>20,.0f}{p:>15.2f}s" for t, p in cells)
        + "   "
        + " / ".join(
            f"{LLMD[p]['output_tok_s']:,.0f}, {LLMD[p]['ttft_p90_s']:.2f}" for p in ("precise", "approximate", "random")
        )
    )
    lines.append(
        "(w: warm-up stage)  prefix hit rate: "
        + ", ".join(f"{n} {results[n]['overall']['prefix_hit_rate']:.1%}" for n in names)
    )
    for who in ("tandem", "llmd"):
        if who in ratios:
            r = ratios[who]
            lines.append(
                f"{who}: kv/random output tok/s {r['tok_s_ratio']:.2f}x; random/kv TTFT p90 {r['ttft_p90_ratio']:.1f}x"
            )
    return "\n".join(lines)


def write(args, shape: PrefixShape, profile: TimingProfile, num_rows: int, results: dict, ratios: dict) -> None:
    doc = {
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "machine": f"{platform.node()} {platform.machine()} python {platform.python_version()}",
        "command": "python bench/llmd_precise_prefix.py " + " ".join(sys.argv[1:]),
        "shape": {
            "tenants": shape.num_tenants,
            "users_per_tenant": shape.users_per_tenant,
            "context_tokens": shape.context_tokens,
            "query_tokens": shape.query_tokens,
            "output_tokens": shape.output_tokens,
            "stages": [list(s) for s in shape.stages],
            "num_warmup_stages": shape.num_warmup_stages,
            "resident_tokens": shape.resident_tokens(),
        },
        "workers": args.workers,
        "num_requests": num_rows,
        "seed": args.seed,
        "profile": profile.to_dict(),
        "calibration": calibration(profile, shape),
        "heartbeat_interval_s": SimConfig(1).heartbeat_interval_s,
        "policies_as_llmd": POLICIES,
        "llmd_published": {"overall": LLMD, "stages": LLMD_STAGES},
        "results": results,
        "ratios": ratios,
    }
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(doc, indent=1, default=lambda x: None) + "\n")
    print(f"wrote {args.json}")
    print(f"wrote {plot(args.json.with_suffix('.png'), results, shape)}")


def plot(path: Path, results: dict, shape: PrefixShape) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (tok, ttft) = plt.subplots(1, 2, figsize=(12, 4.6))
    ladder = range(shape.num_warmup_stages, len(shape.stages))
    qps = [shape.qps[k] for k in ladder]
    colors = {"kv": "C0", "kv-approx": "C1", "least_loaded": "C3", "random": "C2"}
    for name, res in results.items():
        style = {"marker": "o", "color": colors.get(name), "label": f"tandem {name} (simulated)"}
        tok.plot(qps, [res["stages"][k]["window_tok_s"] for k in ladder], **style)
        ttft.plot(qps, [res["stages"][k]["ttft_p90_s"] for k in ladder], **style)
    for name, mine in (("precise", "kv"), ("approximate", "kv-approx"), ("random", "random")):
        pts = sorted(LLMD_STAGES[name].items())
        style = {"ls": ":", "marker": "x", "color": colors[mine], "label": f"llm-d {name} (published)"}
        tok.plot([q for q, _ in pts], [v[0] for _, v in pts], **style)
        ttft.plot([q for q, _ in pts], [v[1] for _, v in pts], **style)
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
