"""The decode worker's KvPuller over a scripted prefill peer on loopback: pulls on the PullKvStream matched to their
replies by call_id, unary PullKv while the stream is not open or against a peer without it, a timeout or a stream past
the handle cancelled on the stream, a stream that breaks failing its pull (or sending it unary, before any chunk)
without hanging, and closing the puller ending the stream."""

import asyncio

import grpc
import pytest

from services.common.protos import common_pb2, worker_pb2, worker_pb2_grpc
from services.decode import kv_import, pull_stream
from services.decode.kv_import import KvPuller

pytestmark = pytest.mark.timeout(30)
LAYOUT = common_pb2.KvLayout(num_layers=2, num_kv_heads=1, head_dim=4, dtype="float32", block_size=4)
BLOCK_BYTES = 2 * 2 * 4 * 1 * 4 * 4  # layers x (k, v) x block_size x heads x head_dim x 4 bytes


def chunk(req_id: str, first_block: int) -> worker_pb2.KvChunk:
    """Block `first_block` of a 2-block pull, every byte the request's tag (its id's last character)."""
    tokens = range(8) if first_block == 0 else ()
    data = req_id[-1].encode() * BLOCK_BYTES
    return worker_pb2.KvChunk(
        layout=LAYOUT, token_ids=tokens, first_block=first_block, num_blocks=1, total_blocks=2, data=data
    )


class Peer(worker_pb2_grpc.PrefillWorkerServicer):
    """Pulls named "pair-*" are answered two at a time, their chunks interleaved, the later one first; "quiet" never;
    "flood" without end; "break" with one chunk, then the stream ends; "gone" breaks the stream at once; any other
    id gets its two chunks and the end marker. Unary PullKv sends a pull's two chunks."""

    def __init__(self, has_stream: bool = True):
        self.has_stream = has_stream
        self.received: list[worker_pb2.PullKvStreamRequest] = []
        self.num_unary = self.num_streams = self.num_flooded = 0
        self.stream_ended = asyncio.Event()

    async def PullKv(self, request, context):
        self.num_unary += 1
        for first in (0, 1):
            yield chunk(request.req_id, first)

    async def PullKvStream(self, requests, context):
        if not self.has_stream:
            await context.abort(grpc.StatusCode.UNIMPLEMENTED, "Method not found!")
        self.num_streams += 1
        await context.send_initial_metadata(())
        pairs: list[worker_pb2.PullKvStreamRequest] = []
        flooding = None
        try:
            async for message in requests:
                self.received.append(message)
                if message.pull.req_id == "flood":  # NOTE: in a task: the reading goes on, and sees the cancel
                    flooding = asyncio.get_running_loop().create_task(self._flood(message.call_id, context))
                elif message.WhichOneof("call") == "pull":
                    await self._answer(message.call_id, message.pull.req_id, pairs, context)
            if flooding is not None:
                await flooding
        finally:
            self.stream_ended.set()

    async def _flood(self, call_id: int, context) -> None:
        while self.num_flooded < 1000 and not any(m.WhichOneof("call") == "cancel" for m in self.received):
            self.num_flooded += 1
            reply = worker_pb2.PullKvStreamResponse(call_id=call_id, chunk=chunk("flood", 0))
            await context.write(reply)

    async def _answer(self, call_id: int, req_id: str, pairs: list, context) -> None:
        def reply(**outcome) -> worker_pb2.PullKvStreamResponse:
            return worker_pb2.PullKvStreamResponse(call_id=call_id, **outcome)

        if req_id == "gone":
            await context.abort(grpc.StatusCode.UNAVAILABLE, "peer went away")
        elif req_id == "break":
            await context.write(reply(chunk=chunk(req_id, 0)))
            await context.abort(grpc.StatusCode.UNAVAILABLE, "peer went away")
        elif req_id.startswith("pair"):
            pairs.append((call_id, req_id))
            if len(pairs) == 2:
                for first in (0, 1):
                    for cid, rid in reversed(pairs):
                        await context.write(worker_pb2.PullKvStreamResponse(call_id=cid, chunk=chunk(rid, first)))
                for cid, _ in pairs:
                    await context.write(worker_pb2.PullKvStreamResponse(call_id=cid, end=worker_pb2.PullKvEnd()))
        elif req_id != "quiet":
            for first in (0, 1):
                await context.write(reply(chunk=chunk(req_id, first)))
            await context.write(reply(end=worker_pb2.PullKvEnd()))


