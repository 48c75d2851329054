"""Test helpers: run requests through a real native engine (its loop on a thread) and collect their tokens."""

import asyncio
from dataclasses import replace

from engines.base import EngineRequest, SamplingParams
from engines.core.client import EngineClient
from engines.native import native_spec
from engines.native.config import EngineConfig


def greedy(max_tokens: int, **kw) -> SamplingParams:
    return SamplingParams(max_tokens=max_tokens, ignore_eos=True, **kw)


async def collect(engine: EngineClient, request: EngineRequest):
    tokens, last = [], None
    async for out in engine.add_request(request):
        tokens.extend(out.new_token_ids)
        last = out
    return tokens, last


async def run_batch(engine: EngineClient, prompts, params: SamplingParams, prefix: str = "r") -> list[list[int]]:
    requests = [EngineRequest(f"{prefix}{i}", tuple(p), params) for i, p in enumerate(prompts)]
    results = await asyncio.gather(*(collect(engine, r) for r in requests))
    return [tokens for tokens, _ in results]


def native_config(model_dir, **kw) -> EngineConfig:
    """An EngineConfig from the tests' flat keywords, each sub-config's taken into it (the rest as they are)."""
    base = EngineConfig(model=str(model_dir))
    subs = {
        name: replace(getattr(base, name), **{f: kw.pop(f) for f in getattr(base, name).__slots__ if f in kw})
        for name in ("batch", "cache", "transfer", "speculation")
    }
    return EngineConfig(model=str(model_dir), **subs, **kw)


async def started(model_dir, *, process: bool = False, overlap: bool = False, **kw) -> EngineClient:
    kw.setdefault("num_blocks", 256)
    config = native_config(model_dir, **kw)
    engine = EngineClient(native_spec(config), process=process, overlap=overlap)
    await engine.start()
    return engine
