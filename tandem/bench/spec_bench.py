"""`tandem bench engine --speculative ngram`: the native engine with speculative decoding against the same engine
without it, in one run, on a copy-heavy workload (edit a given text) and a no-copy chat workload, greedy; plus
transformers' own prompt lookup (`prompt_lookup_num_tokens`) at batch 1. Checks the outputs are identical."""
import asyncio
import logging
import time
from dataclasses import dataclass
from pathlib import Path

from engines.base.types import EngineRequest, SamplingParams

log = logging.getLogger(__name__)
DOCS = Path(__file__).resolve().parents[2] / "docs"
TOPICS = ("the sea", "autumn", "a lighthouse", "bread", "a city at night", "snow", "a library", "the moon",
          "a train journey", "gardens", "rain", "mountains", "a market", "bees", "the desert", "a river")
ASKS = ("Write a short poem about {}.", "Tell me a story about {}.")


@dataclass(frozen=True, slots=True)
class Run:
    """One workload on one engine: its outputs, wall time and speculation counters."""

    outputs: list[list[int]]
    seconds: float
    proposed: int = 0
    accepted: int = 0
    verify_steps: int = 0

    @property
    def num_tokens(self) -> int:
        return sum(len(o) for o in self.outputs)

    @property
    def tokens_per_s(self) -> float:
        return self.num_tokens / self.seconds


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
    return [chat_ids(tokenizer, "Rewrite the following text, keeping its words but fixing any spelling "
                                f"mistakes:\n\n{p}") for p in passages(num)]


def chat_prompts(tokenizer, num: int) -> list[list[int]]:
    return [chat_ids(tokenizer, ASKS[i % 2].format(TOPICS[i % len(TOPICS)] + ("" if i < 16 else " in winter")))
            for i in range(num)]


async def run_native(model_dir: Path, prompts: list[list[int]], osl: int, speculative: str, threads: int,
                     concurrency: int) -> Run:
    """All prompts at once through a fresh engine, greedy, EOS honoured; a short warm-up first."""
    from tandem.bench.native_runner import make_engine

    engine = make_engine(model_dir, "float32", threads, max_num_seqs=concurrency,
                         max_len=max(map(len, prompts)) + osl, speculative=speculative)
    await engine.start()
    try:
        await _generate(engine, prompts[:1], 4, "warm")
        before = engine.stats()
        start = time.perf_counter()
        if concurrency == 1:  # NOTE: batch 1: one request after another
            outputs = [(await _generate(engine, [p], osl, f"r{i}-"))[0] for i, p in enumerate(prompts)]
        else:
            outputs = await _generate(engine, prompts, osl, "r")
        seconds = time.perf_counter() - start
        after = engine.stats()
    finally:
        await engine.shutdown()
    return Run(outputs, seconds, after.num_spec_proposed - before.num_spec_proposed,
               after.num_spec_accepted - before.num_spec_accepted,
               after.num_spec_verify_steps - before.num_spec_verify_steps)


async def _generate(engine, prompts: list[list[int]], osl: int, prefix: str) -> list[list[int]]:
    params = SamplingParams(max_tokens=osl)

    async def one(i: int, prompt: list[int]) -> list[int]:
        tokens: list[int] = []
        async for out in engine.add_request(EngineRequest(f"{prefix}{i}", tuple(prompt), params)):
            if out.error is not None:
                raise RuntimeError(f"request {prefix}{i} failed: {out.error}")
            tokens.extend(out.new_token_ids)
        return tokens

    return list(await asyncio.gather(*(one(i, p) for i, p in enumerate(prompts))))


def run_transformers(model_dir: Path, prompts: list[list[int]], osl: int, lookup: int, threads: int) -> Run:
    """Batch 1, one prompt after another: greedy `generate`, with prompt lookup when `lookup` > 0."""
    import torch
    from transformers import AutoModelForCausalLM

    torch.set_num_threads(threads)
    model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32).eval()
    extra = {"prompt_lookup_num_tokens": lookup} if lookup else {}
    outputs, seconds = [], 0.0
    with torch.inference_mode():
        model.generate(torch.tensor([prompts[0]]), max_new_tokens=4, do_sample=False, **extra)  # warm-up
        for prompt in prompts:
            start = time.perf_counter()
            out = model.generate(torch.tensor([prompt]), max_new_tokens=osl, do_sample=False,
                                 attention_mask=torch.ones(1, len(prompt), dtype=torch.long), **extra)
            seconds += time.perf_counter() - start
            outputs.append(out[0, len(prompt):].tolist())
    return Run(outputs, seconds)


# -- the comparison --------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class SpecWorkload:
    name: str
    kind: str  # "copy" | "chat"
    num_requests: int
    concurrency: int  # 1: batch 1, one request after another
    osl: int


