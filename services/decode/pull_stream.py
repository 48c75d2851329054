"""One prefill worker's PullKvStream as the decode worker's KvPuller sees it: KV pulls as messages tagged by call id on
one long-lived stream (under mutual TLS a message on an open stream costs far less CPU than a call). Opened in the
background, used only once the prefill worker accepted it; until then, after it broke, or against a worker without
it, `pull` raises StreamUnavailable before anything was received and the caller pulls unary. Protobuf only: the byte
and block checks against the handle are the caller's (kv_import.py), save the bound on what is buffered here.
"""

import asyncio
import contextvars
import itertools
import logging
import time
from collections.abc import AsyncIterator

import grpc

from services.common.protos import worker_pb2, worker_pb2_grpc
from services.common.stream_calls import as_rpc_error, refused_opening
from services.common.tracing import span, trace_carrier

log = logging.getLogger(__name__)
PULL_SPAN = "/tandem.v1.PrefillWorker/PullKv"  # NOTE: the unary call's client span name: one trace reads the same
REOPEN_AFTER_S = 1.0  # a stream that broke (or never opened) is tried again after this long; pulls go unary meanwhile
UNSUPPORTED_REOPEN_AFTER_S = 60.0  # a prefill worker without PullKvStream (an older release) is asked again this rarely
OPEN_TIMEOUT_S = 5.0
CLOSE_TIMEOUT_S = 5.0
_BROKEN, _TIMED_OUT, _TOO_LARGE = object(), object(), object()  # what else a pull's inbox may hold besides replies


class StreamUnavailable(Exception):
    """The stream cannot carry this pull (not open, or it broke before any chunk came): pull it unary instead."""


class _Pull:
    """One pull's inbox, filled by the reader; what it buffers is bounded by the handle's bytes."""

    __slots__ = ("inbox", "max_bytes", "num_bytes", "is_refused")

    def __init__(self, max_bytes: int):
        self.inbox: asyncio.Queue = asyncio.Queue()
        self.max_bytes, self.num_bytes, self.is_refused = max_bytes, 0, False

    def put(self, reply: object) -> None:
        if self.is_refused:
            return
        if isinstance(reply, worker_pb2.PullKvStreamResponse) and reply.WhichOneof("outcome") == "chunk":
            self.num_bytes += len(reply.chunk.data)
            if self.num_bytes > self.max_bytes:  # NOTE: refused as it arrives: a flood is never buffered
                self.is_refused, reply = True, _TOO_LARGE
        self.inbox.put_nowait(reply)


class _Open:
    """An accepted call, its writer (fed by a queue: no write is ever cancelled midway) and its reader."""

    __slots__ = ("call", "outbox", "writer", "reader")

    def __init__(self, call: grpc.aio.StreamStreamCall):
        self.call = call
        self.outbox: asyncio.Queue[worker_pb2.PullKvStreamRequest | None] = asyncio.Queue()
        self.writer: asyncio.Task | None = None
        self.reader: asyncio.Task | None = None


