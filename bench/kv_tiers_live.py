"""KV tiers live on this machine, each case against its anchor in the same run (a stack of the native engine:
router, one aggregated decode worker, gateway, started and stopped here). Prints a table, writes JSON.

    .venv/bin/python bench/kv_tiers_live.py --json bench/out/kv_tiers_live.json

1. multiturn (by default `--users 8 --rounds 4 --system-tokens 1000 --user-tokens 1000 --answer-tokens 32`, with a
   round barrier) with a device pool the conversations outgrow 3x, without and with a 1 GB host tier: mean TTFT of rounds
   2-4 (target <= 0.5x) and the greedy answers (target: identical).
2. no reuse: random prompts, without and with the host tier: throughput and mean TTFT (target: <= 5% worse).
3. warm restart: a conversation with host and disk tiers, the stack restarted on the same disk directory, the
   conversation again: it hits the disk tier and yields the same answers.
"""

import argparse
import asyncio
import datetime
import json
import platform
import sys
import tempfile
import time
from pathlib import Path

import httpx
from prometheus_client.parser import text_string_to_metric_families

from engines.base.block_hash import num_blocks_for
from tandem.bench.http_client import Endpoint
from tandem.bench.multiturn import QUESTION_TOKENS, Multiturn
from tandem.bench.serve_bench import ServeConfig, run_serve
from tandem.launcher import StackConfig, free_port
from tandem.stack_run import make_stack

MODEL = Path(".cache/models/HuggingFaceTB--SmolLM2-135M-Instruct")


def serve(model: Path, log_dir: Path, worker_args: tuple[str, ...], cfg_for, disk_dir: str = "") -> dict:
    """Start a stack, run one benchmark against it, read the worker's tier counters, stop it."""
    port = free_port()
    cfg = StackConfig(
        model=str(model),
        num_prefill=0,
        num_decode=1,
        port=port,
        num_threads=1,
        log_dir=log_dir,
        worker_args=worker_args,
        kv_disk_dir=disk_dir,
    )
    stack = make_stack(cfg)
    try:
        stack.start()
        stack.wait_ready()
        summary, report = asyncio.run(run_serve(cfg_for(stack.url)))
        report["tiers"] = tier_counters(stack.metrics_urls["decode-0"])
        return report
    finally:
        stack.stop()


def tier_counters(url: str) -> dict:
    """Prompt tokens served per tier and blocks onboarded, from the worker's /metrics."""
    out = {"prefix_queries": 0.0, "prefix_hits": 0.0}
    for family in text_string_to_metric_families(httpx.get(url, timeout=10).text):
        for s in family.samples:
            if s.name == "tandem_worker_prefix_cache_queries_total":
                out["prefix_queries"] = s.value
            elif s.name == "tandem_worker_prefix_cache_hits_total":
                out["prefix_hits"] = s.value
            elif s.name.startswith("tandem_worker_kv_tier_") and s.name.endswith("_total"):
                out[f"{s.name.removeprefix('tandem_worker_kv_tier_').removesuffix('_total')}_{s.labels['tier']}"] = (
                    s.value
                )
    return out


def multiturn_cfg(model: Path, mt: Multiturn):
    return lambda url: ServeConfig(Endpoint(url), tokenizer=model, multiturn=mt)


def random_cfg(model: Path, num_requests: int, isl: int, osl: int):
    return lambda url: ServeConfig(
        Endpoint(url, extra_body={"ignore_eos": True}),
        tokenizer=model,
        concurrency=4,
        num_requests=num_requests,
        isl=isl,
        osl=osl,
        seed=1,
    )


def mean_summary(summaries: list[dict]) -> dict:
    """What the no-reuse table reads, averaged over interleaved runs of one case."""
    n = len(summaries)
    return {
        "output_tokens_per_s": sum(s["output_tokens_per_s"] for s in summaries) / n,
        "ttft_s": {"mean": sum(s["ttft_s"]["mean"] for s in summaries) / n},
    }


