"""Export a request's KV from one engine, import it into another, continue decoding: the output
is identical to never having moved it. Held blocks are freed on release and on lease expiry."""

import asyncio

import pytest
import torch

from engines.base import EngineRequest, FinishReason, KvLayoutMismatchError, RequestNotFoundError
from tests.unit.engines.helpers import collect, greedy, started

TOTAL = 40


def prompt(n: int = 37) -> list[int]:
    return torch.randint(0, 400, (n,), generator=torch.Generator().manual_seed(3)).tolist()


async def test_export_import_continues_identically(tiny_llama):
    """The first-token seam: prefill only (hold_kv) with the user's params, then the user's prompt, the first
    token as output_token_ids and the same params on another engine, after the imported KV."""
    p = prompt()
    source, target = await started(tiny_llama), await started(tiny_llama)
    try:
        reference, _ = await collect(source, EngineRequest("ref", tuple(p), greedy(TOTAL)))
        first, last = await collect(source, EngineRequest("pre", tuple(p), greedy(TOTAL), hold_kv=True))
        assert len(first) == 1 and last.finish_reason is FinishReason.PREFILLED
        assert source.stats().num_held == 1
        kv = await source.export_kv("pre")
        await source.release_kv("pre")
        assert kv.token_ids == tuple(p)
        rest, last = await collect(
            target, EngineRequest("dec", tuple(p), greedy(TOTAL), kv=kv, output_token_ids=tuple(first))
        )
        assert last.num_cached_tokens == kv.num_tokens == last.num_prompt_tokens == len(p)
        assert target.stats().num_prompt_tokens_computed == 0  # nothing of the prompt recomputed on the target
        assert source.stats().num_held == 0
    finally:
        await source.shutdown()
        await target.shutdown()
    assert first + rest == reference


async def test_a_first_token_that_ends_the_request_holds_nothing(tiny_llama):
    engine = await started(tiny_llama)
    try:
        tokens, last = await collect(engine, EngineRequest("one", tuple(prompt()), greedy(1), hold_kv=True))
        assert len(tokens) == 1 and last.finish_reason is FinishReason.LENGTH
        assert engine.stats().num_held == 0 and engine.stats().num_blocks_used == 0
    finally:
        await engine.shutdown()


async def test_held_kv_expires_and_is_freed(tiny_llama):
    engine = await started(tiny_llama, held_kv_ttl_s=0.05)
    try:
        await collect(engine, EngineRequest("h", tuple(prompt()), greedy(4), hold_kv=True))
        for _ in range(100):
            if engine.stats().num_held == 0:
                break
            await asyncio.sleep(0.02)
        assert engine.stats().num_held == 0
        with pytest.raises(RequestNotFoundError):
            await engine.export_kv("h")
    finally:
        await engine.shutdown()


async def test_import_rejects_mismatched_layout(tiny_llama, tiny_model_factory):
    source, other = await started(tiny_llama), await started(tiny_model_factory("llama-mqa"))
    try:
        await collect(source, EngineRequest("h", tuple(prompt()), greedy(4), hold_kv=True))
        kv = await source.export_kv("h")
        with pytest.raises(KvLayoutMismatchError):
            other.add_request(EngineRequest("x", kv.token_ids, greedy(4), kv=kv, output_token_ids=(1,)))
    finally:
        await source.shutdown()
        await other.shutdown()
