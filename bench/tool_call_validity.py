"""Tool-call validity with tool_choice "required": N chat requests (sampled, seeded, varied prompts, three tools)
against a tandem stack, each answer's call checked against its tool's JSON schema with jsonschema. Target: 100%.
Starts its own aggregated stack over --model unless --url names one. Prints a table and writes JSON.

  python bench/tool_call_validity.py --model DIR --num-calls 200 --json bench/results/tool-call-validity.json
"""

import argparse
import json
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack
from pathlib import Path

import jsonschema
import openai

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Current weather in a city",
            "parameters": {
                "type": "object",
                "required": ["city", "unit"],
                "properties": {
                    "city": {"type": "string", "maxLength": 40},
                    "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
                },
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "book_table",
            "description": "Book a restaurant table",
            "parameters": {
                "type": "object",
                "required": ["restaurant", "people"],
                "properties": {
                    "restaurant": {"type": "string", "maxLength": 40},
                    "people": {"type": "integer", "minimum": 1, "maximum": 20},
                    "time": {"type": "string", "pattern": "^[0-2][0-9]:[0-5][0-9]$"},
                },
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "convert_currency",
            "description": "Convert an amount",
            "parameters": {
                "type": "object",
                "required": ["amount", "from", "to"],
                "properties": {
                    "amount": {"type": "number", "minimum": 0, "maximum": 1000000},
                    "from": {"type": "string", "enum": ["EUR", "USD", "GBP", "JPY"]},
                    "to": {"type": "string", "enum": ["EUR", "USD", "GBP", "JPY"]},
                },
            },
        },
    },
]
PROMPTS = [
    "What's the weather in {c}?",
    "Book a table for {n} at {c} Bistro.",
    "Convert {n} euros to dollars.",
    "I am going to {c} tomorrow, anything I should know?",
    "Help me plan dinner for {n} people in {c}.",
]
CITIES = ["Paris", "Tokyo", "Lima", "Oslo", "Cairo", "Austin", "Pune", "Perth"]


def one_call(client: openai.OpenAI, model: str, i: int, max_tokens: int) -> dict:
    prompt = PROMPTS[i % len(PROMPTS)].format(c=CITIES[i % len(CITIES)], n=2 + i % 7)
    reply = client.chat.completions.create(
        model=model,
        messages=[{"role": "user", "content": prompt}],
        tools=TOOLS,
        tool_choice="required",
        parallel_tool_calls=False,
        max_tokens=max_tokens,
        temperature=1.0,
        seed=i,
    )
    choice, error = reply.choices[0], ""
    try:
        call = choice.message.tool_calls[0]
        schema = next(t["function"]["parameters"] for t in TOOLS if t["function"]["name"] == call.function.name)
        jsonschema.validate(json.loads(call.function.arguments), schema)
        name = call.function.name
    except Exception as exc:  # any failure to produce a valid call counts against the target
        name, error = "", f"{type(exc).__name__}: {exc}"[:200]
    return {
        "i": i,
        "valid": not error,
        "tool": name,
        "finish_reason": choice.finish_reason,
        "error": error,
        "text": "" if not error else (choice.message.content or "")[-200:],
        "completion_tokens": reply.usage.completion_tokens,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--url", default="", help="a running stack's base URL; empty: start one here")
    ap.add_argument("--num-calls", type=int, default=200)
    ap.add_argument("--concurrency", type=int, default=8)
    ap.add_argument("--max-tokens", type=int, default=120, help="each request's budget; a cut-off call is invalid")
    ap.add_argument("--json", required=True)
    args = ap.parse_args()
    from tandem.launcher import served_name

    with ExitStack() as stack:
        url = args.url or stack.enter_context(_stack(args.model))
        client = stack.enter_context(openai.OpenAI(base_url=f"{url}/v1", api_key="x", max_retries=0, timeout=300))
        start = time.perf_counter()
        with ThreadPoolExecutor(args.concurrency) as pool:
            rows = list(
                pool.map(lambda i: one_call(client, served_name(args.model), i, args.max_tokens), range(args.num_calls))
            )
        elapsed = time.perf_counter() - start
    num_valid = sum(r["valid"] for r in rows)
    by_tool = {t["function"]["name"]: sum(r["tool"] == t["function"]["name"] for r in rows) for t in TOOLS}
    summary = {
        "num_calls": len(rows),
        "num_valid": num_valid,
        "valid_pct": round(100 * num_valid / len(rows), 2),
        "finish_tool_calls": sum(r["finish_reason"] == "tool_calls" for r in rows),
        "by_tool": by_tool,
        "elapsed_s": round(elapsed, 1),
        "concurrency": args.concurrency,
        "max_tokens": args.max_tokens,
    }
    print(f"{'calls':>6} {'valid':>6} {'valid %':>8} {'finish=tool_calls':>18} {'elapsed s':>10}  by tool")
    print(
        f"{summary['num_calls']:>6} {num_valid:>6} {summary['valid_pct']:>8} {summary['finish_tool_calls']:>18} "
        f"{summary['elapsed_s']:>10}  {by_tool}"
    )
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps({"summary": summary, "tools": TOOLS, "rows": rows}, indent=1) + "\n")


def _stack(model: str):
    from contextlib import contextmanager

    from tandem.launcher import StackConfig
    from tandem.stack_run import make_stack

    @contextmanager
    def running():
        cfg = StackConfig(
            model=model,
            port=_free_port(),
            num_prefill=0,
            num_decode=1,
            num_threads=1,
            log_dir=Path(tempfile.mkdtemp()) / "logs",
            ready_timeout_s=180,
        )
        s = make_stack(cfg)
        try:
            s.start()
            s.wait_ready()
            yield s.url
        finally:
            s.stop()

    return running()


def _free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


if __name__ == "__main__":
    main()
