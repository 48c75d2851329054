"""P/D on one GPU against aggregated serving on the same GPU: `tandem up` with 1 prefill + 1 decode worker sharing
the card (--gpu-memory-utilization 0.45 each, KV over NIXL), then 1 aggregated worker (0.9); the same load on
both (64 requests of 2000 prompt / 128 generated tokens, 16 at a time); errors, TTFT p50 (P/D's target: <= 1.5x
aggregated) and the decode worker's KV import rate from its metrics (target >= 20 GB/s). Prints a table, writes
JSON.

    python bench/gpu_pd.py --model /path/to/Llama-3.1-8B --json bench/out/gpu-pd.json   # default: random 8B shape
    python bench/gpu_pd.py --dry-run        # CPU, tiny model, a few short requests, KV transport auto: code only
"""

import argparse
import asyncio
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

PORT = 18431


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--model", default=None, help="a checkpoint (default: random weights, Llama-3.1-8B shape)")
    p.add_argument("--dry-run", action="store_true", help="CPU, tiny model and load: checks the code, measures nothing")
    p.add_argument("--concurrency", type=int, default=16)
    p.add_argument("--num-requests", type=int, default=64)
    p.add_argument("--isl", type=int, default=2000)
    p.add_argument("--osl", type=int, default=128)
    p.add_argument("--json", type=Path, default=None)
    args = p.parse_args(argv)
    if args.dry_run:
        args.concurrency, args.num_requests, args.isl, args.osl = 2, 4, 300, 4
    with tempfile.TemporaryDirectory() as tmp:
        if args.model is None:
            args.model = str(_random_model(Path(tmp) / "model", args.dry_run))
        args.vocab = min(30100, json.loads((Path(args.model) / "config.json").read_text())["vocab_size"])
        runs = {"pd": run(args, prefill=1, share=0.45), "aggregated": run(args, prefill=0, share=0.9)}
    ratio = runs["pd"]["ttft_p50_s"] / runs["aggregated"]["ttft_p50_s"]
    print(f"{'mode':<12}{'errors':>7}{'TTFT p50 s':>12}{'KV GB/s':>9}")
    for mode, r in runs.items():
        print(f"{mode:<12}{r['errors']:>7}{r['ttft_p50_s']:>12.3f}{r['kv_gb_per_s']:>9.1f}")
    print(f"P/D TTFT p50 / aggregated: {ratio:.2f} (target <= 1.5); KV target >= 20 GB/s")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(
            json.dumps(
                {
                    "runs": runs,
                    "ttft_ratio": ratio,
                    "dry_run": args.dry_run,
                    "kv_transport": "auto" if args.dry_run else "nixl",
                },
                indent=2,
            )
        )
    return 0


def _random_model(out: Path, tiny: bool) -> Path:
    from tandem.models.init import init_model

    return init_model(
        out,
        "llama",
        tiny=tiny,
        shape=None if tiny else "llama-3.1-8b",
        dtype="float32" if tiny else "bfloat16",
        device="cpu" if tiny else "cuda",  # NOTE: 8B of random numbers on the CPU outlast the section's limit
    )


def run(args, prefill: int, share: float) -> dict:
    device = (
        ["--dtype", "float32", "--device", "cpu"]
        if args.dry_run
        else ["--dtype", "bfloat16", "--device", "cuda", "--gpu-memory-utilization", str(share)]
    )
    cmd = [
        sys.executable,
        "-m",
        "tandem.cli",
        "up",
        "--engine",
        "native",
        *device,
        "--model",
        args.model,
        "--port",
        str(PORT),
        "--prefill",
        str(prefill),
        "--decode",
        "1",
    ]
    env = {
        **os.environ,
        "TANDEM_KV_TRANSPORT": "auto" if args.dry_run else "nixl",
        "TANDEM_ROUTER_DISAGG_MIN_TOKENS": "256",
        "TANDEM_ROUTER_PREFILL_MAX_WAITING": str(args.concurrency),
    }
    stack = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    try:
        banner = wait_ready(stack)
        asyncio.run(load(args, 2, 2))  # warm the stack's caches and connections
        ttfts, errors = asyncio.run(load(args, args.num_requests, args.concurrency))
        return {
            "errors": errors,
            "ttft_p50_s": sorted(ttfts)[len(ttfts) // 2] if ttfts else float("nan"),
            "kv_gb_per_s": kv_rate(banner),
        }
    finally:
        stack.send_signal(signal.SIGTERM)
        stack.wait(120)


def wait_ready(stack: subprocess.Popen, timeout_s: float = 900) -> str:
    lines, deadline = [], time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        line = stack.stdout.readline()
        if not line:
            raise SystemExit("tandem up exited:\n" + "".join(lines))
        lines.append(line)
        if "Ctrl-C stops everything" in line:
            return "".join(lines)
    raise SystemExit("tandem up not ready in time")


async def load(args, n: int, concurrency: int) -> tuple[list[float], int]:
    gate = asyncio.Semaphore(concurrency)

    async def one(client, i):
        async with gate:
            return await timed(client, i)

    async def timed(client, i):
        prompt = [(i * 7919 + j * 31) % (args.vocab - 100) + 100 for j in range(args.isl)]
        start, first = time.perf_counter(), None
        async with client.stream(
            "POST",
            f"http://127.0.0.1:{PORT}/v1/completions",
            timeout=600,
            json={
                "model": Path(args.model).name,
                "prompt": prompt,
                "max_tokens": args.osl,
                "ignore_eos": True,
                "stream": True,
            },
        ) as r:
            if r.status_code != 200:
                return None
            async for line in r.aiter_lines():
                if line.startswith("data:") and first is None:
                    first = time.perf_counter() - start
        return first

    async with httpx.AsyncClient() as client:
        got = await asyncio.gather(*(one(client, i) for i in range(n)))
    return [t for t in got if t is not None], sum(t is None for t in got)


def kv_rate(banner: str) -> float:
    """The decode worker's imported KV bytes over the seconds its imports took, from its /metrics."""
    url = re.search(r"metrics: decode-0 (\S+)", banner).group(1)
    text = httpx.get(url, timeout=10).text

    def value(name: str) -> float:
        return sum(float(m) for m in re.findall(rf'^{name}{{direction="import"[^}}]*}} (\S+)', text, re.M))

    seconds = value("tandem_worker_kv_transfer_seconds_sum")
    return value("tandem_worker_kv_transfer_bytes_total") / seconds / 1e9 if seconds else 0.0


if __name__ == "__main__":
    sys.exit(main())