class PullStreamClient:
    """One PullKvStream call at a time; replies are matched to their pull by call_id, in whatever order they come."""

    def __init__(self, stub: worker_pb2_grpc.PrefillWorkerStub):
        self._stub = stub
        self._open: _Open | None = None  # set only while open and accepted by the prefill worker
        self._opening: asyncio.Task | None = None
        self._retry_at = 0.0  # monotonic time before which no new stream is tried
        self._pending: dict[int, _Pull] = {}
        self._ids = itertools.count(1)
        self._is_closed = False

    @property
    def is_open(self) -> bool:
        return self._open is not None

    async def pull(self, req_id: str, max_bytes: int, timeout_s: float) -> AsyncIterator[worker_pb2.KvChunk]:
        """The pull's chunks. Raises StreamUnavailable before the first chunk (pull unary), the AioRpcError a unary
        PullKv would end with (DEADLINE_EXCEEDED past `timeout_s`, UNAVAILABLE if the stream broke midway), or
        ValueError past `max_bytes`. A pull left early (timeout, error, its caller gone) is cancelled on the stream."""
        opened = self._usable()
        call_id, pull = next(self._ids), _Pull(max_bytes)
        self._pending[call_id] = pull
        timer = asyncio.get_running_loop().call_later(timeout_s, pull.put, _TIMED_OUT)
        is_over, num_chunks = False, 0
        try:
            with span(PULL_SPAN):
                opened.outbox.put_nowait(_pull_message(call_id, req_id))
                while True:
                    reply = await pull.inbox.get()
                    if reply is _BROKEN and num_chunks == 0:
                        raise StreamUnavailable
                    is_over = _is_over(reply)
                    chunk = _outcome(reply, max_bytes)
                    if chunk is None:
                        return
                    num_chunks += 1
                    yield chunk
        finally:
            timer.cancel()
            self._pending.pop(call_id, None)
            if not is_over and self._open is opened:
                opened.outbox.put_nowait(
                    worker_pb2.PullKvStreamRequest(call_id=call_id, cancel=worker_pb2.PullKvCancel())
                )

    def maybe_open(self) -> None:
        """Start opening the stream in the background, unless it is open, opening, closed or waiting to retry."""
        if self._open is None and not self._is_closed and self._opening is None and time.monotonic() >= self._retry_at:
            # NOTE: in a context of its own: the long-lived call must not join the trace of the request that opened it
            self._opening = asyncio.get_running_loop().create_task(self._start(), context=contextvars.Context())

    async def close(self) -> None:
        """Half-close, so the prefill worker ends what it was asked, and wait (bounded) for it to end the call."""
        self._is_closed = True
        if self._opening is not None:
            self._opening.cancel()
            await asyncio.gather(self._opening, return_exceptions=True)
        opened = self._open
        if opened is None:
            return
        opened.outbox.put_nowait(None)
        if opened.reader is not None:
            await asyncio.wait({opened.reader}, timeout=CLOSE_TIMEOUT_S)
        self._broke(opened, None)

    def _usable(self) -> _Open:
        if self._open is not None and not self._is_closed:
            return self._open
        self.maybe_open()
        raise StreamUnavailable

    async def _start(self) -> None:
        """A new call, kept once the prefill worker accepted it (its initial metadata came: authorized, implemented)."""
        call = self._stub.PullKvStream()
        try:
            refused = await refused_opening(call, OPEN_TIMEOUT_S)
        finally:
            self._opening = None
        if refused is not None:
            self._give_up(*refused)
            return
        opened = self._open = _Open(call)
        loop = asyncio.get_running_loop()
        opened.writer = loop.create_task(self._write_all(opened))
        opened.reader = loop.create_task(self._read(opened))

    def _give_up(self, code: grpc.StatusCode, details: str | None) -> None:
        later = UNSUPPORTED_REOPEN_AFTER_S if code is grpc.StatusCode.UNIMPLEMENTED else REOPEN_AFTER_S
        self._retry_at = time.monotonic() + later
        log.info("KV pull stream not opened (%s: %s); unary pulls for %.0f s", code.name, details, later)

    async def _write_all(self, opened: _Open) -> None:
        try:
            while (message := await opened.outbox.get()) is not None:
                await opened.call.write(message)
            await opened.call.done_writing()
        except (grpc.aio.AioRpcError, asyncio.InvalidStateError) as exc:
            self._broke(opened, exc)

    async def _read(self, opened: _Open) -> None:
        error: BaseException | None = None
        try:
            while (reply := await opened.call.read()) is not grpc.aio.EOF:
                pull = self._pending.get(reply.call_id)
                if pull is not None:
                    pull.put(reply)
        except grpc.aio.AioRpcError as exc:
            error = exc
        finally:
            self._broke(opened, error)

    def _broke(self, opened: _Open, error: BaseException | None) -> None:
        """The call ended: each pull still waiting on it is told (unary if nothing came yet), a new stream later."""
        if self._open is not opened:
            return
        self._open = None
        self._retry_at = time.monotonic() + REOPEN_AFTER_S
        if not self._is_closed:
            log.info("KV pull stream ended (%s); unary pulls until it is open again", error or "closed by the peer")
        for pull in self._pending.values():
            pull.put(_BROKEN)
        for task in (opened.writer, opened.reader):
            if task is not None and task is not asyncio.current_task():
                task.cancel()
        opened.call.cancel()


def _pull_message(call_id: int, req_id: str) -> worker_pb2.PullKvStreamRequest:
    carrier = trace_carrier()  # NOTE: empty unless tracing is on
    request = worker_pb2.PullKvRequest(req_id=req_id)
    return worker_pb2.PullKvStreamRequest(call_id=call_id, pull=request, trace_context=carrier)


def _is_over(reply: object) -> bool:
    """Whether the prefill worker is done with the pull (nothing to cancel there)."""
    if isinstance(reply, worker_pb2.PullKvStreamResponse):
        return reply.WhichOneof("outcome") != "chunk"
    return reply is _BROKEN


def _outcome(reply: object, max_bytes: int) -> worker_pb2.KvChunk | None:
    """The chunk to yield; None at the pull's end marker; raises for every way a pull fails."""
    if reply is _TIMED_OUT:
        raise grpc.aio.AioRpcError(
            grpc.StatusCode.DEADLINE_EXCEEDED, grpc.aio.Metadata(), grpc.aio.Metadata(), "Deadline Exceeded"
        )
    if reply is _TOO_LARGE:
        raise ValueError(f"the KV pull stream sent over {max_bytes} bytes, what the handle's blocks hold")
    if reply is _BROKEN:
        raise grpc.aio.AioRpcError(
            grpc.StatusCode.UNAVAILABLE, grpc.aio.Metadata(), grpc.aio.Metadata(), "the KV pull stream broke"
        )
    assert isinstance(reply, worker_pb2.PullKvStreamResponse)
    kind = reply.WhichOneof("outcome")
    if kind == "chunk":
        return reply.chunk
    if kind == "end":
        return None
    raise as_rpc_error(reply.error)
