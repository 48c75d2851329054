"""`tandem bench engine --speculative ngram|draft:DIR`: the native engine with speculative decoding against the same
engine without it, alternated in one run, on a copy-heavy workload (edit a given text) and chat (greedy, and sampled so
that nothing copies); plus transformers' prompt lookup or assisted generation at batch 1. Greedy outputs must match."""

import asyncio
import logging
import time
from pathlib import Path

from engines.base.types import EngineRequest, SamplingParams
from tandem.bench.spec_report import Run, SpecWorkload, format_table, row

log = logging.getLogger(__name__)
DOCS = Path(__file__).resolve().parents[2] / "docs"
TOPICS = (
    "the sea",
    "autumn",
    "a lighthouse",
    "bread",
    "a city at night",
    "snow",
    "a library",
    "the moon",
    "a train journey",
    "gardens",
    "rain",
    "mountains",
    "a market",
    "bees",
    "the desert",
    "a river",
)
ASKS = ("Write a short poem about {}.", "Tell me a story about {}.")


def passages(num: int, min_words: int = 90, max_words: int = 150) -> list[str]:
    """Paragraphs of the repository's own docs: the texts the copy-heavy requests edit."""
    found: list[str] = []
    for path in sorted(DOCS.glob("*.md")):
        for para in path.read_text().split("\n\n"):
            words = para.split()
            if min_words <= len(words) <= max_words and not para.lstrip().startswith(("|", "```", "#")):
                found.append(para.strip())
    if len(found) < num:
        raise SystemExit(f"only {len(found)} doc paragraphs of {min_words}-{max_words} words; need {num}")
    return found[:num]


def chat_ids(tokenizer, text: str) -> list[int]:
    ids = tokenizer.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True)
    return list(ids["input_ids"] if hasattr(ids, "keys") else ids)


def copy_prompts(tokenizer, num: int) -> list[list[int]]:
    return [
        chat_ids(tokenizer, f"Rewrite the following text, keeping its words but fixing any spelling mistakes:\n\n{p}")
        for p in passages(num)
    ]


def chat_prompts(tokenizer, num: int) -> list[list[int]]:
    return [
        chat_ids(tokenizer, ASKS[i % 2].format(TOPICS[i % len(TOPICS)] + ("" if i < 16 else " in winter")))
        for i in range(num)
    ]


def params_for(w: SpecWorkload, i: int) -> SamplingParams:
    """Greedy with EOS honoured; or sampled (top-p 0.95) with request i's own seed, as many tokens each time."""
    if w.is_greedy:
        return SamplingParams(max_tokens=w.osl)
    return SamplingParams(max_tokens=w.osl, temperature=w.temperature, top_p=0.95, seed=i, ignore_eos=True)


async def run_native(model_dir: Path, prompts: list[list[int]], w: SpecWorkload, speculative: str, threads: int) -> Run:
    """All prompts through a fresh engine (batch 1: one after another); a short warm-up first."""
    from tandem.bench.native_runner import make_engine

    engine = make_engine(
        model_dir,
        "float32",
        threads,
        max_num_seqs=w.concurrency,
        max_len=max(map(len, prompts)) + w.osl,
        speculative=speculative,
    )
    await engine.start()
    try:
        await _generate(engine, prompts[:1], [SamplingParams(max_tokens=4)], "warm")
        before = engine.stats()
        start = time.perf_counter()
        if w.concurrency == 1:
            outputs = [(await _generate(engine, [p], [params_for(w, i)], f"r{i}-"))[0] for i, p in enumerate(prompts)]
        else:
            outputs = await _generate(engine, prompts, [params_for(w, i) for i in range(len(prompts))], "r")
        seconds = time.perf_counter() - start
        after = engine.stats()
    finally:
        await engine.shutdown()
    return Run(
        outputs,
        seconds,
        after.num_spec_proposed - before.num_spec_proposed,
        after.num_spec_accepted - before.num_spec_accepted,
        after.num_spec_verify_steps - before.num_spec_verify_steps,
    )


async def _generate(engine, prompts: list[list[int]], params: list[SamplingParams], prefix: str) -> list[list[int]]:
    async def one(i: int, prompt: list[int]) -> list[int]:
        tokens: list[int] = []
        async for out in engine.add_request(EngineRequest(f"{prefix}{i}", tuple(prompt), params[i])):
            if out.error is not None:
                raise RuntimeError(f"request {prefix}{i} failed: {out.error}")
            tokens.extend(out.new_token_ids)
        return tokens

    return list(await asyncio.gather(*(one(i, p) for i, p in enumerate(prompts))))


