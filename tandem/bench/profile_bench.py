"""`tandem bench profile`: the step times a planner and the sim engine need, measured on the native engine:
prefill ms of one prompt per ISL (first token included, the best of --repeats), and decode step ms per
(running sequences, context) averaged over --steps steps once every sequence has its first token. Writes the
JSON shape `tandem sim --profile-from-measured` reads, and prints each point beside what a shipped profile says."""

import argparse
import datetime
import json
import platform
import sys
import time
from pathlib import Path

from engines.base.engine_configs import CacheConfig
from engines.timing.profile import load_profile
from tandem.bench.engine_args import resolve_model


def measure(args: argparse.Namespace) -> dict:
    import torch  # NOTE: the engine loads here, not when `tandem` starts

    from engines.base import EngineRequest, SamplingParams
    from engines.base.engine_configs import BatchConfig
    from engines.native.config import EngineConfig
    from engines.native.runner import build_core

    if args.threads:
        torch.set_num_threads(args.threads)
    need = max(max(args.isls), max(b * (c + args.steps + 2) for b in args.batches for c in args.contexts))
    config = EngineConfig(
        model=str(args.model),
        dtype=args.dtype,
        device=args.device,
        batch=BatchConfig(
            max(args.batches),
            args.max_num_batched_tokens,
            max(max(args.isls), max(args.contexts)) + args.steps + 8,
            enable_prefix_caching=False,
        ),
        cache=CacheConfig(num_blocks=need // 16 + max(args.batches) + 8),
    )
    core = build_core(config)
    vocab, gen = core.info.vocab_size, torch.Generator().manual_seed(0)
    sync = torch.cuda.synchronize if args.device.startswith("cuda") else (lambda: None)

    def submit(n: int, length: int, max_tokens: int) -> None:
        for i in range(n):
            ids = tuple(torch.randint(0, vocab, (length,), generator=gen).tolist())
            core.add(
                EngineRequest(
                    f"p{time.monotonic_ns()}-{i}", ids, SamplingParams(max_tokens=max_tokens, ignore_eos=True)
                )
            )

    def prefill_ms(isl: int) -> float:
        submit(1, isl, 1)
        sync()
        start = time.perf_counter()
        while core.has_work:
            core.step()
        sync()
        return (time.perf_counter() - start) * 1e3

    def decode_ms(batch: int, context: int) -> float:
        submit(batch, context, args.steps + 2)
        while core.scheduler.waiting or any(
            s.num_computed_tokens < s.num_prompt_tokens for s in core.scheduler.running
        ):
            core.step()  # every prompt prefilled: from here on, pure decode steps
        sync()
        start = time.perf_counter()
        for _ in range(args.steps):
            core.step()
        sync()
        elapsed = (time.perf_counter() - start) * 1e3 / args.steps
        while core.has_work:
            core.step()
        return elapsed

    prefill_ms(min(args.isls))  # warm-up: kernels compile, caches fill
    prefill = {str(isl): min(prefill_ms(isl) for _ in range(args.repeats)) for isl in args.isls}
    decode = [[b, c, round(decode_ms(b, c), 3)] for c in args.contexts for b in args.batches]
    device = (
        torch.cuda.get_device_name(args.device) if args.device.startswith("cuda") else platform.processor() or "cpu"
    )
    return {
        "device": device,
        "model": f"{args.model.name} {args.dtype}",
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "command": " ".join(sys.argv),
        "prefill_ms": prefill,
        "decode_step_ms": decode,
        "engine": {
            "block_size": config.cache.block_size,
            "max_num_batched_tokens": config.batch.max_num_batched_tokens,
            "threads": torch.get_num_threads(),
            "device": args.device,
        },
    }


def format_table(doc: dict, anchor_name: str) -> str:
    anchor = load_profile(anchor_name)
    lines = [f"{'point':<26}{'measured ms':>14}{anchor_name + ' ms':>34}"]
    for isl, ms in doc["prefill_ms"].items():
        lines.append(f"{'prefill ' + isl:<26}{ms:>14.2f}{anchor.prefill_s(int(isl)) * 1e3:>34.2f}")
    for batch, context, ms in doc["decode_step_ms"]:
        expected = anchor.decode_step_s(batch, batch * context) * 1e3
        lines.append(f"{f'decode {batch} x {context}':<26}{ms:>14.2f}{expected:>34.2f}")
    return "\n".join(lines)


def run_bench_profile(args: argparse.Namespace) -> int:
    args.model = resolve_model(args.model)
    doc = measure(args)
    print(format_table(doc, args.anchor))
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(doc, indent=1) + "\n")
        print(f"wrote {args.json} (a sim profile: tandem sim --profile-from-measured {args.json} --save-profile P)")
    return 0


def add_profile_command(sub) -> None:
    p = sub.add_parser(
        "profile",
        help="step times for the planner and the sim engine: prefill ms by ISL, "
        "decode step ms by batch and context, on the native engine",
    )
    p.add_argument("--model", type=Path, default=None, help="checkpoint directory (default: SmolLM2)")
    p.add_argument("--device", default="cpu")
    p.add_argument("--dtype", choices=("float32", "bfloat16", "float16"), default="float32")
    p.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    p.add_argument("--isls", type=_ints, default=[128, 256, 512, 1024, 2048, 4096, 8192])
    p.add_argument("--batches", type=_ints, default=[1, 8, 32, 64, 128, 256])
    p.add_argument("--contexts", type=_ints, default=[128, 1024, 4096])
    p.add_argument("--steps", type=int, default=20, help="decode steps averaged per point")
    p.add_argument("--repeats", type=int, default=3, help="prefill: the best of this many")
    p.add_argument("--max-num-batched-tokens", type=int, default=8192)
    p.add_argument("--anchor", default="h100-native-llama3.1-8b-bf16", help="the shipped profile printed beside")
    p.add_argument("--json", type=Path, default=None)
    p.set_defaults(func=run_bench_profile)


def _ints(raw: str) -> list[int]:
    values = [int(v) for v in raw.split(",") if v.strip()]
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"expected comma-separated positive integers, got {raw!r}")
    return values
