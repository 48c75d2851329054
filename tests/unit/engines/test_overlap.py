"""Overlap (step N-1's outputs sent while step N runs) changes when outputs leave the engine, never what they
are: the same requests give the same tokens with it on and off, on CPU, through chunked prefill, prefix hits,
seeded sampling and preemption."""

import asyncio

from engines.base import EngineRequest, SamplingParams
from tests.unit.engines.helpers import collect, started

PROMPTS = [tuple(range(3 + i, 40 + 7 * i)) for i in range(6)] + [tuple(range(3, 40))]  # the last: a prefix hit


async def run_all(model_dir, overlap: bool) -> list[list[int]]:
    engine = await started(model_dir, overlap=overlap, num_blocks=24, max_num_batched_tokens=64)
    try:
        requests = [
            EngineRequest(
                f"r{i}",
                p,
                SamplingParams(
                    max_tokens=12,
                    ignore_eos=True,
                    temperature=0.8,
                    seed=i if i % 2 else None,
                    top_k=1 if i % 2 == 0 else 0,
                ),
            )
            for i, p in enumerate(PROMPTS)
        ]
        results = await asyncio.gather(*(collect(engine, r) for r in requests))
        return [tokens for tokens, _ in results], engine.stats()
    finally:
        await engine.shutdown()


async def test_tokens_are_identical_with_overlap_on_and_off(tiny_llama):
    (plain, plain_stats), (overlapped, overlapped_stats) = (
        await run_all(tiny_llama, False),
        await run_all(tiny_llama, True),
    )
    assert plain == overlapped and all(len(t) == 12 for t in plain)
    assert (plain_stats.num_preemptions, plain_stats.prefix_hits) == (
        overlapped_stats.num_preemptions,
        overlapped_stats.prefix_hits,
    )
    assert plain_stats.num_preemptions > 0 and plain_stats.prefix_hits > 0  # the cases worth checking happened
