"""What penalties and logit_bias cost the native engine's decode: the same 32 requests, all running at once, greedy,
with no shaping (the anchor) and with presence + frequency + repetition penalties and a logit_bias, alternated in
one run so that drift on a shared machine hits both. Decode throughput is counted while all 32 are decoding.

    python bench/sampling_overhead.py [--model DIR] [--rounds 3] [--json bench/results/sampling_overhead.json]
"""

import argparse
import asyncio
import json
import os
import platform
import statistics
import time
from pathlib import Path

from engines.base.types import EngineRequest, SamplingParams
from tandem.bench.native_runner import make_engine

SHAPED = dict(
    presence_penalty=0.5,
    frequency_penalty=0.5,
    repetition_penalty=1.1,
    logit_bias=tuple((t, 1.5) for t in range(100, 1700, 200)),
)


async def one_round(engine, prompts: list[list[int]], params: SamplingParams, tag: str) -> float:
    """Decode tokens per second over the window where every request is past its first token and none is done."""
    times: list[list[float]] = [[] for _ in prompts]

    async def drain(i: int) -> None:
        async for out in engine.add_request(EngineRequest(f"{tag}-{i}", tuple(prompts[i]), params)):
            times[i].extend([time.perf_counter()] * len(out.new_token_ids))

    await asyncio.gather(*(drain(i) for i in range(len(prompts))))
    start, end = max(t[0] for t in times), min(t[-1] for t in times)
    num_tokens = sum(1 for t in times for s in t if start < s <= end)
    return num_tokens / (end - start)


def sampler_ms(vocab_size: int, concurrency: int, history: int, repeats: int = 30) -> dict[str, float]:
    """The sampler alone on [concurrency, vocab_size] logits, plain and shaped rows: median milliseconds per call
    (a steadier figure than throughput on a busy machine)."""
    import torch

    from engines.native.sampler import SampleRow, sample

    torch.set_num_threads(1)  # as the engine runs
    gen = torch.Generator().manual_seed(0)
    logits = torch.randn(concurrency, vocab_size, generator=gen)
    histories = [[(7 * i + 13 * j) % vocab_size for j in range(history)] for i in range(concurrency)]
    out = {}
    for name, extra in (("plain", {}), ("shaped", SHAPED)):
        params = SamplingParams(max_tokens=history, **extra)
        rows = [SampleRow(params, history // 2, (), h, history // 2) for h in histories]
        times = []
        for _ in range(repeats):
            began = time.perf_counter()
            sample(logits, rows, gen).to_host()
            times.append(1000 * (time.perf_counter() - began))
        out[name] = statistics.median(times)
    return out


async def measure(model: Path, concurrency: int, isl: int, osl: int, rounds: int, threads: int) -> dict:
    engine = make_engine(model, "float32", threads, concurrency, isl + osl)
    await engine.start()
    prompts = [[(17 * i + 31 * j) % 5000 + 100 for j in range(isl)] for i in range(concurrency)]
    plain = SamplingParams(max_tokens=osl, ignore_eos=True)
    shaped = SamplingParams(max_tokens=osl, ignore_eos=True, **SHAPED)
    runs: dict[str, list[float]] = {"plain": [], "shaped": []}
    try:
        await one_round(engine, prompts, plain, "warm")
        for r in range(rounds):
            order = [("plain", plain), ("shaped", shaped)] if r % 2 == 0 else [("shaped", shaped), ("plain", plain)]
            for name, params in order:
                runs[name].append(await one_round(engine, prompts, params, f"{name}{r}"))
    finally:
        await engine.shutdown()
    return runs


def paired_costs(runs: dict[str, list[float]]) -> list[float]:
    """Per round, the throughput the shaping cost against the plain run of the same round (negative: it was
    faster): the rounds alternate which goes first, so each pair shares its moment's load."""
    return [1 - s / p for p, s in zip(runs["plain"], runs["shaped"])]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="", help="checkpoint directory (default: the cached SmolLM2)")
    ap.add_argument("--concurrency", type=int, default=32)
    ap.add_argument("--isl", type=int, default=128)
    ap.add_argument("--osl", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--json", default="bench/results/sampling_overhead.json")
    args = ap.parse_args()
    if args.model:
        model = Path(args.model)
    else:
        from tandem.models.fetch import fetch_model

        model = fetch_model()
    load_before = os.getloadavg()
    runs = asyncio.run(measure(model, args.concurrency, args.isl, args.osl, args.rounds, args.threads))
    load_after = os.getloadavg()
    vocab_size = json.loads((model / "config.json").read_text())["vocab_size"]
    sampler = sampler_ms(vocab_size, args.concurrency, args.isl + args.osl)
    plain, shaped = statistics.median(runs["plain"]), statistics.median(runs["shaped"])
    cost = 1 - shaped / plain
    paired = paired_costs(runs)
    print(f"{'mode':<8} {'decode tok/s (median)':>22} {'rounds':>40}")
    for name, value in (("plain", plain), ("shaped", shaped)):
        print(f"{name:<8} {value:>22.1f} {', '.join(f'{v:.1f}' for v in runs[name]):>40}")
    print(f"cost of penalties + logit_bias: {100 * cost:.2f}% of decode throughput (medians; target <= 3%)")
    print(
        f"per round (1 - shaped/plain of the same round): {', '.join(f'{100 * c:.2f}%' for c in paired)}; "
        f"median {100 * statistics.median(paired):.2f}%, spread {100 * min(paired):.2f}% to {100 * max(paired):.2f}%"
    )
    print(
        f"sampler alone, {args.concurrency} rows x {vocab_size} vocab: plain {sampler['plain']:.2f} ms, shaped "
        f"{sampler['shaped']:.2f} ms per step (a decode step here: {1000 * args.concurrency / plain:.0f} ms)"
    )
    result = {
        "model": str(model),
        "concurrency": args.concurrency,
        "isl": args.isl,
        "osl": args.osl,
        "threads": args.threads,
        "shaping": {k: v for k, v in SHAPED.items() if k != "logit_bias"}
        | {"logit_bias_tokens": len(SHAPED["logit_bias"])},
        "rounds": runs,
        "median_tok_s": {"plain": plain, "shaped": shaped},
        "cost_fraction": cost,
        "paired_cost_fractions": paired,
        "paired_cost_median": statistics.median(paired),
        "load_average_before": load_before,
        "load_average_after": load_after,
        "sampler_ms": sampler,
        "step_ms_plain": 1000 * args.concurrency / plain,
        "host": platform.processor() or platform.machine(),
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
    }
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
