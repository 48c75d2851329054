"""A request's greedy output does not depend on what it is batched with: alone, among 16 requests
of mixed lengths, with chunked prefill on or off, on a prefix-cache hit, and after preemption."""

import pytest
import torch

from tests.unit.engines.helpers import greedy, run_batch, started

LENGTHS = (1, 2, 5, 8, 13, 16, 17, 24, 31, 32, 33, 47, 64, 70, 90, 100)  # 16 requests
NUM_NEW = 24


def mixed_prompts(vocab_size: int) -> list[list[int]]:
    gen = torch.Generator().manual_seed(7)
    return [torch.randint(0, vocab_size, (n,), generator=gen).tolist() for n in LENGTHS]


async def outputs(model_dir, prompts, one_at_a_time=False, **engine_kw) -> list[list[int]]:
    engine = await started(model_dir, **engine_kw)
    try:
        if one_at_a_time:
            return [(await run_batch(engine, [p], greedy(NUM_NEW), prefix=f"a{i}-"))[0] for i, p in enumerate(prompts)]
        return await run_batch(engine, prompts, greedy(NUM_NEW))
    finally:
        await engine.shutdown()


async def test_alone_batched_chunked_unchunked_agree(tiny_llama):
    prompts = mixed_prompts(vocab_size=400)
    alone = await outputs(tiny_llama, prompts, one_at_a_time=True, enable_prefix_caching=False)
    batched = await outputs(tiny_llama, prompts, max_num_batched_tokens=48)  # many chunks
    unchunked = await outputs(
        tiny_llama, prompts, enable_chunked_prefill=False, max_num_batched_tokens=4096, enable_prefix_caching=False
    )
    assert batched == alone
    assert unchunked == alone


async def test_prefix_cache_hit_gives_same_output(tiny_llama):
    prompts = mixed_prompts(vocab_size=400)
    shared = prompts[-1][:64]  # four full blocks
    family = [shared + p[:9] for p in prompts[:6]]
    engine = await started(tiny_llama)
    try:
        cold = await run_batch(engine, family[:1], greedy(NUM_NEW), prefix="cold")
        warm = await run_batch(engine, family, greedy(NUM_NEW), prefix="warm")
        stats = engine.stats()
    finally:
        await engine.shutdown()
    assert stats.prefix_hits >= 6 * 64  # every warm request reused the shared four blocks
    no_cache = await outputs(tiny_llama, family, enable_prefix_caching=False)
    assert warm == no_cache
    assert cold[0] == no_cache[0]


async def test_preempted_requests_finish_with_same_output(tiny_llama):
    prompts = mixed_prompts(vocab_size=400)
    roomy = await outputs(tiny_llama, prompts, enable_prefix_caching=False)
    # 16 requests need ~60 blocks of 16 tokens at full length; 24 forces preemption by recompute
    engine = await started(tiny_llama, num_blocks=24, max_num_batched_tokens=64)
    try:
        tight = await run_batch(engine, prompts, greedy(NUM_NEW))
        assert engine.stats().num_preemptions > 0
    finally:
        await engine.shutdown()
    assert tight == roomy


@pytest.mark.slow
async def test_smollm2_alone_batched_chunked_unchunked_agree(smollm2_dir):
    """The real model, where a batch crosses the packed/dense GEMM switch (engines/native/layers/linear.py)."""

    lengths = (3, 9, 17, 30, 45, 64, 80, 100, 120, 140, 160, 180, 200, 230, 260, 300)
    gen = torch.Generator().manual_seed(11)
    prompts = [torch.randint(0, 49152, (n,), generator=gen).tolist() for n in lengths]
    kw = {"num_blocks": 512, "enable_prefix_caching": False}
    alone = await outputs(smollm2_dir, prompts, one_at_a_time=True, **kw)
    batched = await outputs(smollm2_dir, prompts, max_num_batched_tokens=96, **kw)
    unchunked = await outputs(smollm2_dir, prompts, enable_chunked_prefill=False, max_num_batched_tokens=8192, **kw)
    assert batched == alone
    assert unchunked == alone