@pytest.fixture
async def serve():
    servers = []

    async def start(peer: Peer) -> str:
        server = grpc.aio.server()
        worker_pb2_grpc.add_PrefillWorkerServicer_to_server(peer, server)
        port = server.add_insecure_port("127.0.0.1:0")
        await server.start()
        servers.append(server)
        return f"127.0.0.1:{port}"

    yield start
    for server in servers:
        await server.stop(0)


@pytest.fixture
async def puller():
    puller = KvPuller(timeout_s=5)
    yield puller
    await puller.close()


def handle(address: str, req_id: str) -> common_pb2.KvHandle:
    return common_pb2.KvHandle(
        worker_id="p0", address=address, req_id=req_id, layout=LAYOUT, num_tokens=6, num_blocks=2
    )


async def opened(puller: KvPuller, address: str) -> pull_stream.PullStreamClient:
    stream = puller._peer(address).stream
    stream.maybe_open()
    for _ in range(500):
        if stream.is_open:
            return stream
        await asyncio.sleep(0.01)
    raise AssertionError("the pull stream never opened")


async def test_pulls_on_the_stream_are_matched_to_their_replies_by_call_id(serve, puller):
    peer = Peer()
    address = await serve(peer)
    await opened(puller, address)
    a, b = await asyncio.gather(puller.pull(handle(address, "pair-a"), 7), puller.pull(handle(address, "pair-b"), 7))
    assert (a.data, b.data) == (b"a" * 2 * BLOCK_BYTES, b"b" * 2 * BLOCK_BYTES)
    assert a.token_ids == b.token_ids == tuple(range(8)) and (a.num_blocks, b.num_blocks) == (2, 2)
    assert peer.num_unary == 0 and peer.num_streams == 1
    assert [m.pull.req_id for m in peer.received] == ["pair-a", "pair-b"]
    assert len({m.call_id for m in peer.received}) == 2


async def test_the_first_pull_goes_unary_while_the_stream_opens_in_the_background(serve, puller):
    peer = Peer()
    address = await serve(peer)
    kv = await puller.pull(handle(address, "x-1"), 7)
    assert kv.data == b"1" * 2 * BLOCK_BYTES and peer.num_unary == 1
    await opened(puller, address)
    await puller.pull(handle(address, "x-2"), 7)
    assert peer.num_unary == 1 and [m.pull.req_id for m in peer.received] == ["x-2"]


async def test_a_peer_without_the_stream_is_pulled_unary_and_asked_again_rarely(serve, puller):
    peer = Peer(has_stream=False)
    address = await serve(peer)
    stream = puller._peer(address).stream
    stream.maybe_open()
    for _ in range(500):
        if stream._opening is None and stream._retry_at:
            break
        await asyncio.sleep(0.01)
    assert not stream.is_open and stream._retry_at - asyncio.get_running_loop().time() > 30
    for i in range(3):
        await puller.pull(handle(address, f"u-{i}"), 7)
    assert peer.num_unary == 3 and stream._opening is None  # NOTE: not asked again within the minute


async def test_a_timeout_fails_the_pull_and_cancels_it_on_the_stream(serve):
    peer = Peer()
    address = await serve(peer)
    puller = KvPuller(timeout_s=0.2)
    try:
        await opened(puller, address)
        with pytest.raises(grpc.aio.AioRpcError) as exc:
            await puller.pull(handle(address, "quiet"), 7)
        assert exc.value.code() is grpc.StatusCode.DEADLINE_EXCEEDED
        for _ in range(500):
            if len(peer.received) == 2:
                break
            await asyncio.sleep(0.01)
        (asked, cancelled) = peer.received
        assert cancelled.WhichOneof("call") == "cancel" and cancelled.call_id == asked.call_id
        assert peer.num_unary == 0 and puller._peer(address).stream.is_open  # the stream serves on
    finally:
        await puller.close()


