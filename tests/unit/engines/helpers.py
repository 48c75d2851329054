"""Test helpers: run requests through a real native engine (its loop on a thread) and collect their tokens."""

import asyncio

from engines.base import EngineRequest, SamplingParams
from engines.base.engine_configs import BatchConfig
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


async def started(model_dir, *, process: bool = False, overlap: bool = False, **kw) -> EngineClient:
    kw.setdefault("num_blocks", 256)
    batch = BatchConfig(**{f: kw.pop(f) for f in BatchConfig.__slots__ if f in kw})  # the tests' flat keywords
    config = EngineConfig(model=str(model_dir), batch=batch, **kw)
    engine = EngineClient(native_spec(config), process=process, overlap=overlap)
    await engine.start()
    return engine