WORKLOADS = (SpecWorkload("copy-heavy, batch 1", "copy", 4, 1, 256),
             SpecWorkload("chat, batch 1", "chat", 4, 1, 128),
             SpecWorkload("chat, 32 concurrent", "chat", 32, 32, 128))


def compare(model_dir: Path, speculative: str, threads: int, repeats: int, with_transformers: bool,
            on_row=lambda report: None) -> dict:
    """Every workload on the plain and the speculating engine, alternating, `repeats` times (the best run of each
    kept: the machine may be shared), each run in a fresh process; transformers' prompt lookup on the copy-heavy
    one. `on_row` sees the report after each workload (a long run on a loaded host keeps what it measured)."""
    from tandem.bench.engine_bench import _in_fresh_process

    from tokenizers import Tokenizer  # noqa: F401  (transformers' tokenizer needs it; fail early and clearly)
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(model_dir))
    rows: list[dict] = []
    report = {"model": str(model_dir), "speculative": speculative, "threads": threads, "repeats": repeats,
              "greedy": True, "workloads": rows}
    for w in WORKLOADS:
        prompts = (copy_prompts if w.kind == "copy" else chat_prompts)(tokenizer, w.num_requests)
        runs: dict[str, list[Run]] = {"plain": [], speculative: []}
        for _ in range(repeats):
            for method in ("", speculative):
                run = _in_fresh_process(_native_main, model_dir, prompts, w.osl, method, threads, w.concurrency)
                log.info("%s, %s: %.1f tok/s", w.name, method or "plain", run.tokens_per_s)
                runs[method or "plain"].append(run)
        row = _row(w, max(runs["plain"], key=lambda r: r.tokens_per_s), max(runs[speculative],
                                                                             key=lambda r: r.tokens_per_s))
        if with_transformers and w.kind == "copy":
            row["transformers_tok_s"] = _in_fresh_process(run_transformers, model_dir, prompts, w.osl, 0,
                                                          threads).tokens_per_s
            lookup = _in_fresh_process(run_transformers, model_dir, prompts, w.osl, 10, threads)
            row["transformers_prompt_lookup_tok_s"] = lookup.tokens_per_s
        rows.append(row)
        on_row(report)
    return report


def _native_main(*args) -> Run:
    import torch

    torch.set_num_threads(args[4])
    return asyncio.run(run_native(*args))


def _row(w: SpecWorkload, plain: Run, spec: Run) -> dict:
    return {"workload": w.name, "num_requests": w.num_requests, "concurrency": w.concurrency, "osl": w.osl,
            "output_tokens": plain.num_tokens, "plain_tok_s": plain.tokens_per_s, "spec_tok_s": spec.tokens_per_s,
            "speedup": spec.tokens_per_s / plain.tokens_per_s, "identical": spec.outputs == plain.outputs,
            "proposed": spec.proposed, "accepted": spec.accepted,
            "acceptance_rate": spec.accepted / spec.proposed if spec.proposed else 0.0,
            "mean_accepted_len": spec.accepted / spec.verify_steps if spec.verify_steps else 0.0}


def format_table(report: dict) -> str:
    head = (f"{'workload':<22}{'plain tok/s':>12}{'spec tok/s':>12}{'speedup':>9}{'identical':>10}"
            f"{'accept':>8}{'mean len':>9}{'HF tok/s':>10}{'HF lookup':>10}")
    lines = [f"model {report['model']}, speculative={report['speculative']}, threads={report['threads']}, "
             f"best of {report['repeats']}, greedy", head, "-" * len(head)]
    for r in report["workloads"]:
        hf = r.get("transformers_tok_s")
        hf_cells = f"{hf:>10.1f}{r['transformers_prompt_lookup_tok_s']:>10.1f}" if hf else f"{'-':>10}{'-':>10}"
        lines.append(f"{r['workload']:<22}{r['plain_tok_s']:>12.1f}{r['spec_tok_s']:>12.1f}{r['speedup']:>8.2f}x"
                     f"{str(r['identical']):>10}{r['acceptance_rate']:>8.2f}{r['mean_accepted_len']:>9.2f}{hf_cells}")
    return "\n".join(lines)


def cmd_bench_spec(args) -> int:
    import json

    from tandem.bench.engine_bench import _resolve_model
    from tandem.bench.jsonsafe import json_safe

    def write(report: dict) -> None:
        if args.json is not None:
            args.json.parent.mkdir(parents=True, exist_ok=True)
            args.json.write_text(json.dumps(json_safe(report), indent=2) + "\n")

    report = compare(_resolve_model(args.model), args.speculative, args.threads, args.repeats,
                     "transformers" in args.engines, on_row=write)
    print(format_table(report))
    if args.json is not None:
        print(f"\nwrote {args.json}")
    return 0