async def test_a_stream_past_the_handle_is_refused_and_cancelled(serve, puller):
    peer = Peer()
    address = await serve(peer)
    await opened(puller, address)
    with pytest.raises(ValueError, match="bytes"):
        await puller.pull(handle(address, "flood"), 7)
    for _ in range(500):
        if any(m.WhichOneof("call") == "cancel" for m in peer.received):
            break
        await asyncio.sleep(0.01)
    assert peer.received[-1].WhichOneof("call") == "cancel" and peer.num_flooded < 1000


async def test_a_stream_that_breaks_midway_fails_the_pull_without_hanging(serve, puller):
    peer = Peer()
    address = await serve(peer)
    await opened(puller, address)
    with pytest.raises(grpc.aio.AioRpcError) as exc:
        await asyncio.wait_for(puller.pull(handle(address, "break"), 7), 5)
    assert exc.value.code() is grpc.StatusCode.UNAVAILABLE and peer.num_unary == 0
    assert not puller._peer(address).stream.is_open


async def test_a_stream_that_breaks_before_any_chunk_sends_the_pull_unary(serve, puller):
    peer = Peer()
    address = await serve(peer)
    await opened(puller, address)
    kv = await asyncio.wait_for(puller.pull(handle(address, "gone"), 7), 5)
    assert kv.data == b"e" * 2 * BLOCK_BYTES and peer.num_unary == 1


async def test_closing_the_puller_ends_its_streams(serve):
    peer = Peer()
    address = await serve(peer)
    puller = KvPuller(timeout_s=5)
    await opened(puller, address)
    await puller.close()
    await asyncio.wait_for(peer.stream_ended.wait(), 5)
    assert not puller._peer(address).stream.is_open


def test_a_pull_buffers_no_more_than_its_handle_holds():
    pull = pull_stream._Pull(max_bytes=2 * BLOCK_BYTES)
    for _ in range(5):
        pull.put(worker_pb2.PullKvStreamResponse(call_id=1, chunk=chunk("f", 0)))
    queued = [pull.inbox.get_nowait() for _ in range(pull.inbox.qsize())]
    assert len(queued) == 3 and queued[-1] is pull_stream._TOO_LARGE  # two chunks fit, the third is refused


async def test_a_caller_that_leaves_cancels_its_pull_on_the_stream(serve, puller):
    peer = Peer()
    address = await serve(peer)
    stream = await opened(puller, address)
    pulling = asyncio.get_running_loop().create_task(puller.pull(handle(address, "quiet"), 7))
    while not peer.received:
        await asyncio.sleep(0.01)
    pulling.cancel()  # NOTE: the request's client went away, and with it the Generate that pulled
    for _ in range(500):
        if len(peer.received) == 2:
            break
        await asyncio.sleep(0.01)
    assert [m.WhichOneof("call") for m in peer.received] == ["pull", "cancel"] and stream.is_open
    assert not stream._pending


async def test_a_pull_larger_than_the_stream_takes_goes_unary_though_the_stream_is_open(serve, puller, monkeypatch):
    peer = Peer()
    address = await serve(peer)
    await opened(puller, address)
    monkeypatch.setattr(kv_import, "STREAM_MAX_BYTES", 2 * BLOCK_BYTES - 1)  # NOTE: the test's pulls are 2 blocks
    kv = await puller.pull(handle(address, "big-1"), 7)
    assert kv.data == b"1" * 2 * BLOCK_BYTES and peer.num_unary == 1 and peer.received == []
    monkeypatch.setattr(kv_import, "STREAM_MAX_BYTES", 2 * BLOCK_BYTES)
    await puller.pull(handle(address, "small-2"), 7)
    assert peer.num_unary == 1 and [m.pull.req_id for m in peer.received] == ["small-2"]
