"""Grammar cost at serving time: inter-token latency p50 of streamed chat requests with a `json_schema` against the
same requests without, at 1 and at 16 concurrent, all in one run against one stack (each pair back to back, so load
drifts hit both). Every request makes exactly --osl tokens (ignore_eos). A request's ITL is (finish chunk - first
chunk) / (completion tokens - 1): counted in tokens, not chunks, since a grammar's stop tokens after its end make no
text and so no chunk. Prints a table and writes JSON.

  python bench/structured_itl.py --model DIR --json bench/results/structured-itl.json [--url URL]
"""
import argparse
import asyncio
import json
import statistics
import time
from contextlib import ExitStack
from pathlib import Path

import httpx

SCHEMA = {"type": "object", "additionalProperties": False, "required": ["title", "story"],
          "properties": {"title": {"type": "string", "maxLength": 60}, "story": {"type": "string"}}}
PROMPT = "Write a long story about a lighthouse keeper, as JSON with a title and the story."


async def one(client: httpx.AsyncClient, model: str, osl: int, structured: bool, seed: int) -> float:
    body = {"model": model, "messages": [{"role": "user", "content": PROMPT}], "max_tokens": osl, "stream": True,
            "ignore_eos": True, "temperature": 0.7, "seed": seed, "stream_options": {"include_usage": True}}
    if structured:
        body["response_format"] = {"type": "json_schema", "json_schema": {"name": "story", "schema": SCHEMA}}
    stamps, num_tokens = [], 0
    async with client.stream("POST", "/v1/chat/completions", json=body) as response:
        response.raise_for_status()
        async for line in response.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            if chunk.get("usage"):
                num_tokens = chunk["usage"]["completion_tokens"]
            else:
                stamps.append(time.perf_counter())
    return (stamps[-1] - stamps[0]) / (num_tokens - 1)


async def run_mode(url: str, model: str, osl: int, concurrency: int, num: int, structured: bool) -> dict:
    async with httpx.AsyncClient(base_url=url, timeout=600) as client:
        sem, gaps = asyncio.Semaphore(concurrency), []  # per request: its mean ITL

        async def task(i: int) -> None:
            async with sem:
                gaps.append(await one(client, model, osl, structured, i))

        start = time.perf_counter()
        await asyncio.gather(*(task(i) for i in range(num)))
        elapsed = time.perf_counter() - start
    return {"structured": structured, "concurrency": concurrency, "num_requests": num,
            "itl_p50_ms": round(1e3 * statistics.median(gaps), 2),
            "itl_mean_ms": round(1e3 * statistics.fmean(gaps), 2),
            "elapsed_s": round(elapsed, 1)}


async def bench(url: str, model: str, osl: int, num: int) -> list[dict]:
    rows = []
    await run_mode(url, model, osl, 1, 2, True)  # warm-up: the grammar thread, tokenizer caches
    for concurrency in (1, 16):
        n = num if concurrency == 1 else max(num, 2 * concurrency)
        for structured in (False, True):
            rows.append(await run_mode(url, model, osl, concurrency, n, structured))
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--url", default="")
    ap.add_argument("--osl", type=int, default=64)
    ap.add_argument("--num-requests", type=int, default=12)
    ap.add_argument("--json", required=True)
    args = ap.parse_args()
    from bench.tool_call_validity import _stack
    from tandem.launcher import served_name

    with ExitStack() as stack:
        url = args.url or stack.enter_context(_stack(args.model))
        rows = asyncio.run(bench(url, served_name(args.model), args.osl, args.num_requests))
    print(f"{'concurrency':>11} {'json_schema':>11} {'ITL p50 ms':>10} {'ITL mean ms':>11} {'requests':>8}")
    for r in rows:
        print(f"{r['concurrency']:>11} {str(r['structured']):>11} {r['itl_p50_ms']:>10} {r['itl_mean_ms']:>11} "
              f"{r['num_requests']:>8}")
    ratios = {c: next(r for r in rows if r["concurrency"] == c and r["structured"])["itl_p50_ms"]
              / next(r for r in rows if r["concurrency"] == c and not r["structured"])["itl_p50_ms"] for c in (1, 16)}
    print("ITL p50 ratio (json_schema / plain):", {c: round(v, 3) for c, v in ratios.items()}, "target <= 1.10")
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps({"osl": args.osl, "rows": rows,
                                           "itl_p50_ratio": {str(c): round(v, 3) for c, v in ratios.items()}},
                                          indent=1) + "\n")


if __name__ == "__main__":
    main()
