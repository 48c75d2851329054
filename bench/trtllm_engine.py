"""`bench/gpu_engine.py --engine trtllm`: the trtllm engine (engines/trtllm, TensorRT-LLM underneath) measured
the way the native engine is, through tandem's adapter: batch-1 decode, prefill, and offline throughput at the
shapes of TensorRT-LLM's own published figures, each compared with that figure in the same table. Needs a
CUDA host with tensorrt_llm (NVIDIA's container); --dry-run drives the same code on CPU over the tests' fake
of tensorrt_llm (what CI runs: it checks the benchmark, not TensorRT-LLM).

    python bench/gpu_engine.py --engine trtllm --json bench/out/trtllm-engine.json        # random-weight 8B shape
    python bench/gpu_engine.py --engine trtllm --model /models/Llama-3.1-8B-Instruct-FP8  # the anchors' checkpoint
"""

import asyncio
import json
import random
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script from anywhere

# TensorRT-LLM perf-overview (v1.0): Llama-3.1-8B FP8 on one H100, output tok/s (/work/shared/ANCHORS.md)
ANCHORS = {(128, 128): 28312, (128, 2048): 22714, (1000, 1000): 15220, (2048, 128): 3450}


@dataclass(frozen=True, slots=True)
class TrtPlan:
    decode_prompt: int
    decode_tokens: int
    prefill_lens: tuple[int, ...]
    offline: tuple[tuple[int, int, int], ...]  # (num_requests, input_len, output_len)
    max_num_seqs: int
    max_model_len: int
    max_num_batched_tokens: int


GPU_PLAN = TrtPlan(128, 128, (2048, 8192), ((1024, 128, 128), (512, 1000, 1000)), 512, 10240, 8192)
DRY_PLAN = TrtPlan(16, 8, (32, 64), ((4, 8, 8), (2, 16, 16)), 4, 128, 128)


def engine_for(model: Path, plan: TrtPlan, api=None, dtype: str = "bfloat16", kv: str = "auto"):
    from engines.base.engine_configs import BatchConfig, CacheConfig
    from engines.trtllm import TrtllmConfig, TrtllmEngine
    from engines.trtllm.config import TrtllmOptions

    batch = BatchConfig(plan.max_num_seqs, plan.max_num_batched_tokens, plan.max_model_len)
    config = TrtllmConfig(
        model=str(model),
        dtype=dtype,
        batch=batch,
        cache=CacheConfig(block_size=32),
        trtllm=TrtllmOptions(kv_cache_dtype=kv, cache_transceiver="off"),
    )
    return TrtllmEngine(config, api=api)


async def one(engine, req_id: str, prompt: tuple[int, ...], n_out: int) -> tuple[float, float, int]:
    """(seconds to the first token, seconds to the last, tokens) of one greedy request that ignores EOS."""
    from engines.base import EngineRequest, SamplingParams

    start, first, n = time.perf_counter(), None, 0
    async for out in engine.add_request(
        EngineRequest(req_id, prompt, SamplingParams(max_tokens=n_out, ignore_eos=True))
    ):
        n += len(out.new_token_ids)
        first = first or time.perf_counter() - start
    return first or 0.0, time.perf_counter() - start, n


def prompts(num: int, length: int, vocab: int, seed: int = 0) -> list[tuple[int, ...]]:
    rng = random.Random(seed)  # NOTE: random ids, so no prompt shares a cached prefix with another
    return [tuple(rng.randrange(vocab) for _ in range(length)) for _ in range(num)]


async def measure(engine, plan: TrtPlan, vocab: int) -> list[dict]:
    rows = []
    await one(engine, "warm-up", prompts(1, plan.decode_prompt, vocab, 99)[0], 4)
    first, total, n = await one(engine, "decode", prompts(1, plan.decode_prompt, vocab)[0], plan.decode_tokens)
    rows.append(row("decode batch 1", f"{plan.decode_prompt} in", (n - 1) / max(total - first, 1e-9), "tok/s"))
    for length in plan.prefill_lens:
        ttft, _, _ = await one(engine, f"prefill-{length}", prompts(1, length, vocab, length)[0], 1)
        rows.append(row("prefill", f"{length} tokens", length / ttft, "tok/s"))
    for num, n_in, n_out in plan.offline:
        batch = prompts(num, n_in, vocab, num + n_in)
        start = time.perf_counter()
        done = await asyncio.gather(*(one(engine, f"off-{n_in}-{i}", p, n_out) for i, p in enumerate(batch)))
        rate = sum(n for _, _, n in done) / (time.perf_counter() - start)
        rows.append(row("offline", f"{num} x {n_in}/{n_out}", rate, "output tok/s", ANCHORS.get((n_in, n_out))))
    return rows


def row(section: str, config: str, value: float, unit: str, anchor: float | None = None) -> dict:
    return {
        "section": section,
        "config": config,
        "value": value,
        "unit": unit,
        "anchor": anchor,
        "fraction": value / anchor if anchor else None,
    }


def render(rows: list[dict]) -> str:
    lines = [
        "| section | config | value | unit | anchor (TensorRT-LLM, 8B FP8, H100) | fraction |",
        "|---|---|---:|---|---:|---:|",
    ]
    lines += [
        f"| {r['section']} | {r['config']} | {r['value']:.1f} | {r['unit']} | "
        f"{r['anchor'] or '-'} | {'-' if r['fraction'] is None else format(r['fraction'], '.3f')} |"
        for r in rows
    ]
    return "\n".join(lines)


async def run(model: Path, plan: TrtPlan, api=None, kv: str = "auto") -> list[dict]:
    engine = engine_for(model, plan, api, kv=kv)
    await engine.start()
    try:
        vocab = json.loads((model / "config.json").read_text()).get("vocab_size", 32000)
        return await measure(engine, plan, vocab)
    finally:
        await engine.shutdown()


def main(model: Path | None, dry_run: bool, json_path: Path | None, kv: str = "auto") -> int:
    from engines.trtllm.config import TRTLLM_VERSION
    from tandem.models.init import init_model

    api, plan, device = None, GPU_PLAN, "cuda"
    if dry_run:
        from tests.unit.engines.trtllm.fake_trtllm import fake_api

        api, plan, device = fake_api(), DRY_PLAN, "cpu (dry run, fake tensorrt_llm)"
    with tempfile.TemporaryDirectory() as tmp:
        if model is None:  # speed does not depend on the weights' values
            model = init_model(
                Path(tmp) / "m", "llama", tiny=dry_run, shape=None if dry_run else "llama-3.1-8b", dtype="bfloat16"
            )
        rows = asyncio.run(run(model, plan, api, kv))
    if not dry_run:
        import torch

        device = torch.cuda.get_device_name()
    print(f"device: {device}  engine: trtllm (TensorRT-LLM {TRTLLM_VERSION})  model: {model}")
    print(render(rows))
    if json_path:
        json_path.parent.mkdir(parents=True, exist_ok=True)
        json_path.write_text(
            json.dumps(
                {
                    "device": device,
                    "engine": "trtllm",
                    "trtllm_version": TRTLLM_VERSION,
                    "model": str(model),
                    "plan": repr(plan),
                    "rows": rows,
                },
                indent=2,
            )
            + "\n"
        )
    return 0
