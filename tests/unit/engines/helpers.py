"""Test helpers: run requests through a real NativeEngine and collect their tokens."""
import asyncio

from engines.base import EngineRequest, SamplingParams
from engines.native.config import EngineConfig
from engines.native.engine import NativeEngine


def greedy(max_tokens: int, **kw) -> SamplingParams:
    return SamplingParams(max_tokens=max_tokens, ignore_eos=True, **kw)


async def collect(engine: NativeEngine, request: EngineRequest):
    tokens, last = [], None
    async for out in engine.add_request(request):
        tokens.extend(out.new_token_ids)
        last = out
    return tokens, last


async def run_batch(engine: NativeEngine, prompts, params: SamplingParams, prefix: str = "r") -> list[list[int]]:
    requests = [EngineRequest(f"{prefix}{i}", tuple(p), params) for i, p in enumerate(prompts)]
    results = await asyncio.gather(*(collect(engine, r) for r in requests))
    return [tokens for tokens, _ in results]


async def started(model_dir, **kw) -> NativeEngine:
    kw.setdefault("num_blocks", 256)
    engine = NativeEngine(EngineConfig(model=str(model_dir), **kw))
    await engine.start()
    return engine
