"""Drain on a real grpc.aio server: streams are counted while they run, finish on their own while the drain waits,
and at hand-back end with UNAVAILABLE (what makes the gateway migrate them), their work cancelled."""

import asyncio

import grpc
import pytest

from services.common.drain import HAND_BACK_MESSAGE, Drain, drainable
from services.common.protos import common_pb2, worker_pb2, worker_pb2_grpc


class Streamer(worker_pb2_grpc.DecodeWorkerServicer):
    """Generate yields one token per tick, `max_tokens` of them."""

    def __init__(self, tick_s: float):
        self.drain, self.tick_s = Drain(), tick_s
        self.cancelled: list[str] = []

    @drainable
    async def Generate(self, request, context):
        try:
            for i in range(request.params.max_tokens):
                await asyncio.sleep(self.tick_s)
                yield worker_pb2.GenerateResponse(token_ids=[i])
        except (asyncio.CancelledError, GeneratorExit):
            # NOTE: a stream waiting for its next tick is cancelled; one caught at its yield (grpc still sending,
            # likely on a loaded host) is closed after the send instead: either way the work stops
            self.cancelled.append(request.req_id)
            raise


@pytest.fixture
async def served():
    servicer = Streamer(tick_s=0.02)
    server = grpc.aio.server()
    worker_pb2_grpc.add_DecodeWorkerServicer_to_server(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
        yield servicer, worker_pb2_grpc.DecodeWorkerStub(channel)
    await server.stop(0)


def _generate(stub, req_id: str, max_tokens: int):
    params = common_pb2.SamplingParams(max_tokens=max_tokens)
    return stub.Generate(worker_pb2.GenerateRequest(req_id=req_id, params=params))


async def _tokens(call) -> tuple[list[int], grpc.StatusCode]:
    tokens = []
    try:
        async for reply in call:
            tokens.extend(reply.token_ids)
    except grpc.aio.AioRpcError as exc:
        assert exc.details() == HAND_BACK_MESSAGE
        return tokens, exc.code()
    return tokens, grpc.StatusCode.OK


async def test_short_streams_finish_within_the_drain(served):
    servicer, stub = served
    reader = asyncio.create_task(_tokens(_generate(stub, "short", 5)))
    while servicer.drain.num_live == 0:
        await asyncio.sleep(0.005)
    assert await servicer.drain.wait_idle(timeout_s=5.0) is True
    assert await reader == ([0, 1, 2, 3, 4], grpc.StatusCode.OK)
    assert servicer.drain.num_live == 0


async def test_long_streams_are_handed_back_with_unavailable(served):
    servicer, stub = served
    readers = [asyncio.create_task(_tokens(_generate(stub, f"long{i}", 10_000))) for i in range(3)]
    while servicer.drain.num_live < 3:
        await asyncio.sleep(0.005)
    assert await servicer.drain.wait_idle(timeout_s=0.1) is False
    assert servicer.drain.hand_back() == 3
    for tokens, code in await asyncio.gather(*readers):
        assert code == grpc.StatusCode.UNAVAILABLE and 0 < len(tokens) < 10_000
        assert tokens == list(range(len(tokens)))  # nothing lost or repeated up to the hand-back
    for _ in range(200):  # the work stops as the stream closes, which may end just after the client has its status
        if len(servicer.cancelled) == 3:
            break
        await asyncio.sleep(0.01)
    assert sorted(servicer.cancelled) == ["long0", "long1", "long2"]  # the work stopped too
    assert await servicer.drain.wait_idle(timeout_s=1.0) is True


async def test_a_busy_engine_keeps_the_drain_waiting():
    drain, busy = Drain(), {"left": 3}

    def is_engine_idle() -> bool:
        busy["left"] -= 1
        return busy["left"] <= 0

    assert await drain.wait_idle(1.0, is_engine_idle, poll_s=0.001) is True and busy["left"] == 0
    assert await Drain().wait_idle(0.01, lambda: False, poll_s=0.001) is False
