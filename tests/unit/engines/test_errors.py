"""Bad input raises a typed error with a clear message, and the engine keeps serving others."""

import asyncio
import json

import pytest

from engines.base import (
    EngineRequest,
    InvalidRequestError,
    ModelNotFoundError,
    SamplingParams,
    UnsupportedArchitectureError,
)
from engines.core.client import EngineClient
from engines.native import native_spec
from engines.native.config import EngineConfig
from tests.unit.engines.helpers import collect, greedy, started


def NativeEngine(config: EngineConfig) -> EngineClient:
    return EngineClient(native_spec(config))


BAD_REQUESTS = [
    ((), greedy(4), "prompt is empty"),
    (tuple(range(10)) * 52, greedy(4), "context holds 512"),  # 520 tokens, max_model_len 512
    ((1, 2, 3), SamplingParams(max_tokens=0), "max_tokens must be >= 1"),
    ((1, 2, 3), SamplingParams(top_p=0.0), "top_p must be in (0, 1]"),
    ((1, 2, 3), SamplingParams(top_p=1.5), "top_p must be in (0, 1]"),
    ((1, 2, 3), SamplingParams(temperature=-1.0), "temperature must be >= 0"),
    ((1, 10**9), greedy(4), "prompt token ids must be in"),
]


@pytest.mark.parametrize("prompt,params,message", BAD_REQUESTS)
async def test_bad_request_is_rejected_while_others_run(tiny_llama, prompt, params, message):
    engine = await started(tiny_llama)
    try:
        good = asyncio.ensure_future(collect(engine, EngineRequest("good", (5, 6, 7), greedy(16))))
        await asyncio.sleep(0)
        with pytest.raises(InvalidRequestError, match=message.replace("(", r"\(").replace(")", r"\)")):
            engine.add_request(EngineRequest("bad", prompt, params))
        tokens, last = await good
        assert len(tokens) == 16 and last.finish_reason.value == "length"
    finally:
        await engine.shutdown()


async def test_duplicate_request_id_is_rejected(tiny_llama):
    engine = await started(tiny_llama)
    try:
        stream = engine.add_request(EngineRequest("same", (1, 2), greedy(8)))
        with pytest.raises(InvalidRequestError, match="already in use"):
            engine.add_request(EngineRequest("same", (1, 2), greedy(8)))
        tokens = [t async for out in stream for t in out.new_token_ids]
        assert len(tokens) == 8
    finally:
        await engine.shutdown()


def test_unknown_model_directory(tmp_path):
    with pytest.raises(ModelNotFoundError, match="no config.json"):
        NativeEngine(EngineConfig(model=str(tmp_path / "nope")))


def test_unsupported_architecture(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"architectures": ["GPT2LMHeadModel"]}))
    with pytest.raises(UnsupportedArchitectureError, match="GPT2LMHeadModel"):
        NativeEngine(EngineConfig(model=str(tmp_path)))


def test_missing_weights(tiny_llama, tmp_path):
    (tmp_path / "config.json").write_text((tiny_llama / "config.json").read_text())
    with pytest.raises(ModelNotFoundError, match="no \\*.safetensors"):
        NativeEngine(EngineConfig(model=str(tmp_path)))


async def test_abort_ends_stream_and_frees_blocks(tiny_llama):
    engine = await started(tiny_llama)
    try:
        stream = engine.add_request(EngineRequest("a", tuple(range(40)), greedy(400)))
        first = await stream.__anext__()
        await engine.abort("a")
        rest = [out async for out in stream]
        assert rest[-1].finish_reason.value == "abort"
        assert len(first.new_token_ids) + sum(len(o.new_token_ids) for o in rest) < 400
        await asyncio.sleep(0.1)
        stats = engine.stats()
        assert stats.num_running == 0 and stats.num_blocks_used == 0
    finally:
        await engine.shutdown()


async def test_failed_step_fails_its_requests_and_leaves_no_stale_cache(tiny_llama):
    prompt = tuple(range(3, 40))  # two full blocks, registered in the cache when scheduled
    fresh = await started(tiny_llama)
    try:
        reference, _ = await collect(fresh, EngineRequest("ref", prompt, greedy(8)))
    finally:
        await fresh.shutdown()
    engine = await started(tiny_llama)
    try:
        runner = engine.channel.core.runner  # NOTE: the engine thread's runner, reached in-process
        real_launch = runner.model_runner.launch
        calls = {"n": 0}

        def failing_once(out):
            calls["n"] += 1
            if calls["n"] == 1:
                raise RuntimeError("simulated device fault")
            return real_launch(out)

        runner.model_runner.launch = failing_once
        _, last = await collect(engine, EngineRequest("boom", prompt, greedy(8)))
        assert last.finish_reason.value == "error" and "simulated device fault" in last.error
        # the failed step's blocks were never written: a hit on them would corrupt this output
        again, last = await collect(engine, EngineRequest("again", prompt, greedy(8)))
        assert last.num_cached_tokens == 0
        assert again == reference
        assert engine.stats().num_blocks_used == 0
    finally:
        await engine.shutdown()
