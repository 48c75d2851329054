"""What the host KV tier costs when nothing is reused: the native engine in this process (no servers), random
prompts, runs with and without a host tier interleaved (off, on, on, off, ...), and — robust to a loaded machine —
the share of each tiered run's wall time spent in the tier's own work (the write-through copies and the core's
tier bookkeeping), timed inside the same run. Prints a table, writes JSON.

    .venv/bin/python bench/kv_tiers_overhead.py --json bench/out/kv_tiers_overhead.json

Target (issue 17): offload on costs <= 5% of throughput and of TTFT.
"""

import argparse
import datetime
import json
import os
import platform
import random
import sys
import time
from pathlib import Path

import torch

from engines.base.engine_configs import CacheConfig
from engines.base.types import EngineRequest, SamplingParams
from engines.core.scheduler import Scheduler
from engines.core.tiers.tiering import Tiering
from engines.native.config import EngineConfig
from engines.native.runner import build_core

MODEL = Path(".cache/models/HuggingFaceTB--SmolLM2-135M-Instruct")
# NOTE: step_done includes the write-through copies (NativeTiers.offload) and the tiers' poll
TIER_WORK = ((Scheduler, "_onboard_waiting"), (Tiering, "completed"), (Tiering, "step_done"))


class TierClock:
    """Sums the wall time spent inside the tier methods in TIER_WORK (wrapped for the life of the object)."""

    def __init__(self):
        self.seconds = 0.0
        self._saved = [(cls, name, getattr(cls, name)) for cls, name in TIER_WORK]
        for cls, name, fn in self._saved:
            setattr(cls, name, self._timed(fn))

    def _timed(self, fn):
        def wrapper(*args, **kwargs):
            start = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                self.seconds += time.perf_counter() - start

        return wrapper

    def close(self) -> None:
        for cls, name, fn in self._saved:
            setattr(cls, name, fn)


def run(model: Path, host_gb: float, prompts: list[list[int]], osl: int, concurrency: int) -> dict:
    """Serve `prompts` `concurrency` at a time; wall time, TTFT per request, and time in tier work."""
    core = build_core(
        EngineConfig(
            str(model),
            num_threads=1,
            cache=CacheConfig(num_blocks=len(prompts[0]) // 16 * concurrency * 2, kv_host_gb=host_gb),
        )
    )
    clock = TierClock() if host_gb else None
    pending, ttft, start = list(enumerate(prompts)), {}, time.perf_counter()
    arrived, live = {}, set()
    try:
        while pending or live:
            while pending and len(live) < concurrency:
                i, prompt = pending.pop(0)
                core.add(EngineRequest(f"r{i}", tuple(prompt), SamplingParams(max_tokens=osl, ignore_eos=True)))
                arrived[f"r{i}"], _ = time.perf_counter(), live.add(f"r{i}")
            for out in core.step():
                ttft.setdefault(out.req_id, time.perf_counter() - arrived[out.req_id])
                if out.finished:
                    live.discard(out.req_id)
        wall = time.perf_counter() - start
    finally:
        if clock is not None:
            clock.close()
        if core.runner.tiers is not None:
            core.runner.tiers.close()
    return {
        "host_gb": host_gb,
        "wall_s": wall,
        "output_tokens_per_s": len(prompts) * osl / wall,
        "ttft_mean_s": sum(ttft.values()) / len(ttft),
        "tier_work_s": clock.seconds if clock else 0.0,
        "blocks_offloaded": core.stats().num_blocks_offloaded_host,
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", type=Path, default=MODEL)
    p.add_argument("--requests", type=int, default=8)
    p.add_argument("--isl", type=int, default=1000)
    p.add_argument("--osl", type=int, default=32)
    p.add_argument("--concurrency", type=int, default=4)
    p.add_argument("--kv-host-gb", type=float, default=1.0)
    p.add_argument("--repeats", type=int, default=2, help="runs of each case, interleaved (off, on, on, off, ...)")
    p.add_argument("--json", type=Path, default=None)
    args = p.parse_args(argv)
    torch.set_num_threads(1)
    rng = random.Random(1)
    prompts = [[rng.randrange(1000, 40000) for _ in range(args.isl)] for _ in range(args.requests)]
    cases = (0.0, args.kv_host_gb)
    runs = [
        run(args.model, gb, prompts, args.osl, args.concurrency)
        for i in range(args.repeats)
        for gb in (cases if i % 2 == 0 else cases[::-1])
    ]
    off, on = ([r for r in runs if (r["host_gb"] > 0) == tiered] for tiered in (False, True))
    print(format_table(off, on))
    if args.json:
        out = {
            "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
            "machine": f"{platform.node()} {platform.machine()} python {platform.python_version()}",
            "load_average": os.getloadavg(),
            "command": " ".join(sys.argv),
            "runs": runs,
        }
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(out, indent=2) + "\n")
        print(f"wrote {args.json}")
    return 0


def format_table(off: list[dict], on: list[dict]) -> str:
    def mean(rows, key):
        return sum(r[key] for r in rows) / len(rows)

    lines = [f"{'':<28}{'device only':>14}{'+ host tier':>14}{'ratio':>10}"]
    for label, key, scale in (("output tokens/s", "output_tokens_per_s", 1.0), ("TTFT mean (ms)", "ttft_mean_s", 1e3)):
        a, b = mean(off, key), mean(on, key)
        lines.append(f"{label:<28}{a * scale:>14.1f}{b * scale:>14.1f}{b / a:>10.3f}")
    for i, (a, b) in enumerate(zip(off, on)):
        lines.append(
            f"  run {i + 1}: tokens/s {a['output_tokens_per_s']:.1f} / {b['output_tokens_per_s']:.1f}, "
            f"TTFT mean (ms) {a['ttft_mean_s'] * 1e3:.0f} / {b['ttft_mean_s'] * 1e3:.0f}"
        )
    share = sum(r["tier_work_s"] for r in on) / sum(r["wall_s"] for r in on)
    lines.append(
        f"tier work in the tiered runs: {share * 100:.2f}% of their wall time "
        f"({sum(r['blocks_offloaded'] for r in on)} blocks written through)  (target: cost <= 5%)"
    )
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
