"""The gateway's worker boundary on a fake worker (loopback): one channel per address, Prefill answered as a
`Prefilled`, Generate read as token deltas and cancellable, Abort and ReleaseKv carrying their request."""

import asyncio

import grpc
import pytest

from engines.base.types import FinishReason, SamplingParams
from services.common.domain import TokenDelta
from services.gateway.worker_clients import WorkerClients
from tests.unit.services.gateway.fakes import FakeWorker, add_worker, start_server


@pytest.fixture
async def worker():
    fake = FakeWorker([5, 6, 7])
    server, fake.address = await start_server(add_worker, fake)
    yield fake
    await server.stop(None)


async def test_one_channel_per_address_and_domain_types_both_ways(worker):
    opened = []
    clients = WorkerClients(lambda a: opened.append(a) or grpc.aio.insecure_channel(a))
    first = await clients.prefill(worker.address, "r", [1, 2], SamplingParams(max_tokens=3), timeout_s=5)
    assert (first.first_token_id, first.finish_reason, first.kv.req_id) == (5, None, "r")
    stream = clients.generate(worker.address, "r", [1, 2], SamplingParams(max_tokens=3), 5, first.kv, [5])
    deltas = [stream.read(message) async for message in stream.messages]
    await stream.aclose()
    assert deltas == [TokenDelta((6,)), TokenDelta((7,), finish_reason=FinishReason.STOP)]
    assert worker.generate_requests[0].kv == first.kv and list(worker.generate_requests[0].output_token_ids) == [5]
    await clients.abort(worker.address, "r", timeout_s=5)
    await clients.release_kv(worker.address, "r", timeout_s=5)
    assert (worker.aborted, worker.released, opened) == (["r"], ["r"], [worker.address])
    await clients.close()


async def test_a_cancelled_stream_ends_at_the_worker(worker):
    worker.hang_after = 1
    clients = WorkerClients(grpc.aio.insecure_channel)
    stream = clients.generate(worker.address, "r", [1], SamplingParams(max_tokens=3), timeout_s=5)
    assert stream.read(await anext(stream.messages)) == TokenDelta((5,))
    stream.cancel()
    with pytest.raises(asyncio.CancelledError):
        await anext(stream.messages)
    await stream.aclose()
    for _ in range(100):
        if worker.cancelled:
            break
        await asyncio.sleep(0.01)
    assert worker.cancelled == ["r"]
    await clients.close()
