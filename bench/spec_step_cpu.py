"""Per-step CPU time of the native engine with speculative decoding off and on, in one process on the same prompts:
what a step costs when speculation is enabled but the request proposes nothing (the no-copy guard's fixed cost).
CPU time of the stepping thread (time.thread_time), so a loaded host's waiting is not counted. Bench only.

    python bench/spec_step_cpu.py [--requests 4] [--osl 128] [--rounds 2] [--json bench/results/X.json]
"""

import argparse
import json
import statistics
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import torch

from engines.base.block_hash import num_blocks_for
from engines.base.engine_configs import BatchConfig, CacheConfig
from engines.base.types import EngineRequest
from engines.native.config import EngineConfig, SpeculativeOptions
from engines.native.runner import build_core
from tandem.bench.engine_args import resolve_model
from tandem.bench.native_runner import BLOCK_SIZE
from tandem.bench.spec_bench import WORKLOADS, chat_prompts, params_for


def make_core(model: Path, speculative: str, max_len: int):
    config = EngineConfig(
        model=str(model),
        dtype="float32",
        num_threads=1,
        batch=BatchConfig(1, 4096),
        speculation=SpeculativeOptions(speculative),
        cache=CacheConfig(block_size=BLOCK_SIZE, num_blocks=max(16, 2 * (num_blocks_for(max_len, BLOCK_SIZE) + 1))),
    )
    return build_core(config)


def run(core, prompts: list[list[int]], osl: int, tag: str) -> dict:
    """Each prompt alone (batch 1); the thread CPU time of every step that decodes without verifying anything."""
    plain, verifying, outputs, total = [], [], [], 0.0
    w = WORKLOADS["sampled"]
    for i, prompt in enumerate(prompts):
        params = replace(params_for(w, i), max_tokens=osl)
        core.add(EngineRequest(f"{tag}{i}", tuple(prompt), params))
        tokens: list[int] = []
        while core.has_work:
            out = core.schedule()
            if out is None:
                break
            start = time.thread_time()
            sampled = core.launch(out).wait()
            for o in core.commit(out, sampled):
                tokens.extend(o.new_token_ids)
            spent = time.thread_time() - start
            total += spent
            if any(s.spec_token_ids for s in out.scheduled):
                verifying.append(spent)
            elif all(s.num_new_tokens == 1 for s in out.scheduled):
                plain.append(spent)
        outputs.append(tokens)
    return {
        "plain_steps": len(plain),
        "verify_steps": len(verifying),
        "plain_step_ms": 1e3 * statistics.median(plain),
        "plain_step_ms_mean": 1e3 * statistics.fmean(plain),
        "verify_step_ms_total": 1e3 * sum(verifying),
        "cpu_ms_per_token": 1e3 * total / sum(map(len, outputs)),
        "tokens": sum(map(len, outputs)),
        "outputs": outputs,
    }


def separate(args) -> None:
    """Each engine in processes of its own (a process's allocator and caches are not shared), alternated."""
    rows = {"off": [], "on": []}
    for r in range(args.rounds):
        for name in ("off", "on") if r % 2 == 0 else ("on", "off"):
            cmd = [
                sys.executable,
                __file__,
                "--requests",
                str(args.requests),
                "--osl",
                str(args.osl),
                "--rounds",
                "1",
                "--speculative",
                args.speculative,
                "--only",
                name,
            ]
            rows[name].append(
                json.loads(
                    subprocess.run(cmd, check=True, capture_output=True, text=True).stdout.strip().splitlines()[-1]
                )
            )
    report = {
        "speculative": args.speculative,
        "requests": args.requests,
        "osl": args.osl,
        "rounds": args.rounds,
        "separate_processes": True,
        **rows,
    }
    summarize(report, rows, args.json)


def summarize(report: dict, rows: dict, path: Path | None) -> None:
    off = statistics.median(x["plain_step_ms"] for x in rows["off"])
    on = statistics.median(x["plain_step_ms"] for x in rows["on"])
    report["plain_step_ratio_on_over_off"] = on / off
    per_token = {n: statistics.median(x["cpu_ms_per_token"] for x in runs) for n, runs in rows.items()}
    report["cpu_per_token_ratio_off_over_on"] = per_token["off"] / per_token["on"]  # NOTE: a throughput ratio
    print(
        "| engine | plain decode step CPU ms (median) | CPU ms per token | plain steps | verify steps |\n"
        "|---|---|---|---|---|"
    )
    for name, runs in rows.items():
        print(
            f"| {name} | {statistics.median(x['plain_step_ms'] for x in runs):.2f} | {per_token[name]:.2f} | "
            f"{sum(x['plain_steps'] for x in runs)} | {sum(x['verify_steps'] for x in runs)} |"
        )
    print(
        f"on/off per plain step: {on / off:.3f}; throughput by CPU, on vs off: "
        f"{report['cpu_per_token_ratio_off_over_on']:.3f}x"
    )
    if path:
        path.write_text(json.dumps(report, indent=2) + "\n")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--requests", type=int, default=4)
    ap.add_argument("--osl", type=int, default=128)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--speculative", default="ngram")
    ap.add_argument("--only", choices=("off", "on"), help="one engine in this process (the other's state apart)")
    ap.add_argument("--separate", action="store_true", help="each run in a fresh process of its own, alternated")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    if args.separate:
        return separate(args)
    torch.set_num_threads(1)
    model = resolve_model(None)
    from transformers import AutoTokenizer

    prompts = chat_prompts(AutoTokenizer.from_pretrained(model), args.requests)
    max_len = max(map(len, prompts)) + args.osl
    names = (args.only,) if args.only else ("off", "on")
    cores = {n: make_core(model, args.speculative if n == "on" else "", max_len) for n in names}
    rows = {n: [] for n in names}
    for r in range(args.rounds):
        for name in names if r % 2 == 0 else names[::-1]:  # NOTE: alternated, so drift hits both
            rows[name].append(run(cores[name], prompts, args.osl, f"{name}{r}-"))
    if args.only:
        print(json.dumps({k: v for k, v in rows[args.only][-1].items() if k != "outputs"}))
        return
    report = {
        "speculative": args.speculative,
        "requests": args.requests,
        "osl": args.osl,
        "rounds": args.rounds,
        "identical_output": all(a["outputs"] == b["outputs"] for a, b in zip(rows["off"], rows["on"])),
    }
    for name, runs in rows.items():
        report[name] = [{k: v for k, v in x.items() if k != "outputs"} for x in runs]
    summarize(report, rows, args.json)


if __name__ == "__main__":
    main()
