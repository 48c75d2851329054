"""TrtllmEngine over the fake tensorrt_llm: streaming, stop rules, abort, prefill -> decode handover through
TensorRT-LLM's own transceiver, held KV, stats and KV events as the worker and router read them."""

import asyncio
import importlib.util

import pytest

from engines.base import (
    Engine,
    EngineError,
    EngineRequest,
    EngineUnavailableError,
    FinishReason,
    InvalidRequestError,
    RequestNotFoundError,
    SamplingParams,
)
from engines.base.block_hash import chain_block_hashes
from engines.base.engine_configs import CacheConfig, TransferConfig
from engines.base.events import KvEventKind
from engines.transfer import transports
from engines.trtllm import TrtllmConfig, TrtllmEngine
from engines.trtllm.config import TrtllmOptions
from tests.unit.engines.trtllm import fake_trtllm
from tests.unit.engines.trtllm.fake_trtllm import fake_api, next_token

PROMPT = tuple(range(100, 140))  # 40 tokens: two full blocks of 16 and a partial one


@pytest.fixture(autouse=True)
def fresh_fake():
    fake_trtllm._Transceiver.held.clear()
    fake_trtllm.LLM.instances.clear()


async def make(model, **kw) -> TrtllmEngine:
    engine = TrtllmEngine(TrtllmConfig(model=str(model), cache=CacheConfig(num_blocks=64), **kw), api=fake_api())
    await engine.start()
    return engine


async def collect(engine, request):
    return [out async for out in engine.add_request(request)]


def toy(prompt, n):
    tokens, last = [], prompt[-1]
    for _ in range(n):
        last = next_token(last)
        tokens.append(last)
    return tokens


def tokens_of(outs):
    return [t for o in outs for t in o.new_token_ids]


def greedy(n, **kw):
    return SamplingParams(max_tokens=n, ignore_eos=True, **kw)


async def endless(engine):
    """A slow request that would run for long, and its first output."""
    fake_trtllm.LLM.instances[0].step_delay = 0.01
    stream = engine.add_request(EngineRequest("r", PROMPT, greedy(1000)))
    return stream, await stream.__anext__()


async def test_it_streams_the_models_tokens_and_passes_the_request_as_mapped(tiny_llama):
    engine = await make(tiny_llama)
    outs = await collect(engine, EngineRequest("r", PROMPT, greedy(6)))
    assert tokens_of(outs) == toy(PROMPT, 6) and outs[-1].finish_reason is FinishReason.LENGTH
    assert all(len(o.new_token_ids) == 1 for o in outs) and all(o.num_prompt_tokens == 40 for o in outs)
    llm = fake_trtllm.LLM.instances[0]
    inputs, sampling, disagg = llm.submitted[0]
    assert inputs == list(PROMPT) and disagg is None
    assert (sampling.max_tokens, sampling.ignore_eos, sampling.end_id, sampling.detokenize) == (6, True, 2, False)
    assert llm.kwargs["max_seq_len"] == 512 and llm.kwargs["kv_cache_config"].tokens_per_block == 16
    assert isinstance(engine, Engine) and engine.capabilities.kv_events
    await engine.shutdown()
    assert llm.is_shut_down


async def test_the_models_eos_stops_it_unless_ignored(tiny_llama):
    engine = await make(tiny_llama)
    fake_trtllm.LLM.instances[0].forced[next_token(PROMPT[-1])] = 2  # the second token is EOS
    outs = await collect(engine, EngineRequest("a", PROMPT, SamplingParams(max_tokens=8)))
    assert tokens_of(outs)[-1] == 2 and len(tokens_of(outs)) == 2 and outs[-1].finish_reason is FinishReason.STOP
    outs = await collect(engine, EngineRequest("b", PROMPT, greedy(4)))
    assert len(tokens_of(outs)) == 4 and outs[-1].finish_reason is FinishReason.LENGTH
    await engine.shutdown()


async def test_abort_ends_the_stream_and_cancels_the_request_in_tensorrt_llm(tiny_llama):
    engine = await make(tiny_llama)
    stream, first = await endless(engine)
    await engine.abort("r")
    rest = [out async for out in stream]
    assert first.finish_reason is None and rest[-1].finish_reason is FinishReason.ABORT
    assert fake_trtllm.LLM.instances[0].live[0].abort_calls == 1
    assert engine.stats().num_running == 0
    await engine.shutdown()


async def test_a_consumer_that_leaves_early_aborts_the_request(tiny_llama):
    engine = await make(tiny_llama)
    stream, _ = await endless(engine)
    await stream.aclose()
    assert fake_trtllm.LLM.instances[0].live[0].abort_calls == 1 and "r" not in engine._live
    await engine.shutdown()