def later_rounds_ttft(report: dict) -> float:
    rows = [r for r in report["rounds"] if r["round"] >= 2]
    return sum(r["ttft_mean_s"] * r["num_requests"] for r in rows) / sum(r["num_requests"] for r in rows)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", type=Path, default=MODEL)
    p.add_argument("--users", type=int, default=8)
    p.add_argument("--rounds", type=int, default=4)
    p.add_argument("--system-tokens", type=int, default=1000)
    p.add_argument("--user-tokens", type=int, default=1000)
    p.add_argument("--answer-tokens", type=int, default=32)
    p.add_argument(
        "--num-blocks",
        type=int,
        default=0,
        help="device blocks of 16 tokens (0: a third of the distinct tokens the conversations hold)",
    )
    p.add_argument("--kv-host-gb", type=float, default=1.0)
    p.add_argument("--no-reuse-requests", type=int, default=24)
    p.add_argument("--no-reuse-isl", type=int, default=1000)
    p.add_argument(
        "--no-reuse-repeats",
        type=int,
        default=1,
        help="runs of each no-reuse case, interleaved (off, on, on, off, ...), so drift hits both alike",
    )
    p.add_argument("--skip", default="", help="comma-separated cases to leave out: multiturn,noreuse,restart")
    p.add_argument("--json", type=Path, default=None)
    args = p.parse_args(argv)
    skip = set(args.skip.split(","))
    mt = Multiturn(
        args.users, args.rounds, args.system_tokens, args.user_tokens, args.answer_tokens, round_barrier=True
    )
    needed = distinct_tokens(mt)
    num_blocks = args.num_blocks or pool_blocks(mt, 3)
    base = ("--num-blocks", str(num_blocks))
    host = (*base, "--kv-host-gb", str(args.kv_host_gb))
    logs = Path(tempfile.mkdtemp(prefix="kv_tiers_live_"))
    out: dict = {
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "machine": f"{platform.node()} {platform.machine()} python {platform.python_version()}",
        "command": " ".join(sys.argv),
        "model": str(args.model),
        "multiturn_load": mt.describe(),
        "num_blocks": num_blocks,
        "distinct_tokens": needed,
        "pool_multiple": needed / (16 * num_blocks),
        "kv_host_gb": args.kv_host_gb,
        "logs": str(logs),
    }
    if "multiturn" not in skip:
        out["multiturn"] = {
            name: serve(args.model, logs / name, wargs, multiturn_cfg(args.model, mt))
            for name, wargs in (("device", base), ("host", host))
        }
        dev, tier = out["multiturn"]["device"], out["multiturn"]["host"]
        out["multiturn_ratio"] = later_rounds_ttft(tier) / later_rounds_ttft(dev)
        out["multiturn_same_answers"] = dev["answers_sha256"] == tier["answers_sha256"]
    if "noreuse" not in skip:
        cfg = random_cfg(args.model, args.no_reuse_requests, args.no_reuse_isl, args.answer_tokens)
        cases = (("device", base), ("host", host))
        runs = [
            (name, i, serve(args.model, logs / f"noreuse-{name}-{i}", wargs, cfg))
            for i in range(args.no_reuse_repeats)
            for name, wargs in (cases if i % 2 == 0 else cases[::-1])
        ]
        out["noreuse"] = {name: {"runs": [r for n, _, r in runs if n == name]} for name in ("device", "host")}
        for entry in out["noreuse"].values():
            entry["summary"] = mean_summary([r["summary"] for r in entry["runs"]])
    if "restart" not in skip:
        out["restart"] = warm_restart(args, mt, host, logs)
    print(format_report(out))
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(out, indent=2, default=str) + "\n")
        print(f"wrote {args.json}")
    return 0


def distinct_tokens(mt: Multiturn) -> int:
    """Tokens the conversations hold at their end: the shared system part once, each user's whole history."""
    return mt.system_tokens + mt.users * (
        mt.user_tokens + mt.rounds * mt.answer_tokens + (mt.rounds - 1) * QUESTION_TOKENS
    )


