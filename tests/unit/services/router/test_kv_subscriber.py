"""KvSubscriber against scripted in-process workers: events reach the index, a gap brings a snapshot,
an old worker (UNIMPLEMENTED) is left alone, and a worker that left is forgotten."""

import asyncio

import grpc

from engines.base.events import KvEvent, KvEventKind, KvSnapshot
from services.common.convert import kv_events_to_pb, kv_snapshot_to_pb
from services.common.protos import worker_pb2_grpc
from services.router.kv_policy import KvAwarePolicy
from services.router.kv_subscriber import ASK_SNAPSHOT, KvSubscriber
from services.router.prefix_index import PrefixIndex


def stored(seq: int, parent: int, *hashes: int) -> KvEvent:
    return KvEvent(seq, KvEventKind.STORED, parent, hashes)


class ScriptedWorker(worker_pb2_grpc.WorkerControlServicer):
    """Answers the n-th StreamKvEvents call with the n-th script, then holds the stream open."""

    def __init__(self, scripts):
        self.scripts = list(scripts)
        self.after_seqs: list[int] = []

    async def StreamKvEvents(self, request, context):
        self.after_seqs.append(request.after_seq)
        if not self.scripts:
            await context.abort(grpc.StatusCode.UNIMPLEMENTED, "no more scripts")
        for batch in self.scripts.pop(0):
            yield batch
        await asyncio.Event().wait()


async def serve(servicer) -> tuple[grpc.aio.Server, str]:
    server = grpc.aio.server()
    worker_pb2_grpc.add_WorkerControlServicer_to_server(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    return server, f"127.0.0.1:{port}"


async def until(predicate, timeout_s: float = 5.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout_s
    while not predicate():
        assert asyncio.get_running_loop().time() < deadline, "condition never held"
        await asyncio.sleep(0.01)


def make_policy() -> KvAwarePolicy:
    return KvAwarePolicy(PrefixIndex(), clock=lambda: 0.0)


def test_gap_triggers_a_snapshot_resync_and_forget_drops_the_worker():
    gap = [kv_events_to_pb("w", [stored(1, 0, 10, 11)]), kv_events_to_pb("w", [stored(3, 11, 12)])]
    snapshot = [kv_snapshot_to_pb("w", KvSnapshot(7, (stored(7, 0, 20, 21),)))]
    worker = ScriptedWorker([gap, snapshot])

    async def go():
        server, address = await serve(worker)
        policy = make_policy()
        subscriber = KvSubscriber(policy, retry_s=0.01)
        try:
            subscriber.follow("w", address)
            await until(lambda: policy.index.last_seq("w") == 7)
            overlap = (policy.index.overlap([10, 11]), policy.index.overlap([20, 21]))
            subscriber.follow("w", address)  # a re-registration keeps the live stream
            subscriber.forget(["w"], live_worker_ids=[])
            await asyncio.sleep(0.05)
            return overlap, policy.index.worker_ids(), subscriber.is_following("w")
        finally:
            await subscriber.close()
            await server.stop(0)

    (old, new), indexed, following = asyncio.run(go())
    assert worker.after_seqs == [0, ASK_SNAPSHOT]
    assert (old, new) == ({}, {"w": 2})
    assert (indexed, following) == ([], False)


def test_old_worker_without_kv_events_is_left_to_the_approximate_index():
    worker = ScriptedWorker([])

    async def go():
        server, address = await serve(worker)
        subscriber = KvSubscriber(make_policy(), retry_s=0.01)
        try:
            subscriber.follow("old", address)
            await until(lambda: not subscriber.is_following("old"))
        finally:
            await subscriber.close()
            await server.stop(0)

    asyncio.run(go())
    assert worker.after_seqs == [0]


def test_lost_stream_reconnects_asking_for_a_snapshot():
    async def go():
        policy = make_policy()
        subscriber = KvSubscriber(policy, retry_s=0.01)
        first = ScriptedWorker([[kv_events_to_pb("w", [stored(1, 0, 10)])]])
        server, address = await serve(first)
        subscriber.follow("w", address)
        await until(lambda: policy.index.last_seq("w") == 1)
        await server.stop(0)  # the worker dies; a new one comes up on the same port
        second = ScriptedWorker([[kv_snapshot_to_pb("w", KvSnapshot(0, ()))]])
        server = grpc.aio.server()
        worker_pb2_grpc.add_WorkerControlServicer_to_server(second, server)
        server.add_insecure_port(address)
        await server.start()
        try:
            await until(lambda: second.after_seqs and policy.index.overlap([10]) == {})
            return second.after_seqs, policy.index.last_seq("w")
        finally:
            await subscriber.close()
            await server.stop(0)

    after_seqs, last_seq = asyncio.run(go())
    assert (after_seqs, last_seq) == ([ASK_SNAPSHOT], 0)
