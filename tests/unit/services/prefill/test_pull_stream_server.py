"""PullKvStream on the real prefill servicer over loopback, with a fake engine: pulls answered by call_id as each is
ready (a slow one holds up no other), chunks that reassemble to what a unary PullKv sends, an unknown req_id failing
that pull alone with the status a unary PullKv ends with, a cancel stopping its pull, and a stopping worker ending the
stream."""

import asyncio
from types import SimpleNamespace

import grpc
import pytest

from engines.base.errors import RequestNotFoundError
from engines.base.types import KvExport
from services.common.grpc_server import make_channel
from services.common.protos import worker_pb2, worker_pb2_grpc
from services.decode.kv_import import assemble
from services.prefill.server import PrefillService
from tests.unit.engines.transfer.test_connectors import LAYOUT, TOKENS, FakeEngine

pytestmark = pytest.mark.timeout(30)


class GatedEngine(FakeEngine):
    """Holds "held" and "slow" (whose export waits for `gate`); any other id is not held."""

    def __init__(self):
        super().__init__()
        self.gate = asyncio.Event()

    async def export_kv(self, req_id: str, into: str = "", offset: int = 0) -> KvExport:
        self.calls.append(("export_kv", req_id, into))
        if req_id == "slow":
            await self.gate.wait()
        elif req_id != "held":
            raise RequestNotFoundError(f"no KV held for request {req_id!r}")
        return KvExport(LAYOUT, TOKENS[:8], 2, self.data.tobytes())


@pytest.fixture
async def prefill(monkeypatch):
    monkeypatch.setattr("services.common.kv_connectors.KV_CHUNK_BYTES", 1)  # NOTE: one block a chunk: 2 chunks a pull
    engine = GatedEngine()
    settings = SimpleNamespace(kv_lease_s=30.0, kv_signing_key=lambda: None, kv_staging_mb=0, model="m")
    service = PrefillService(settings, engine)
    server = grpc.aio.server()
    worker_pb2_grpc.add_PrefillWorkerServicer_to_server(service, server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    channel = make_channel(f"127.0.0.1:{port}")
    yield service, engine, worker_pb2_grpc.PrefillWorkerStub(channel)
    await channel.close()
    await server.stop(0)


def pull(call_id: int, req_id: str) -> worker_pb2.PullKvStreamRequest:
    return worker_pb2.PullKvStreamRequest(call_id=call_id, pull=worker_pb2.PullKvRequest(req_id=req_id))


async def read_until_ended(call, call_ids: set[int]) -> list[worker_pb2.PullKvStreamResponse]:
    replies, open_ids = [], set(call_ids)
    while open_ids:
        reply = await call.read()
        replies.append(reply)
        if reply.WhichOneof("outcome") != "chunk":
            open_ids.discard(reply.call_id)
    return replies


def rpcs(service: PrefillService, code: str) -> float:
    (family,) = service.metrics.rpcs.collect()
    wanted = {"rpc": "PullKv", "code": code}
    return sum(s.value for s in family.samples if s.name.endswith("_total") and wanted.items() <= s.labels.items())


async def test_pulls_are_answered_by_call_id_as_each_is_ready(prefill):
    service, engine, stub = prefill
    call = stub.PullKvStream()
    await call.write(pull(1, "slow"))
    await call.write(pull(2, "held"))
    first = await read_until_ended(call, {2})  # NOTE: the slow pull's export still waits: the other is not held up
    assert [(r.call_id, r.WhichOneof("outcome")) for r in first] == [(2, "chunk"), (2, "chunk"), (2, "end")]
    engine.gate.set()
    second = await read_until_ended(call, {1})
    assert [(r.call_id, r.WhichOneof("outcome")) for r in second] == [(1, "chunk"), (1, "chunk"), (1, "end")]
    for replies in (first, second):  # the same bytes a unary PullKv's chunks reassemble to
        kv = assemble([r.chunk for r in replies if r.WhichOneof("outcome") == "chunk"])
        assert kv.data == engine.data.tobytes() and kv.token_ids == TOKENS[:8]
    assert engine.calls.count(("release_kv", "held")) == 1 and engine.calls.count(("release_kv", "slow")) == 1
    await call.done_writing()
    assert await call.read() is grpc.aio.EOF and await call.code() is grpc.StatusCode.OK
    assert rpcs(service, "OK") == 2


async def test_an_unknown_request_fails_its_pull_alone_with_the_unary_status(prefill):
    service, _, stub = prefill
    with pytest.raises(grpc.aio.AioRpcError) as unary:
        async for _ in stub.PullKv(worker_pb2.PullKvRequest(req_id="gone")):
            pass
    call = stub.PullKvStream()
    await call.write(pull(5, "gone"))
    await call.write(pull(6, "held"))
    replies = await read_until_ended(call, {5, 6})
    (error,) = [r for r in replies if r.call_id == 5]
    assert error.WhichOneof("outcome") == "error"
    assert error.error.code == unary.value.code().value[0] == grpc.StatusCode.NOT_FOUND.value[0]
    assert error.error.message == unary.value.details() == "no KV held for request 'gone'"
    assert [r.WhichOneof("outcome") for r in replies if r.call_id == 6] == ["chunk", "chunk", "end"]
    assert rpcs(service, "NOT_FOUND") == 2  # the unary call and the streamed pull, counted alike
    call.cancel()


async def test_a_cancel_stops_its_pull_and_nothing_more_is_sent_for_it(prefill):
    service, engine, stub = prefill
    call = stub.PullKvStream()
    await call.write(pull(1, "slow"))
    while ("export_kv", "slow", "") not in engine.calls:
        await asyncio.sleep(0.01)
    await call.write(worker_pb2.PullKvStreamRequest(call_id=1, cancel=worker_pb2.PullKvCancel()))
    await call.write(pull(2, "held"))
    replies = await read_until_ended(call, {2})
    engine.gate.set()
    await call.done_writing()
    assert await call.read() is grpc.aio.EOF  # NOTE: the cancelled pull sent nothing, not even after its gate opened
    assert all(r.call_id == 2 for r in replies)
    assert rpcs(service, "CANCELLED") == 1 and ("release_kv", "slow") not in engine.calls


async def test_a_message_naming_no_call_or_a_call_id_in_use_is_refused_alone(prefill):
    _, engine, stub = prefill
    call = stub.PullKvStream()
    await call.write(pull(1, "slow"))
    await call.write(pull(1, "held"))
    await call.write(worker_pb2.PullKvStreamRequest(call_id=2))
    refused = [await call.read(), await call.read()]
    assert [r.error.code for r in refused] == [grpc.StatusCode.INVALID_ARGUMENT.value[0]] * 2
    engine.gate.set()
    assert [r.WhichOneof("outcome") for r in await read_until_ended(call, {1})] == ["chunk", "chunk", "end"]
    call.cancel()


async def test_a_stopping_worker_ends_its_streams(prefill):
    service, _, stub = prefill
    call = stub.PullKvStream()
    await call.write(pull(1, "held"))
    await read_until_ended(call, {1})
    service.stopping.set()
    assert await asyncio.wait_for(call.code(), 5) is grpc.StatusCode.UNAVAILABLE
