"""The serving path against the in-process engine, on one GPU: the same load (256 requests of 128 prompt /
128 generated tokens, all at once) first straight into an EngineCore in this process, then through
`tandem up` (gateway, router, one aggregated worker) driven by `tandem bench serve`. Targets: serving output
tok/s >= 0.90 of the engine's, TTFT p50 within 1.2x. Prints a table, writes JSON.

    python bench/gpu_serve.py --model DIR --json bench/out/gpu-serve.json    # CUDA (default: random 8B shape)
    python bench/gpu_serve.py --dry-run                                       # CPU, tiny model, seconds
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

from engines.base.engine_configs import CacheConfig

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script from anywhere

from bench.gpu_pd import wait_ready  # noqa: E402

PORT = 18451


def in_process(model: Path, device: str, dtype: str, n: int, isl: int, osl: int) -> dict:
    """Output tok/s and TTFT p50 of n requests added at once to the bare core, stepped to the end."""
    from engines.base import EngineRequest, SamplingParams
    from engines.base.engine_configs import BatchConfig
    from engines.native.config import EngineConfig
    from engines.native.runner import build_core

    core = build_core(
        EngineConfig(
            model=str(model),
            dtype=dtype,
            device=device,
            batch=BatchConfig(n, 8192, isl + osl + 16),
            cache=CacheConfig(gpu_memory_utilization=0.0, kv_cache_memory_fraction=0.85),
        )
    )
    gen = torch.Generator().manual_seed(0)
    vocab = core.info.vocab_size

    def add(tag: str, count: int, n_in: int, n_out: int, core=core) -> list[str]:
        ids = [f"{tag}{i}" for i in range(count)]
        for req_id in ids:
            prompt = tuple(torch.randint(0, vocab, (n_in,), generator=gen).tolist())
            core.add(EngineRequest(req_id, prompt, SamplingParams(max_tokens=n_out, ignore_eos=True)))
        return ids

    add("warm", 4, 8, 4)
    while core.has_work:
        core.step()
    add("r", n, isl, osl)
    _sync(device)
    start, first = time.perf_counter(), {}
    while core.has_work:
        for out in core.step():
            first.setdefault(out.req_id, time.perf_counter() - start)
    _sync(device)
    seconds = time.perf_counter() - start
    del core, add  # NOTE: `add` holds the core too; both go before the cache is emptied
    if device.startswith("cuda"):
        torch.cuda.empty_cache()
    ttfts = sorted(first.values())
    return {"output_tok_per_s": n * osl / seconds, "ttft_p50_s": ttfts[len(ttfts) // 2], "seconds": seconds}


def served(model: Path, device: str, dtype: str, n: int, isl: int, osl: int, out_dir: Path) -> dict:
    """The same load through `tandem up` + `tandem bench serve` (closed loop, n in flight)."""
    cmd = [
        sys.executable,
        "-m",
        "tandem.cli",
        "up",
        "--engine",
        "native",
        "--dtype",
        dtype,
        "--device",
        device,
        "--model",
        str(model),
        "--port",
        str(PORT),
        "--prefill",
        "0",
        "--decode",
        "1",
    ]
    if device.startswith("cuda"):
        cmd += ["--gpu-memory-utilization", "0.9"]
    env = {**os.environ, "TANDEM_WORKER_MAX_NUM_SEQS": str(n), "TANDEM_WORKER_MAX_NUM_BATCHED_TOKENS": "8192"}
    stack = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    try:
        wait_ready(stack)
        report = out_dir / "serve-bench.json"
        subprocess.run(
            [
                sys.executable,
                "-m",
                "tandem.cli",
                "bench",
                "serve",
                "--url",
                f"http://127.0.0.1:{PORT}",
                "--concurrency",
                str(n),
                "--num-requests",
                str(n),
                "--isl",
                str(isl),
                "--osl",
                str(osl),
                "--warmup",
                "4",
                "--json",
                str(report),
            ],
            check=True,
            timeout=900,
        )
        data = json.loads(report.read_text())
    finally:
        stack.terminate()
        stack.wait(120)
    summary = data["summary"]
    return {
        "output_tok_per_s": summary["output_tokens_per_s"],
        "ttft_p50_s": summary["ttft_s"]["p50"],
        "errors": summary["num_errors"],
    }


def _sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", type=Path, default=None, help="a checkpoint (default: random weights, 8B shape)")
    p.add_argument("--dry-run", action="store_true", help="CPU and a tiny model: checks the code, measures nothing")
    p.add_argument("--num-requests", type=int, default=None)
    p.add_argument("--isl", type=int, default=None)
    p.add_argument("--osl", type=int, default=None)
    p.add_argument("--json", type=Path, default=None)
    args = p.parse_args(argv)
    device, dtype = ("cpu", "float32") if args.dry_run else ("cuda", "bfloat16")
    if device == "cuda" and not torch.cuda.is_available():
        p.error("no CUDA device; use --dry-run on CPU")
    n, isl, osl = (
        args.num_requests or (8 if args.dry_run else 256),
        args.isl or (16 if args.dry_run else 128),
        args.osl or (8 if args.dry_run else 128),
    )
    with tempfile.TemporaryDirectory() as tmp:
        model = args.model or _random_model(Path(tmp) / "model", args.dry_run, dtype)
        engine = in_process(model, device, dtype, n, isl, osl)
        serving = served(model, device, dtype, n, isl, osl, Path(tmp))
    ratio = serving["output_tok_per_s"] / engine["output_tok_per_s"]
    ttft_ratio = serving["ttft_p50_s"] / engine["ttft_p50_s"]
    print(f"{'path':<12}{'out tok/s':>11}{'TTFT p50 s':>12}")
    for name, r in (("in-process", engine), ("serving", serving)):
        print(f"{name:<12}{r['output_tok_per_s']:>11.1f}{r['ttft_p50_s']:>12.3f}")
    print(f"serving / engine: {ratio:.2f} (target >= 0.90); TTFT p50 ratio {ttft_ratio:.2f} (target <= 1.2)")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(
            json.dumps(
                {
                    "device": "cpu (dry run)" if args.dry_run else torch.cuda.get_device_name(),
                    "load": {"num_requests": n, "isl": isl, "osl": osl},
                    "engine": engine,
                    "serving": serving,
                    "throughput_ratio": ratio,
                    "ttft_ratio": ttft_ratio,
                },
                indent=2,
            )
        )
    return 0


def _random_model(out: Path, tiny: bool, dtype: str) -> Path:
    from tandem.models.init import init_model

    shape, device = (None, "cpu") if tiny else ("llama-3.1-8b", "cuda")  # NOTE: cuda draws 8B numbers in seconds
    return init_model(out, "llama", tiny=tiny, shape=shape, dtype=dtype, device=device)


if __name__ == "__main__":
    sys.exit(main())