async def test_prefill_then_decode_on_another_engine_gives_the_tokens_of_one_run(tiny_llama):
    prefill, decode, alone = await make(tiny_llama), await make(tiny_llama), await make(tiny_llama)
    params = greedy(6)
    held = await collect(prefill, EngineRequest("r", PROMPT, params, hold_kv=True))
    assert len(held) == 1 and held[0].finish_reason is FinishReason.PREFILLED and held[0].kv_handle
    assert prefill.stats().num_held == 1
    first = held[0].new_token_ids
    rest = await collect(decode, EngineRequest("r", PROMPT, params, output_token_ids=first, kv=held[0].kv_handle))
    whole = await collect(alone, EngineRequest("r", PROMPT, params))
    assert list(first) + tokens_of(rest) == tokens_of(whole) and rest[-1].finish_reason is FinishReason.LENGTH
    assert all(o.num_cached_tokens == 40 for o in rest)  # the prompt's KV came over, none computed
    _, _, disagg = fake_trtllm.LLM.instances[1].submitted[0]
    assert disagg.request_type == "generation_only" and disagg.opaque_state == b"\x00\x01fake-ucx-endpoint"
    assert decode.stats().num_prompt_tokens_computed == 0 and prefill.stats().num_prompt_tokens_computed == 40
    await prefill.release_kv("r")
    assert prefill.stats().num_held == 0
    with pytest.raises(RequestNotFoundError):
        await prefill.release_kv("r")
    for engine in (prefill, decode, alone):
        await engine.shutdown()


async def test_held_kv_nobody_takes_is_let_go_after_the_lease(tiny_llama):
    engine = await make(tiny_llama, transfer=TransferConfig(transports.TRTLLM, held_kv_ttl_s=0.05))
    await collect(engine, EngineRequest("r", PROMPT, greedy(4), hold_kv=True))
    assert engine.stats().num_held == 1
    await asyncio.sleep(0.1)
    assert engine.stats().num_held == 0 and fake_trtllm.LLM.instances[0].live[0].abort_calls == 1
    await engine.shutdown()


async def test_a_decode_whose_kv_is_gone_fails_clearly(tiny_llama):
    prefill, decode = await make(tiny_llama), await make(tiny_llama)
    held = (await collect(prefill, EngineRequest("r", PROMPT, greedy(4), hold_kv=True)))[-1]
    fake_trtllm._Transceiver.held.clear()  # e.g. the prefill worker restarted
    outs = await collect(
        decode, EngineRequest("r", PROMPT, greedy(4), output_token_ids=held.new_token_ids, kv=held.kv_handle)
    )
    assert outs[-1].finish_reason is FinishReason.ERROR and "no KV to receive" in outs[-1].error
    await prefill.shutdown()
    await decode.shutdown()


async def test_without_a_cache_transceiver_it_neither_holds_nor_takes_kv(tiny_llama):
    engine = await make(tiny_llama, trtllm=TrtllmOptions(cache_transceiver="off"))
    with pytest.raises(InvalidRequestError, match="without a cache transceiver"):
        engine.add_request(EngineRequest("r", PROMPT, greedy(4), hold_kv=True))
    assert "cache_transceiver_config" not in fake_trtllm.LLM.instances[0].kwargs
    await engine.shutdown()


@pytest.mark.parametrize(
    "request_,message",
    [
        (EngineRequest("r", (), greedy(4)), "prompt is empty"),
        (EngineRequest("r", tuple(range(512)), greedy(4)), "context holds 512"),
        (EngineRequest("r", tuple(range(500)), greedy(20), output_token_ids=tuple(range(12))), "fill the context"),
        (EngineRequest("r", PROMPT, SamplingParams(max_tokens=4, min_tokens=2)), "min_tokens"),
        (EngineRequest("r", (1, 512), greedy(4)), r"prompt token ids must be in \[0, 512\)"),
        (EngineRequest("r", (1, 2), greedy(4), output_token_ids=(-1,)), r"must be in \[0, 512\)"),
    ],
)
async def test_bad_requests_are_refused_at_once(tiny_llama, request_, message):
    engine = await make(tiny_llama)
    with pytest.raises(InvalidRequestError, match=message):
        engine.add_request(request_)
    assert fake_trtllm.LLM.instances[0].submitted == []
    await engine.shutdown()


