"""A TensorRT-LLM executor that dies, over the fake (whose failure signal, LLM._executor.is_shutdown(), the snapshot
test finds in the release): wait_failed returns, live streams end with ABORT so the gateway moves them, held KV is
dropped, new requests get EngineDiedError (gRPC UNAVAILABLE); a request error alone, or our own shutdown, is not a
death. The decode servicer turns it into what the gateway migrates on."""

import asyncio

import grpc
import pytest

from engines.base import EngineDiedError, EngineError, EngineRequest, FinishReason, SamplingParams
from engines.base.engine_configs import CacheConfig
from engines.trtllm import TrtllmConfig, TrtllmEngine
from engines.trtllm import engine as trtllm_engine
from services.common.convert import delta_from_pb, finish_from_pb
from services.common.protos import common_pb2, worker_pb2, worker_pb2_grpc
from services.decode.server import DecodeService
from services.gateway import errors as gateway_errors
from services.gateway import pipeline as gateway_pipeline
from tests.unit.engines.trtllm import fake_trtllm
from tests.unit.engines.trtllm.fake_trtllm import RequestError, fake_api

PROMPT = tuple(range(100, 140))


@pytest.fixture(autouse=True)
def fresh_fake(monkeypatch):
    fake_trtllm._Transceiver.held.clear()
    fake_trtllm.LLM.instances.clear()
    monkeypatch.setattr(trtllm_engine, "HEALTH_POLL_S", 0.01)


async def make(model, **kw) -> tuple[TrtllmEngine, fake_trtllm.LLM]:
    engine = TrtllmEngine(TrtllmConfig(model=str(model), cache=CacheConfig(num_blocks=64), **kw), api=fake_api())
    await engine.start()
    llm = fake_trtllm.LLM.instances[0]
    llm.step_delay = 0.005
    return engine, llm


def endless(req_id: str) -> EngineRequest:
    return EngineRequest(req_id, PROMPT, SamplingParams(max_tokens=400, ignore_eos=True))


async def rest_of(stream) -> list:
    return [out async for out in stream]


async def test_an_executor_that_dies_quietly_is_seen_and_its_requests_are_handed_back(tiny_llama):
    engine, llm = await make(tiny_llama)
    watcher = asyncio.ensure_future(engine.wait_failed())
    streams = [engine.add_request(endless(r)) for r in ("a", "b")]
    firsts = [await s.__anext__() for s in streams]
    await asyncio.sleep(0.05)
    assert not watcher.done() and all(f.finish_reason is None for f in firsts)
    pumps = [live.pump for live in engine._live.values()]
    llm.fail()  # its requests hang from now on: only the watch can see it
    reason = await asyncio.wait_for(watcher, 2)
    assert "shut down" in reason
    await asyncio.sleep(0)
    assert all(pump.done() for pump in pumps)  # nothing left waiting on the dead executor
    for stream in streams:
        last = (await asyncio.wait_for(rest_of(stream), 2))[-1]
        assert last.finish_reason is FinishReason.ABORT and last.error is None and last.num_prompt_tokens == 40
    with pytest.raises(EngineDiedError, match="shut down"):
        engine.add_request(endless("c"))
    await engine.shutdown()


async def test_a_worker_process_error_only_queued_is_a_death_too(tiny_llama):
    """TensorRT-LLM's proxy queues a dead worker process's error; it shuts down only when the next request comes."""
    engine, llm = await make(tiny_llama)
    stream = engine.add_request(endless("a"))
    await stream.__anext__()
    llm.fail(queued=True)
    assert not llm._executor.is_shutdown()
    assert "background error queued" in await asyncio.wait_for(engine.wait_failed(), 2)
    assert (await rest_of(stream))[-1].finish_reason is FinishReason.ABORT
    await engine.shutdown()


async def test_a_request_failing_on_the_dead_executor_ends_the_watch_at_once(tiny_llama, monkeypatch):
    monkeypatch.setattr(trtllm_engine, "HEALTH_POLL_S", 3600.0)  # NOTE: no poll comes: the failed await tells it
    engine, llm = await make(tiny_llama)
    watcher = asyncio.ensure_future(engine.wait_failed())
    stream = engine.add_request(endless("a"))
    await stream.__anext__()
    llm.fail(RuntimeError("Executor worker died"))
    assert "shut down" in await asyncio.wait_for(watcher, 2)
    assert (await rest_of(stream))[-1].finish_reason is FinishReason.ABORT
    await engine.shutdown()


