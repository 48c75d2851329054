"""Quantized variants of a model against its reference: top-1 agreement and mean KL divergence of the
next-token distributions at every position of a fixed prompt set. Prints a table, writes JSON.

    python bench/quant_quality.py [--model DIR] [--json bench/out/quant-quality.json]

Variants: FP8 weights (W8A8, per-channel / per-token), FP8 KV cache (E4M3, per-layer scales from the
checkpoint, else 1.0), the FP8 KV cache with scales from `tandem model calibrate` (on the built-in
corpus, not on the scored prompts), NVFP4 weights (W4A16). The quantized checkpoints are written by the offline
transform into a temporary directory. Runs wherever the engine runs (CPU: the reference paths).
"""

import argparse
import json
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from engines.base.engine_configs import CacheConfig

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script from anywhere

from engines.native.config import EngineConfig  # noqa: E402
from engines.native.quant.transform import quantize_checkpoint  # noqa: E402
from engines.native.runner import build_core, prompt_logits  # noqa: E402

PROMPTS = (
    "The capital of France is",
    "Photosynthesis is the process by which plants",
    'def fibonacci(n):\n    """Return the n-th Fibonacci number."""\n',
    "Once upon a time, in a small village by the sea, there lived",
    "The three laws of thermodynamics state that",
    "To make a cup of tea, first boil the water, then",
    "In 1969, Apollo 11 landed on the Moon. The astronauts",
    "Q: What is 17 multiplied by 3?\nA:",
    "The main differences between TCP and UDP are",
    "Dear hiring manager, I am writing to apply for the position of",
    "A healthy breakfast usually includes",
    "Translate to French: 'Good morning, how are you?'\nFrench:",
    "The mitochondria is often called the powerhouse of the cell because",
    "SELECT name, COUNT(*) FROM orders GROUP BY",
    "The best way to learn a new programming language is",
    "Rain forms when water vapour in the atmosphere",
)
VARIANTS = ("fp8-weights", "fp8-kv", "fp8-kv-calibrated", "nvfp4-weights")


@dataclass(frozen=True, slots=True)
class Quality:
    variant: str
    num_positions: int
    top1_agreement: float  # fraction of positions whose argmax equals the reference's
    mean_kl: float  # mean over positions of KL(reference || variant), nats
    max_kl: float
    seconds: float


def compare(ref: list[torch.Tensor], ours: list[torch.Tensor], variant: str, seconds: float) -> Quality:
    """ref/ours: per prompt [num_positions, vocab] logits."""
    r, o = torch.cat(ref).float(), torch.cat(ours).float()
    log_p, log_q = r.log_softmax(-1), o.log_softmax(-1)
    kl = (log_p.exp() * (log_p - log_q)).sum(-1).clamp(min=0)  # [num_positions]
    agree = (r.argmax(-1) == o.argmax(-1)).float().mean().item()
    return Quality(variant, r.shape[0], agree, kl.mean().item(), kl.max().item(), seconds)


def prompt_ids(model_dir: Path, prompts=PROMPTS) -> list[list[int]]:
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
    return [tok.encode(p, add_special_tokens=False).ids for p in prompts]


def run_logits(model_dir: Path, token_ids: list[list[int]], dtype: str, **engine) -> tuple[list[torch.Tensor], float]:
    start = time.perf_counter()
    core = build_core(EngineConfig(model=str(model_dir), dtype=dtype, **engine, cache=CacheConfig(num_blocks=64)))
    logits = [prompt_logits(core, ids) for ids in token_ids]
    return logits, time.perf_counter() - start


def measure(model_dir: Path, variants=VARIANTS, dtype: str = "float32", prompts=PROMPTS) -> list[Quality]:
    token_ids = prompt_ids(model_dir, prompts)
    ref, ref_s = run_logits(model_dir, token_ids, dtype)
    results = [compare(ref, ref, "reference", ref_s)]
    with tempfile.TemporaryDirectory() as tmp:
        for variant in variants:
            if variant == "fp8-kv":
                ours, secs = run_logits(model_dir, token_ids, dtype, kv_cache_dtype="fp8")
            elif variant == "fp8-kv-calibrated":
                ours, secs = run_logits(
                    calibrated_copy(model_dir, Path(tmp) / variant, dtype), token_ids, dtype, kv_cache_dtype="fp8"
                )
            else:
                quantized = quantize_checkpoint(model_dir, Path(tmp) / variant, variant.removesuffix("-weights"))
                ours, secs = run_logits(quantized, token_ids, dtype)
            results.append(compare(ref, ours, variant, secs))
    return results


def calibrated_copy(model_dir: Path, dst: Path, dtype: str) -> Path:
    """model_dir's files (weights linked, not copied) with scales calibrated on the built-in corpus."""
    from engines.native.quant.calibrate import calibrate_checkpoint
    from tandem.models.cli import calibration_ids

    dst.mkdir(parents=True)
    for path in model_dir.iterdir():
        if path.is_file() and path.name != "tandem_quant.json":
            (dst / path.name).symlink_to(path.resolve())
    calibrate_checkpoint(dst, calibration_ids(dst, None, 64), dtype=dtype)
    return dst


def table(results: list[Quality]) -> str:
    lines = [
        "| variant | positions | top-1 agreement | mean KL (nats) | max KL | seconds |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    lines += [
        f"| {q.variant} | {q.num_positions} | {q.top1_agreement:.4f} | {q.mean_kl:.5f} | {q.max_kl:.4f} | "
        f"{q.seconds:.1f} |"
        for q in results
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, default=None, help="checkpoint dir (default: the fetched SmolLM2)")
    parser.add_argument(
        "--dtype",
        default="float32",
        choices=["float32", "bfloat16"],
        help="compute dtype of every variant (the checkpoint's bf16 weights are exact in both)",
    )
    parser.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=VARIANTS)
    parser.add_argument("--num-prompts", type=int, default=len(PROMPTS))
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    model_dir = args.model
    if model_dir is None:
        from tandem.models.fetch import fetch_model

        model_dir = fetch_model()
    results = measure(Path(model_dir), args.variants, args.dtype, PROMPTS[: args.num_prompts])
    print(f"model: {model_dir}  compute dtype: {args.dtype}  prompts: {args.num_prompts}")
    print(table(results))
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        payload = {
            "model": str(model_dir),
            "dtype": args.dtype,
            "prompts": list(PROMPTS[: args.num_prompts]),
            "results": [asdict(q) for q in results],
        }
        args.json.write_text(json.dumps(payload, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