def run_transformers(model_dir: Path, prompts: list[list[int]], osl: int, speculative: str, threads: int) -> Run:
    """Batch 1, one prompt after another: greedy `generate`, with prompt lookup (ngram) or the draft as assistant."""
    import torch
    from transformers import AutoModelForCausalLM

    from engines.core.speculative import parse_speculative

    torch.set_num_threads(threads)

    def load(d):
        return AutoModelForCausalLM.from_pretrained(str(d), dtype=torch.float32).eval()

    model, (method, draft_dir) = load(model_dir), parse_speculative(speculative)
    extra = {"prompt_lookup_num_tokens": 10} if method == "ngram" else {}
    if method == "draft":
        extra = {"assistant_model": load(draft_dir)}
    outputs, seconds = [], 0.0
    with torch.inference_mode():
        model.generate(torch.tensor([prompts[0]]), max_new_tokens=4, do_sample=False, **extra)  # warm-up
        for prompt in prompts:
            start = time.perf_counter()
            out = model.generate(
                torch.tensor([prompt]),
                max_new_tokens=osl,
                do_sample=False,
                attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
                **extra,
            )
            seconds += time.perf_counter() - start
            outputs.append(out[0, len(prompt) :].tolist())
    return Run(outputs, seconds)


# -- the comparison --------------------------------------------------------------------------
WORKLOADS = {
    "copy": SpecWorkload("copy-heavy, batch 1", "copy", 4, 1, 256),
    "chat": SpecWorkload("chat, batch 1", "chat", 4, 1, 128),
    "chat32": SpecWorkload("chat, 32 concurrent", "chat", 32, 32, 128),
    # NOTE: SmolLM2-135M's greedy chat repeats its own lines (prompt lookup finds them); sampled, nothing copies
    "sampled": SpecWorkload("chat sampled T=0.8, batch 1", "chat", 4, 1, 128, temperature=0.8),
    "sampled32": SpecWorkload("chat sampled T=0.8, 32 conc.", "chat", 32, 32, 128, temperature=0.8),
}


def compare(
    model_dir: Path,
    speculative: str,
    threads: int,
    repeats: int,
    with_transformers: bool,
    names: list[str],
    on_row=lambda report: None,
) -> dict:
    """Each named workload on the plain and the speculating engine, alternated `repeats` times (a neighbour's burst
    hits one pair, not one side), each run in a fresh process; transformers at batch 1, greedy. `on_row` sees the
    report after each workload (a long run on a loaded host keeps what it measured)."""
    from transformers import AutoTokenizer

    from tandem.bench.engine_bench import _in_fresh_process

    tokenizer = AutoTokenizer.from_pretrained(str(model_dir))
    rows: list[dict] = []
    report = {
        "model": str(model_dir),
        "speculative": speculative,
        "threads": threads,
        "repeats": repeats,
        "workloads": rows,
    }
    for name in names:
        w = WORKLOADS[name]
        prompts = (copy_prompts if w.kind == "copy" else chat_prompts)(tokenizer, w.num_requests)
        runs: dict[str, list[Run]] = {"": [], speculative: []}
        for _ in range(repeats):
            for method in ("", speculative):
                run = _in_fresh_process(_native_main, model_dir, prompts, w, method, threads)
                log.info("%s, %s: %.2f tok/s", w.name, method or "plain", run.tokens_per_s)
                runs[method].append(run)
        result = row(w, runs[""], runs[speculative])
        if with_transformers and w.concurrency == 1 and w.is_greedy:
            for key, method in (("transformers_tok_s", ""), ("transformers_spec_tok_s", speculative)):
                hf = _in_fresh_process(run_transformers, model_dir, prompts, w.osl, method, threads)
                result[key] = hf.tokens_per_s
        rows.append(result)
        on_row(report)
    return report


def _native_main(*args) -> Run:
    import torch

    torch.set_num_threads(args[4])
    return asyncio.run(run_native(*args))


def cmd_bench_spec(args) -> int:
    import json

    from engines.core.speculative import parse_speculative
    from tandem.bench.engine_args import resolve_model
    from tandem.bench.jsonsafe import json_safe

    parse_speculative(args.speculative)  # NOTE: a bad value fails before any model loads
    names = [n for n in args.spec_workloads.split(",") if n]
    if unknown := set(names) - WORKLOADS.keys():
        raise SystemExit(f"unknown --spec-workloads {sorted(unknown)}; known: {', '.join(WORKLOADS)}")

    def write(report: dict) -> None:
        if args.json is not None:
            args.json.parent.mkdir(parents=True, exist_ok=True)
            args.json.write_text(json.dumps(json_safe(report), indent=2) + "\n")

    report = compare(
        resolve_model(args.model),
        args.speculative,
        args.threads,
        args.repeats,
        "transformers" in args.engines,
        names,
        on_row=write,
    )
    print(format_table(report))
    if args.json is not None:
        print(f"\nwrote {args.json}")
    return 0