async def test_a_death_between_the_look_and_the_submission_is_still_a_death(tiny_llama, monkeypatch):
    engine, llm = await make(tiny_llama)
    looks = []
    real = trtllm_engine.executor_failure

    def late(llm_):  # NOTE: the first look (add_request's own) still sees it up; then it dies
        looks.append(1)
        return None if len(looks) == 1 else real(llm_)

    monkeypatch.setattr(trtllm_engine, "executor_failure", late)
    llm.fail()
    with pytest.raises(EngineDiedError):  # generate_async said "LLM is shutting down"
        engine.add_request(endless("a"))
    await engine.shutdown()


async def test_any_other_runtime_error_on_submission_is_an_engine_error(tiny_llama, monkeypatch):
    engine, llm = await make(tiny_llama)

    def broken(*args, **kwargs):
        raise RuntimeError("something else")

    monkeypatch.setattr(llm, "generate_async", broken)
    with pytest.raises(EngineError, match="something else") as refused:
        engine.add_request(endless("a"))
    assert not isinstance(refused.value, EngineDiedError)
    with pytest.raises(asyncio.TimeoutError):  # and the executor is still up
        await asyncio.wait_for(engine.wait_failed(), 0.05)
    await engine.shutdown()


async def test_held_kv_is_let_go_with_the_executor(tiny_llama):
    engine, llm = await make(tiny_llama)
    outs = await rest_of(
        engine.add_request(EngineRequest("p", PROMPT, SamplingParams(max_tokens=4, ignore_eos=True), hold_kv=True))
    )
    assert outs[-1].finish_reason is FinishReason.PREFILLED and engine.stats().num_held == 1
    llm.fail()
    await asyncio.wait_for(engine.wait_failed(), 2)
    assert engine.stats().num_held == 0
    await engine.shutdown()


async def test_a_request_error_fails_that_request_only(tiny_llama):
    engine, llm = await make(tiny_llama)
    watcher = asyncio.ensure_future(engine.wait_failed())
    stream = engine.add_request(endless("a"))
    await stream.__anext__()
    llm.failure = RequestError("this request is bad")  # the executor itself stays up
    last = (await rest_of(stream))[-1]
    assert last.finish_reason is FinishReason.ERROR and "this request is bad" in last.error
    llm.failure = None
    assert (await rest_of(engine.add_request(EngineRequest("b", PROMPT, SamplingParams(max_tokens=3)))))[
        -1
    ].finish_reason is FinishReason.LENGTH
    await asyncio.sleep(0.05)
    assert not watcher.done()
    watcher.cancel()
    await engine.shutdown()


async def test_our_own_shutdown_is_no_failure(tiny_llama):
    engine, _ = await make(tiny_llama)
    watcher = asyncio.ensure_future(engine.wait_failed())
    await engine.shutdown()  # NOTE: it shuts TensorRT-LLM's executor down too
    await asyncio.sleep(0.05)
    assert not watcher.done()
    watcher.cancel()


async def test_the_decode_servicer_hands_the_stream_back_and_refuses_new_ones(tiny_llama):
    """ABORT is the finish reason the gateway migrates on (its pipeline raises WorkerFailedError); UNAVAILABLE it
    routes again on."""
    engine, llm = await make(tiny_llama)
    service = DecodeService(None, engine)
    server = grpc.aio.server()
    worker_pb2_grpc.add_DecodeWorkerServicer_to_server(service, server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    channel = grpc.aio.insecure_channel(f"127.0.0.1:{port}")
    stub = worker_pb2_grpc.DecodeWorkerStub(channel)
    params = common_pb2.SamplingParams(max_tokens=400, ignore_eos=True)
    try:
        call = stub.Generate(worker_pb2.GenerateRequest(req_id="a", token_ids=PROMPT, params=params))
        assert (await call.read()).token_ids
        llm.fail()
        await asyncio.wait_for(engine.wait_failed(), 2)
        last = await call.read()
        while not last.finish_reason:
            last = await call.read()
        assert finish_from_pb(last.finish_reason) is FinishReason.ABORT
        with pytest.raises(gateway_errors.WorkerFailedError):  # what the gateway's pipeline migrates on
            gateway_pipeline._checked(delta_from_pb(last))
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await stub.Generate(worker_pb2.GenerateRequest(req_id="b", token_ids=PROMPT, params=params)).read()
        assert refused.value.code() == grpc.StatusCode.UNAVAILABLE
    finally:
        await channel.close()
        await server.stop(0)
        await engine.shutdown()