async def test_unseeded_sampled_requests_get_their_own_seeds(tiny_llama):
    engine = await make(tiny_llama)
    for i in range(2):
        await collect(engine, EngineRequest(f"r{i}", PROMPT, SamplingParams(max_tokens=2, temperature=1.0)))
    await collect(engine, EngineRequest("s", PROMPT, SamplingParams(max_tokens=2, temperature=1.0, seed=7)))
    seeds = [sampling.seed for _, sampling, _ in fake_trtllm.LLM.instances[0].submitted]
    assert seeds[0] != seeds[1] and seeds[2] == 7
    await engine.shutdown()


async def test_stats_and_kv_events_reach_the_worker_with_tandems_block_hashes(tiny_llama):
    engine = await make(tiny_llama)
    await collect(engine, EngineRequest("a", PROMPT, greedy(3)))
    await asyncio.wait_for(engine.wait_kv_events(0), 5)
    events = await engine.kv_events_since(0)
    assert [(e.kind, e.block_hashes) for e in events] == [(KvEventKind.STORED, tuple(chain_block_hashes(PROMPT, 16)))]
    again = await collect(engine, EngineRequest("b", PROMPT, greedy(3)))
    assert again[-1].num_cached_tokens == 32  # two full blocks reused
    await asyncio.sleep(0.2)  # the stats poller's next drain
    s = engine.stats()
    assert (s.num_blocks_total, s.num_blocks_used, s.num_running, s.num_waiting) == (64, 0, 0, 0)
    assert (s.prefix_queries, s.prefix_hits, s.num_prompt_tokens_computed, s.num_generated_tokens) == (80, 32, 48, 6)
    assert s.block_size == 16 and s.max_model_len == 512
    assert (await engine.kv_snapshot()).seq == events[-1].seq
    await engine.shutdown()


async def test_not_started_and_export_kv_are_clear_errors(tiny_llama):
    engine = TrtllmEngine(TrtllmConfig(model=str(tiny_llama)), api=fake_api())
    with pytest.raises(EngineError, match="not started"):
        engine.add_request(EngineRequest("r", PROMPT, greedy(2)))
    with pytest.raises(EngineError, match="moves its KV itself"):
        await engine.export_kv("r")
    assert engine.kv_layout.block_size == 16 and engine.kv_layout.dtype == "bfloat16"
    assert engine.stats().num_blocks_total == 0  # before TensorRT-LLM reports


def test_a_host_without_tensorrt_llm_is_told_what_to_install(tiny_llama, monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "tensorrt_llm" else real(name, *a)
    )
    with pytest.raises(EngineUnavailableError) as info:
        TrtllmEngine(TrtllmConfig(model="/does/not/matter"))
    message = str(info.value)
    assert "tensorrt_llm package, which is not installed" in message and "\n" not in message
    assert "nvcr.io/nvidia/tensorrt-llm/release:1.2.1" in message and "pip install tensorrt-llm==1.2.1" in message


def test_it_runs_on_cuda_only(tiny_llama):
    with pytest.raises(EngineUnavailableError, match="--device cuda"):
        TrtllmEngine(TrtllmConfig(model=str(tiny_llama), device="cpu"), api=fake_api())


async def test_a_failed_drain_does_not_stop_the_stats_and_json_text_is_read(tiny_llama):
    engine = await make(tiny_llama)
    calls = {"n": 0}

    async def flaky(timeout=2):
        calls["n"] += 1
        if calls["n"] == 1:
            raise RuntimeError("executor busy")
        yield '{"numActiveRequests": 0, "kvCacheStats": {"maxNumBlocks": 77, "usedNumBlocks": 5}}'

    for task in engine._pollers:
        task.cancel()
    engine._pollers = [asyncio.ensure_future(engine._poll(flaky, engine._on_stats))]
    for _ in range(60):  # the poller backs off a second after a failure
        await asyncio.sleep(0.05)
        if engine.stats().num_blocks_total == 77:
            break
    assert calls["n"] >= 2 and engine.stats().num_blocks_total == 77
    await engine.shutdown()


async def test_shutdown_ends_live_requests_with_abort(tiny_llama):
    engine = await make(tiny_llama)
    stream, _ = await endless(engine)
    await engine.shutdown()
    assert [o.finish_reason async for o in stream][-1] is FinishReason.ABORT
    assert fake_trtllm.LLM.instances[0].is_shut_down


async def test_a_salted_request_reaches_tensorrt_llm_as_its_keyed_root_never_the_salt(tiny_llama):
    from engines.base.block_hash import chain_root

    engine = await make(tiny_llama)
    root = chain_root("tenant-a", "secret")
    await collect(engine, EngineRequest("s", PROMPT, greedy(2, cache_salt="tenant-a"), hash_root=root))
    await collect(engine, EngineRequest("u", PROMPT, greedy(2)))
    assert fake_trtllm.LLM.instances[0].cache_salts == [f"{root:016x}", None]
    await engine.shutdown()
