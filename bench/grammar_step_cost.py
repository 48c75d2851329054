"""What a grammar costs the native engine's decode step, without the gateway: one engine (one torch thread) runs the
same token-id prompts plain and under a `json_schema` whose one string cannot end within --osl tokens, so both
sides decode exactly --osl tokens, in rounds that alternate which side goes first, at each concurrency. It times
every step in which all requests decode (wall and the step thread's CPU time) and reads the grammar counters.

  python bench/grammar_step_cost.py [--model DIR] [--concurrency 1,16] [--rounds 3] [--json OUT]
"""

import argparse
import json
import os
import statistics
import time
from pathlib import Path

from engines.base.block_hash import num_blocks_for
from engines.base.engine_configs import CacheConfig
from engines.base.structured import StructuredSpec
from engines.base.types import EngineRequest, SamplingParams
from tandem.bench.structured_bench import round_order, story_schema


def decode_steps(core, prompts: list[list[int]], params: SamplingParams, tag: str) -> list[tuple[float, float]]:
    """(wall s, step-thread CPU s) of each step in which every request decodes."""
    for i, prompt in enumerate(prompts):
        core.add(EngineRequest(f"{tag}-{i}", tuple(prompt), params))
    steps = []
    while core.has_work and (out := core.schedule()) is not None:
        wall, cpu = time.perf_counter(), time.thread_time()
        sampled = core.launch(out).wait()
        wall, cpu = time.perf_counter() - wall, time.thread_time() - cpu
        core.commit(out, sampled)
        if len(out.scheduled) == len(prompts) and all(s.num_new_tokens == 1 for s in out.scheduled):
            steps.append((wall, cpu))
    return steps


def one_side(core, prompts, params, tag: str) -> dict:
    counters = core.runner.model_runner.grammars.counters
    before = (counters.num_masks, counters.wait_seconds)
    steps = decode_steps(core, prompts, params, tag)
    num_masks, wait_s = counters.num_masks - before[0], counters.wait_seconds - before[1]
    return {
        "num_steps": len(steps),
        "step_ms_p50": 1e3 * statistics.median(w for w, _ in steps),
        "step_cpu_ms_p50": 1e3 * statistics.median(c for _, c in steps),
        "num_masks": num_masks,
        "grammar_step_thread_us_per_token": 1e6 * wait_s / num_masks if num_masks else None,
    }


def measure(model: str, concurrencies: tuple[int, ...], rounds: int, isl: int, osl: int) -> list[dict]:
    from engines.base.engine_configs import BatchConfig
    from engines.native.config import EngineConfig
    from engines.native.runner import build_core

    top = max(concurrencies)
    core = build_core(
        EngineConfig(
            model=model,
            dtype="float32",
            num_threads=1,
            batch=BatchConfig(top, 4096),
            cache=CacheConfig(block_size=16, num_blocks=2 * top * (num_blocks_for(isl + osl, 16) + 1)),
        )
    )
    spec = StructuredSpec("json_schema", json.dumps(story_schema(osl)))
    sides = {
        False: SamplingParams(max_tokens=osl, ignore_eos=True),
        True: SamplingParams(max_tokens=osl, ignore_eos=True, structured=spec),
    }
    rows = []
    for c in concurrencies:
        prompts = [[(17 * i + 31 * j) % 5000 + 100 for j in range(isl)] for i in range(c)]
        decode_steps(core, prompts, sides[True], f"warm{c}")
        for r in range(rounds):
            for constrained in round_order(r):
                row = one_side(core, prompts, sides[constrained], f"c{c}-r{r}-{int(constrained)}")
                rows.append({"concurrency": c, "round": r, "json_schema": constrained} | row)
    return rows


def ratios(rows: list[dict], key: str) -> dict[str, float]:
    by: dict[tuple[int, bool], list[float]] = {}
    for r in rows:
        by.setdefault((r["concurrency"], r["json_schema"]), []).append(r[key])
    return {
        str(c): statistics.median(by[(c, True)]) / statistics.median(by[(c, False)])
        for c, js in by
        if js and (c, False) in by
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="")
    ap.add_argument("--concurrency", default="1,16")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--isl", type=int, default=128)
    ap.add_argument("--osl", type=int, default=64)
    ap.add_argument("--json", default="bench/results/grammar-step-cost.json")
    args = ap.parse_args()
    if not args.model:
        from tandem.models.fetch import fetch_model

        args.model = str(fetch_model())
    load_before = os.getloadavg()
    rows = measure(args.model, tuple(int(c) for c in args.concurrency.split(",")), args.rounds, args.isl, args.osl)
    load_after = os.getloadavg()
    print(
        f"{'conc':>4} {'round':>5} {'schema':>6} {'steps':>5} {'step ms p50':>11} {'cpu ms p50':>10} "
        f"{'grammar µs/token':>16}"
    )
    for r in rows:
        us = r["grammar_step_thread_us_per_token"]
        print(
            f"{r['concurrency']:>4} {r['round']:>5} {str(r['json_schema']):>6} {r['num_steps']:>5} "
            f"{r['step_ms_p50']:>11.2f} {r['step_cpu_ms_p50']:>10.2f} {'-' if us is None else f'{us:.1f}':>16}"
        )
    wall, cpu = ratios(rows, "step_ms_p50"), ratios(rows, "step_cpu_ms_p50")
    for c in wall:
        print(f"concurrency {c}: decode step p50 with the schema / without: wall {wall[c]:.3f}, CPU {cpu[c]:.3f}")
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(
        json.dumps(
            {
                "model": args.model,
                "isl": args.isl,
                "osl": args.osl,
                "rows": rows,
                "wall_ratio": wall,
                "cpu_ratio": cpu,
                "load_average_before": load_before,
                "load_average_after": load_after,
            },
            indent=1,
        )
        + "\n"
    )
    print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
