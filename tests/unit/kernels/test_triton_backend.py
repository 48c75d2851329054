"""The Triton attention backend inside the real engine (CPU interpreter): same logits and the same
greedy tokens as the torch reference backend, with chunked prefill, prefix-cache hits, GQA and an
FP8 KV cache."""
import pytest
import torch

from engines.native.config import EngineConfig
from engines.native.runner import build_core
from engines.native.runner import prompt_logits as logits_of
from tests.unit.engines.helpers import greedy, run_batch, started

PROMPT = list(range(3, 30))
REL = 1e-4  # fp32 both ways; only the summation order differs


def prompt_logits(model_dir, **kw) -> torch.Tensor:
    return logits_of(build_core(EngineConfig(model=str(model_dir), num_blocks=16, block_size=4, **kw)), PROMPT)


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
        engine = await started(model_dir, attention_backend=backend, block_size=4, num_blocks=64,
                               max_num_batched_tokens=12)
        try:
            first = await run_batch(engine, prompts[:1], greedy(6), prefix="a")
            rest = await run_batch(engine, prompts[1:], greedy(6), prefix="b")
            assert engine.stats().prefix_hits > 0
        finally:
            await engine.shutdown()
        tokens[backend] = first + rest
    assert tokens["triton"] == tokens["torch"]