def pool_blocks(mt: Multiturn, multiple: int) -> int:
    """Device blocks of 16 tokens for a pool the conversations outgrow `multiple` times, never less than the
    longest request needs."""
    longest = distinct_tokens(Multiturn(1, mt.rounds, mt.system_tokens, mt.user_tokens, mt.answer_tokens))
    return max(distinct_tokens(mt) // 16 // multiple, num_blocks_for(longest, 16) + 2)


def warm_restart(args, mt: Multiturn, host: tuple[str, ...], logs: Path) -> dict:
    """Two users, three rounds: blocks are seen more than once, so they reach disk; then the same again after a
    restart on the same directory."""
    disk = tempfile.mkdtemp(prefix="kv_disk_")
    wargs = (*host, "--kv-disk-gb", str(2 * args.kv_host_gb))
    mt = Multiturn(2, 3, mt.system_tokens // 2, mt.user_tokens // 2, mt.answer_tokens, round_barrier=True)
    first = serve(args.model, logs / "restart-1", wargs, multiturn_cfg(args.model, mt), disk)
    time.sleep(0.5)
    second = serve(args.model, logs / "restart-2", wargs, multiturn_cfg(args.model, mt), disk)
    return {
        "disk_dir": disk,
        "first": first,
        "second": second,
        "same_answers": first["answers_sha256"] == second["answers_sha256"],
    }


def format_report(out: dict) -> str:
    lines = []
    if "multiturn" in out:
        lines.append(f"{'multiturn (ms)':<28}{'device only':>14}{'+ host tier':>14}")
        dev, tier = out["multiturn"]["device"], out["multiturn"]["host"]
        for d, t in zip(dev["rounds"], tier["rounds"]):
            lines.append(
                f"{'TTFT mean round ' + str(d['round']):<28}{d['ttft_mean_s'] * 1e3:>14.1f}"
                f"{t['ttft_mean_s'] * 1e3:>14.1f}"
            )
        lines.append(
            f"{'TTFT mean rounds 2-4':<28}{later_rounds_ttft(dev) * 1e3:>14.1f}{later_rounds_ttft(tier) * 1e3:>14.1f}"
        )
        for key in ("prefix_hits", "prefix_hits_host", "onboarded_blocks_host", "offloaded_blocks_host"):
            lines.append(f"{key:<28}{dev['tiers'].get(key, 0):>14.0f}{tier['tiers'].get(key, 0):>14.0f}")
        lines.append(
            f"rounds 2-4 ratio {out['multiturn_ratio']:.3f} (target <= 0.5); identical answers: "
            f"{out['multiturn_same_answers']}"
        )
    if "noreuse" in out:
        dev, tier = (out["noreuse"][k]["summary"] for k in ("device", "host"))
        lines.append(f"\n{'no reuse':<28}{'device only':>14}{'+ host tier':>14}{'ratio':>10}")
        for label, key, sub in (("output tokens/s", "output_tokens_per_s", None), ("TTFT mean (ms)", "ttft_s", "mean")):
            a, b = (s[key] if sub is None else s[key][sub] for s in (dev, tier))
            scale = 1e3 if sub else 1.0
            lines.append(f"{label:<28}{a * scale:>14.1f}{b * scale:>14.1f}{b / a:>10.3f}")
        for i, (d, t) in enumerate(zip(*(out["noreuse"][k]["runs"] for k in ("device", "host")))):
            d, t = d["summary"], t["summary"]
            lines.append(
                f"  run {i + 1}: tokens/s {d['output_tokens_per_s']:.1f} / {t['output_tokens_per_s']:.1f}, "
                f"TTFT mean (ms) {d['ttft_s']['mean'] * 1e3:.1f} / {t['ttft_s']['mean'] * 1e3:.1f}"
            )
    if "restart" in out:
        r = out["restart"]
        lines.append(
            f"\nwarm restart: disk blocks written {r['first']['tiers'].get('offloaded_blocks_disk', 0):.0f}"
            f"; after the restart prompt tokens from disk {r['second']['tiers'].get('prefix_hits_disk', 0):.0f}"
            f", from host {r['second']['tiers'].get('prefix_hits_host', 0):.0f}; identical answers: "
            f"{r['same_answers']}"
        )
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
