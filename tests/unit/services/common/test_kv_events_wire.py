"""KV events on the wire: the proto round trip, snapshots as CLEARED-led batches, and the worker's
StreamKvEvents servicer over a real in-process gRPC server."""

import asyncio

import grpc
import pytest

from engines.base.engine import EngineCapabilities
from engines.base.events import KvEvent, KvEventKind, KvEventLog, KvSnapshot, KvTier
from services.common.convert import (
    kv_batch_from_pb,
    kv_event_from_pb,
    kv_event_to_pb,
    kv_events_to_pb,
    kv_snapshot_to_pb,
)
from services.common.protos import common_pb2, worker_pb2, worker_pb2_grpc
from services.decode.server import DecodeService

BIG = 2**64 - 1  # hashes are full uint64


@pytest.mark.parametrize(
    "event",
    [
        KvEvent(1, KvEventKind.STORED, 0, (BIG, 7), KvTier.DEVICE),
        KvEvent(2, KvEventKind.STORED, BIG, (3,), KvTier.HOST),
        KvEvent(3, KvEventKind.REMOVED, 0, (7,), KvTier.DISK),
        KvEvent(4, KvEventKind.CLEARED),
    ],
)
def test_event_round_trip(event):
    assert kv_event_from_pb(kv_event_to_pb(event)) == event


def test_unspecified_kind_is_refused():
    with pytest.raises(ValueError, match="unknown kind"):
        kv_event_from_pb(common_pb2.KvEvent(seq=1, tier=common_pb2.KV_TIER_DEVICE))


def test_batches_and_snapshots_round_trip():
    events = [KvEvent(1, KvEventKind.STORED, 0, (1, 2)), KvEvent(2, KvEventKind.REMOVED, 0, (2,))]
    assert kv_batch_from_pb(kv_events_to_pb("w", events)) == events
    snapshot = KvSnapshot(9, (KvEvent(9, KvEventKind.STORED, 0, (1,)), KvEvent(9, KvEventKind.STORED, 5, (6,))))
    msg = kv_snapshot_to_pb("w", snapshot)
    assert (msg.worker_id, msg.events[0].kind, msg.events[0].seq) == ("w", common_pb2.KV_EVENT_KIND_CLEARED, 9)
    assert kv_batch_from_pb(msg) == snapshot
    assert kv_batch_from_pb(kv_snapshot_to_pb("w", KvSnapshot(0, ()))) == KvSnapshot(0, ())


class FakeKvEngine:
    """An engine with the kv_events capability over a real KvEventLog, fed by the test."""

    capabilities = EngineCapabilities(kv_events=True)

    def __init__(self, max_events: int = 4):
        self.log = KvEventLog(max_events)
        self.changed = asyncio.Event()

    def store(self, *hashes: int) -> None:
        self.log.stored(hashes[0] - 1 if hashes[0] > 1 else 0, hashes)
        self.changed.set()

    async def kv_events_since(self, after_seq):
        return self.log.since(after_seq)

    async def kv_snapshot(self):
        return self.log.snapshot()

    async def wait_kv_events(self, after_seq):
        while self.log.last_seq <= after_seq:
            self.changed.clear()
            await self.changed.wait()


class NoKvEngine:
    capabilities = EngineCapabilities()


async def serve(engine):
    service = DecodeService(None, engine)
    service.worker_id = "w0"
    server = grpc.aio.server()
    worker_pb2_grpc.add_WorkerControlServicer_to_server(service, server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    return service, server, grpc.aio.insecure_channel(f"127.0.0.1:{port}")


def test_servicer_replays_then_pushes_then_snapshots_then_stops():
    async def go():
        engine = FakeKvEngine(max_events=2)
        engine.store(1)
        engine.store(2)
        service, server, channel = await serve(engine)
        stub = worker_pb2_grpc.WorkerControlStub(channel)
        try:
            call = stub.StreamKvEvents(worker_pb2.StreamKvEventsRequest(after_seq=0))
            replay = kv_batch_from_pb(await call.read())
            engine.store(3)
            pushed = kv_batch_from_pb(await call.read())
            late = stub.StreamKvEvents(worker_pb2.StreamKvEventsRequest(after_seq=0))  # the ring lost seq 1
            snapshot = kv_batch_from_pb(await late.read())
            service.stopping.set()
            ends = [await call.read(), await late.read()]
            return replay, pushed, snapshot, ends
        finally:
            await channel.close()
            await server.stop(0)

    replay, pushed, snapshot, ends = asyncio.run(go())
    assert [e.seq for e in replay] == [1, 2]
    assert pushed == [KvEvent(3, KvEventKind.STORED, 2, (3,))]
    assert snapshot == KvSnapshot(3, (KvEvent(3, KvEventKind.STORED, 0, (1, 2, 3)),))
    assert ends == [grpc.aio.EOF, grpc.aio.EOF]


def test_servicer_without_kv_events_is_unimplemented():
    async def go():
        _, server, channel = await serve(NoKvEngine())
        try:
            call = worker_pb2_grpc.WorkerControlStub(channel).StreamKvEvents(worker_pb2.StreamKvEventsRequest())
            with pytest.raises(grpc.aio.AioRpcError) as info:
                await call.read()
            return info.value.code()
        finally:
            await channel.close()
            await server.stop(0)

    assert asyncio.run(go()) is grpc.StatusCode.UNIMPLEMENTED
