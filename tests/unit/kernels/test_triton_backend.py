"""The Triton backend inside the real engine (its kernels on the GPU when there is one, Triton's CPU
interpreter otherwise): same logits and the same greedy tokens as the torch reference backend, with
chunked prefill, prefix-cache hits, GQA, an FP8 KV cache, the fused RoPE + KV write, residual RMSNorm
and SiLU-mul, and split-KV decode."""

import pytest
import torch

from engines.base.engine_configs import CacheConfig
from engines.native.config import EngineConfig
from engines.native.runner import build_core
from engines.native.runner import prompt_logits as logits_of
from tests.unit.engines.helpers import greedy, run_batch, started

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"  # NOTE: compiled Triton cannot read CPU tensors
PROMPT = list(range(3, 30))
REL = 1e-4  # fp32 both ways; only the summation order differs


def prompt_logits(model_dir, **kw) -> torch.Tensor:
    config = EngineConfig(
        model=str(model_dir), device=DEVICE, cuda_graphs=False, **kw, cache=CacheConfig(num_blocks=16, block_size=4)
    )
    return logits_of(build_core(config), PROMPT)


@pytest.mark.parametrize("kv_cache_dtype", ["auto", "fp8"])
def test_prompt_logits_match_torch_backend(tiny_llama, kv_cache_dtype):
    ref = prompt_logits(tiny_llama, attention_backend="torch", kv_cache_dtype=kv_cache_dtype)
    ours = prompt_logits(tiny_llama, attention_backend="triton", kv_cache_dtype=kv_cache_dtype)
    assert ((ours - ref).norm() / ref.norm()).item() < REL


async def test_greedy_tokens_match_torch_backend(tiny_model_factory):
    model_dir = tiny_model_factory("llama-mqa")
    shared = list(range(10, 26))  # 4 full blocks: the second request continues a cached prefix
    prompts = [shared + [40, 41, 42], list(range(50, 57)), shared + [60]]
    tokens = {}
    for backend in ("torch", "triton"):
        engine = await started(
            model_dir,
            device=DEVICE,
            attention_backend=backend,
            block_size=4,
            num_blocks=64,
            max_num_batched_tokens=12,
            cuda_graphs=False,
        )
        try:
            first = await run_batch(engine, prompts[:1], greedy(6), prefix="a")
            rest = await run_batch(engine, prompts[1:], greedy(6), prefix="b")
            assert engine.stats().prefix_hits > 0
        finally:
            await engine.shutdown()
        tokens[backend] = first + rest
    assert tokens["triton"] == tokens["torch"]


# NOTE: 64 tokens on a GPU; the interpreter spends ~0.5 s on each decode step, so CI decodes fewer
NUM_GREEDY = 64 if DEVICE == "cuda" else 24


async def test_greedy_tokens_of_a_long_decode_match_torch_backend(tiny_llama):
    """Decode crosses several 16-token cache blocks, and its context splits across programs."""
    prompt = list(range(5, 45))
    tokens = {}
    for backend in ("torch", "triton"):
        engine = await started(tiny_llama, device=DEVICE, attention_backend=backend, num_blocks=32, cuda_graphs=False)
        try:
            tokens[backend] = await run_batch(engine, [prompt], greedy(NUM_GREEDY))
        finally:
            await engine.shutdown()
    assert len(tokens["torch"][0]) == NUM_GREEDY
    assert tokens["triton"] == tokens["torch"]
