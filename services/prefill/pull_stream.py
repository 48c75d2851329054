"""The prefill worker's side of PullKvStream: a decode worker's KV pulls arriving as messages on one long-lived stream
(under mutual TLS a message on an open stream costs far less CPU than a call). Each pull runs the very code a unary
PullKv runs (the servicer's `kv_chunks`); nothing here touches leases, the engine or the connector.

NOTE: one writer task per stream, fed by a bounded queue: the pulls' chunks interleave as they are ready, a pull
whose chunk finds the queue full waits (bounded memory), and no write is ever cancelled midway.
"""

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Callable

import grpc

from services.common.grpc_limits import LIMITS
from services.common.logs import request_id
from services.common.protos import worker_pb2
from services.common.stream_calls import code_of, end_all, failure, refusal
from services.common.tracing import continued_span

log = logging.getLogger(__name__)
PULL_SPAN = "/tandem.v1.PrefillWorker/PullKv"  # NOTE: the unary call's server span name: one trace reads the same
MAX_QUEUED = 8  # replies waiting for the writer: with 4 MiB chunks, at most 32 MiB held per stream
MAX_PULLS = LIMITS["prefill"].max_streams_per_connection  # the unary calls one connection may hold at once
Chunks = Callable[[str], AsyncIterator[worker_pb2.KvChunk]]  # req_id -> its chunks (the servicer's kv_chunks)
PullDone = Callable[[str, float], None]  # (status name, seconds): the servicer counts and logs each pull


class PullStreams:
    """Serves each PullKvStream call: one reading loop starts a task per pull, one writer sends every reply."""

    def __init__(self, chunks: Chunks, done: PullDone):
        self._chunks, self._done = chunks, done
        self._serving: dict[asyncio.Task, grpc.aio.ServicerContext] = {}

    async def close(self) -> None:
        """End every open stream now (the worker is stopping; its held KV is pulled or lapsed by then): a stream
        held open would keep the server's stop waiting its whole grace period. The decode worker goes unary."""
        await end_all(self._serving, "the prefill worker is stopping")

    async def serve(self, requests: AsyncIterator[worker_pb2.PullKvStreamRequest], context) -> None:
        serving = asyncio.current_task()
        assert serving is not None  # NOTE: grpc runs every handler in a task
        self._serving[serving] = context
        stream = _Stream(context, serving)
        await context.send_initial_metadata(())  # NOTE: tells the decode worker the stream is accepted
        try:
            async for message in requests:
                await self._handle(message, stream)
            await stream.finish()  # NOTE: the decode worker half-closed: what it asked for is still sent
        finally:
            stream.cancel()
            self._serving.pop(serving, None)

    async def _handle(self, message: worker_pb2.PullKvStreamRequest, stream: "_Stream") -> None:
        kind, call_id = message.WhichOneof("call"), message.call_id
        if kind == "cancel":
            stream.cancel_pull(call_id)
        elif kind != "pull":
            await stream.put(_error(call_id, grpc.StatusCode.INVALID_ARGUMENT, "a PullKvStream message names no call"))
        elif stream.has_pull(call_id):
            await stream.put(_error(call_id, grpc.StatusCode.INVALID_ARGUMENT, f"call_id {call_id} is in use"))
        elif stream.num_pulls >= MAX_PULLS:
            await stream.put(_error(call_id, grpc.StatusCode.RESOURCE_EXHAUSTED, "too many pulls on this stream"))
        else:
            stream.start(call_id, self._pull(message, stream))

    async def _pull(self, message: worker_pb2.PullKvStreamRequest, stream: "_Stream") -> None:
        """One pull, ended by its end marker or its error (the status a unary PullKv ends with); a cancelled pull
        sends nothing more (its caller left)."""
        call_id, req_id = message.call_id, message.pull.req_id
        request_id.set(req_id)  # NOTE: this task's own context: its log records name the request
        start, code = time.monotonic(), "CANCELLED"
        try:
            with continued_span(PULL_SPAN, message.trace_context):
                reply = await self._send_chunks(call_id, req_id, stream)
            code = "OK"
        except Exception as exc:
            error = failure(exc)  # NOTE: the very status (and detail) a unary PullKv ends with for this error
            code = code_of(error.code).name
            reply = worker_pb2.PullKvStreamResponse(call_id=call_id, error=error)
        finally:
            self._done(code, time.monotonic() - start)
        await stream.put(reply)

    async def _send_chunks(self, call_id: int, req_id: str, stream: "_Stream") -> worker_pb2.PullKvStreamResponse:
        chunks = self._chunks(req_id)
        try:
            async for chunk in chunks:
                await stream.put(worker_pb2.PullKvStreamResponse(call_id=call_id, chunk=chunk))
        finally:
            await chunks.aclose()  # NOTE: a cancelled pull frees what its export holds (a staging region)
        return worker_pb2.PullKvStreamResponse(call_id=call_id, end=worker_pb2.PullKvEnd())


class _Stream:
    """One call's pulls and its single writer; a writer that fails (the decode worker left) ends the whole call."""

    def __init__(self, context, serving: asyncio.Task):
        self._queue: asyncio.Queue[worker_pb2.PullKvStreamResponse | None] = asyncio.Queue(MAX_QUEUED)
        self._pulls: dict[int, asyncio.Task] = {}
        self._serving = serving
        self._writer = asyncio.get_running_loop().create_task(self._write_all(context))
        self._writer.add_done_callback(self._written)

    @property
    def num_pulls(self) -> int:
        return len(self._pulls)

    def has_pull(self, call_id: int) -> bool:
        return call_id in self._pulls

    async def put(self, reply: worker_pb2.PullKvStreamResponse) -> None:
        await self._queue.put(reply)

    def start(self, call_id: int, work) -> None:
        task = asyncio.get_running_loop().create_task(work)
        self._pulls[call_id] = task
        task.add_done_callback(lambda done: self._pulls.pop(call_id) if self._pulls.get(call_id) is done else None)

    def cancel_pull(self, call_id: int) -> None:
        task = self._pulls.pop(call_id, None)
        if task is not None:
            task.cancel()

    async def finish(self) -> None:
        """Every pull sent to its end, then every reply written."""
        if self._pulls:
            await asyncio.gather(*self._pulls.values(), return_exceptions=True)
        await self._queue.put(None)
        await asyncio.shield(self._writer)

    def cancel(self) -> None:
        for task in self._pulls.values():
            task.cancel()
        self._writer.cancel()

    async def _write_all(self, context) -> None:
        while (reply := await self._queue.get()) is not None:
            await context.write(reply)

    def _written(self, writer: asyncio.Task) -> None:
        if not writer.cancelled() and writer.exception() is not None:
            log.info("KV pull stream ended while writing (%s)", writer.exception())
            self._serving.cancel()  # NOTE: pulls waiting on a full queue would wait forever otherwise


def _error(call_id: int, code: grpc.StatusCode, message: str) -> worker_pb2.PullKvStreamResponse:
    return worker_pb2.PullKvStreamResponse(call_id=call_id, error=refusal(code, message))
