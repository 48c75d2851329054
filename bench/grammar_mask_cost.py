"""Per-token mask cost of the two grammar libraries made for constrained decoding (llguidance, xgrammar), at
SmolLM2's 49k vocabulary and at a 128k one, walking a JSON-schema-valid answer token by token. Prints a table and
writes JSON; it decides nothing by itself (docs/structured-outputs.md reads it). No network: the 128k vocabulary is
SmolLM2's BPE grown with merges of its own tokens, which is what a mask computation sees of any byte-level BPE.

  python bench/grammar_mask_cost.py --model DIR --json bench/results/grammar-mask-cost.json [--xgrammar-path P]
"""

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

SCHEMA = {
    "type": "object",
    "additionalProperties": False,
    "required": ["name", "age", "tags", "address"],
    "properties": {
        "name": {"type": "string"},
        "age": {"type": "integer"},
        "tags": {"type": "array", "items": {"type": "string"}},
        "address": {
            "type": "object",
            "required": ["city", "zip"],
            "properties": {"city": {"type": "string"}, "zip": {"type": "string"}},
        },
    },
}
ANSWER = json.dumps(
    {
        "name": "Ada Lovelace",
        "age": 36,
        "tags": ["mathematics", "engines", "poetry"],
        "address": {"city": "London", "zip": "W1"},
    }
)
LARGE_VOCAB = 128256  # Llama 3's


def grown_tokenizer_json(path: Path, vocab_size: int) -> str:
    """SmolLM2's tokenizer.json with merges of pairs of its tokens appended until `vocab_size` (deterministic)."""
    spec = json.loads(path.read_text())
    vocab, merges = spec["model"]["vocab"], spec["model"]["merges"]
    base = sorted(vocab, key=vocab.get)[256:20000]  # byte-level pieces past the single bytes
    i = 0
    while len(vocab) < vocab_size:
        a, b = base[i % len(base)], base[(i // len(base) + 1) * 7919 % len(base)]  # every pair once
        i += 1
        if a + b in vocab:
            continue
        vocab[a + b] = len(vocab)
        merges.append([a, b] if merges and isinstance(merges[0], list) else f"{a} {b}")
    return json.dumps(spec)


def time_llguidance(tokenizer_json: str, answer_ids: list[int], eos: int) -> dict:
    import llguidance
    import llguidance.numpy as llnp

    t0 = time.perf_counter()
    tok = llguidance.LLTokenizer(tokenizer_json, eos_token=eos)
    t1 = time.perf_counter()
    matcher = llguidance.LLMatcher(tok, llguidance.grammar_from("json_schema", json.dumps(SCHEMA)))
    t2 = time.perf_counter()
    mask = llnp.allocate_token_bitmask(1, tok.vocab_size)
    times = []
    for token in answer_ids:
        s = time.perf_counter()
        llnp.fill_next_token_bitmask(matcher, mask, 0)
        times.append(time.perf_counter() - s)
        assert matcher.consume_token(token), matcher.get_error()
    return _summary("llguidance", tok.vocab_size, t1 - t0, t2 - t1, times)


def time_xgrammar(tokenizer_json: str, answer_ids: list[int], eos: int) -> dict:
    import torch
    import xgrammar as xgr
    from tokenizers import Tokenizer

    torch.set_num_threads(1)
    t0 = time.perf_counter()
    backend = Tokenizer.from_str(tokenizer_json)
    vocab = sorted(backend.get_vocab(with_added_tokens=True).items(), key=lambda kv: kv[1])
    encoded = [piece for piece, _ in vocab]  # byte-level pieces as the vocabulary spells them
    info = xgr.TokenizerInfo(encoded, xgr.VocabType.BYTE_LEVEL, vocab_size=len(encoded), stop_token_ids=[eos])
    t1 = time.perf_counter()
    compiled = xgr.GrammarCompiler(info, max_threads=1).compile_json_schema(json.dumps(SCHEMA))
    matcher = xgr.GrammarMatcher(compiled)
    t2 = time.perf_counter()
    mask = xgr.allocate_token_bitmask(1, info.vocab_size)
    times = []
    for token in answer_ids:
        s = time.perf_counter()
        matcher.fill_next_token_bitmask(mask, 0)
        times.append(time.perf_counter() - s)
        assert matcher.accept_token(token)
    return _summary("xgrammar", info.vocab_size, t1 - t0, t2 - t1, times)


def _summary(library: str, vocab_size: int, tokenizer_s: float, compile_s: float, times: list[float]) -> dict:
    us = sorted(t * 1e6 for t in times)
    return {
        "library": library,
        "vocab_size": vocab_size,
        "tokenizer_setup_ms": round(tokenizer_s * 1e3, 1),
        "compile_ms": round(compile_s * 1e3, 1),
        "num_tokens": len(us),
        "mask_us_p50": round(statistics.median(us), 1),
        "mask_us_p90": round(us[int(0.9 * (len(us) - 1))], 1),
        "mask_us_max": round(us[-1], 1),
        "mask_us_mean": round(statistics.fmean(us), 1),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", required=True, help="a model directory with tokenizer.json (SmolLM2)")
    ap.add_argument("--json", required=True)
    ap.add_argument("--xgrammar-path", default="", help="a folder holding xgrammar, when it is not installed")
    args = ap.parse_args()
    if args.xgrammar_path:
        sys.path.insert(0, args.xgrammar_path)
    from tokenizers import Tokenizer

    path = Path(args.model) / "tokenizer.json"
    small = path.read_text()
    eos = Tokenizer.from_str(small).token_to_id("<|im_end|>")
    rows = []
    for tokenizer_json in (small, grown_tokenizer_json(path, LARGE_VOCAB)):
        answer_ids = Tokenizer.from_str(tokenizer_json).encode(ANSWER).ids + [eos]
        for fn in (time_llguidance, time_xgrammar):
            fn(tokenizer_json, answer_ids, eos)  # warm-up: first-use caches
            rows.append(fn(tokenizer_json, answer_ids, eos))
    print(
        f"{'library':<11} {'vocab':>7} {'tok setup ms':>12} {'compile ms':>10} {'p50 us':>8} {'p90 us':>8} "
        f"{'max us':>8}"
    )
    for r in rows:
        print(
            f"{r['library']:<11} {r['vocab_size']:>7} {r['tokenizer_setup_ms']:>12} {r['compile_ms']:>10} "
            f"{r['mask_us_p50']:>8} {r['mask_us_p90']:>8} {r['mask_us_max']:>8}"
        )
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps({"schema": SCHEMA, "answer": ANSWER, "rows": rows}, indent=1) + "\n")


if __name__ == "__main__":
    main()
