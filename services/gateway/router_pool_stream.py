"""One router replica as the gateway's router pool sees it: its unary stub and its RouteStream, a long-lived stream
carrying Route, Complete and ReportFailure as messages (under mutual TLS a message on an open stream costs far less
CPU than a unary call). The stream is opened in the background and used only once the router has accepted it; until
then, after it breaks, or against a router without it, the same calls go unary. Protobuf in, protobuf out: no
decisions, no domain types (router_pool.py).
"""

import asyncio
import contextvars
import itertools
import logging
import time

import grpc

from services.common.protos import router_pb2, router_pb2_grpc
from services.common.stream_calls import as_rpc_error, refused_opening
from services.common.tracing import trace_carrier

log = logging.getLogger(__name__)
REOPEN_AFTER_S = 1.0  # a stream that broke (or never opened) is tried again after this long; calls go unary meanwhile
UNSUPPORTED_REOPEN_AFTER_S = 60.0  # a router that lacks RouteStream (an older release) is asked again this rarely
OPEN_TIMEOUT_S = 5.0
CLOSE_TIMEOUT_S = 5.0


class StreamUnavailable(Exception):
    """The stream cannot carry this call (not open, or it broke before the answer): send it unary instead."""


class Replica:
    """`route`, `complete` and `report_failure` on one replica: on its stream when open, unary otherwise. Each
    raises grpc.aio.AioRpcError exactly as the unary call would, a refusal from the stream included."""

    def __init__(self, channel: grpc.aio.Channel):
        self.channel = channel
        self.stub = router_pb2_grpc.RouterStub(channel)
        self.stream = RouteStreamClient(self.stub)

    async def route(
        self, message: router_pb2.RouteRequest, timeout_s: float, wait_for_ready: bool = False
    ) -> router_pb2.RouteResponse:
        try:
            return await self.stream.route(message, timeout_s)
        except StreamUnavailable:
            return await self.stub.Route(message, timeout=timeout_s, wait_for_ready=wait_for_ready)

    async def complete(self, message: router_pb2.CompleteRequest, timeout_s: float) -> None:
        if not await self.stream.send(router_pb2.RouteStreamRequest(complete=message)):
            await self.stub.Complete(message, timeout=timeout_s)

    async def report_failure(self, message: router_pb2.ReportFailureRequest, timeout_s: float) -> None:
        if not await self.stream.send(router_pb2.RouteStreamRequest(report_failure=message)):
            await self.stub.ReportFailure(message, timeout=timeout_s)

    async def close(self) -> None:
        """The stream first (what was sent on it is answered), then the channel."""
        await self.stream.close()
        await self.channel.close()


class RouteStreamClient:
    """One RouteStream call at a time: answers are matched to their Route by call_id, in whatever order they come."""

    def __init__(self, stub: router_pb2_grpc.RouterStub):
        self._stub = stub
        self._call: grpc.aio.StreamStreamCall | None = None  # set only while open and accepted by the router
        self._opening: asyncio.Task | None = None
        self._reader: asyncio.Task | None = None
        self._retry_at = 0.0  # monotonic time before which no new stream is tried
        self._pending: dict[int, asyncio.Future] = {}
        self._ids = itertools.count(1)
        self._lock = asyncio.Lock()  # NOTE: gRPC allows one write in flight per call
        self._is_closed = False

    @property
    def is_open(self) -> bool:
        return self._call is not None

    async def route(self, message: router_pb2.RouteRequest, timeout_s: float) -> router_pb2.RouteResponse:
        call = self._usable()
        call_id = next(self._ids)
        answer = asyncio.get_running_loop().create_future()
        self._pending[call_id] = answer
        try:
            await self._write(call, _route_message(call_id, timeout_s, message))
            reply = await asyncio.wait_for(answer, timeout_s)
        except TimeoutError:
            raise grpc.aio.AioRpcError(grpc.StatusCode.DEADLINE_EXCEEDED, details="Deadline Exceeded") from None
        finally:
            self._pending.pop(call_id, None)
        if reply is None:  # NOTE: the stream broke before the answer came
            raise StreamUnavailable
        if reply.WhichOneof("outcome") == "route":
            return reply.route
        raise as_rpc_error(reply.error)

    async def send(self, message: router_pb2.RouteStreamRequest) -> bool:
        """Write a call that gets no answer; False when the stream cannot take it (send it unary)."""
        try:
            await self._write(self._usable(), message)
        except StreamUnavailable:
            return False
        return True

    async def close(self) -> None:
        """Half-close, so the router answers what it holds, and wait (bounded) for it to end the call."""
        self._is_closed = True
        if self._opening is not None:
            self._opening.cancel()
            await asyncio.gather(self._opening, return_exceptions=True)
        call, reader = self._call, self._reader
        if call is not None:
            try:
                async with self._lock:
                    await call.done_writing()
            except (grpc.aio.AioRpcError, asyncio.InvalidStateError):
                pass
        if reader is not None:
            await asyncio.wait({reader}, timeout=CLOSE_TIMEOUT_S)
            reader.cancel()
            await asyncio.gather(reader, return_exceptions=True)
        if call is not None:
            call.cancel()

    def maybe_open(self) -> None:
        """Start opening the stream in the background, unless it is open, opening, closed or waiting to retry."""
        if self._call is None and not self._is_closed and self._opening is None and time.monotonic() >= self._retry_at:
            # NOTE: in a context of its own: the long-lived call must not join the trace of the request that opened it
            self._opening = asyncio.get_running_loop().create_task(self._open(), context=contextvars.Context())

    def _usable(self) -> grpc.aio.StreamStreamCall:
        if self._call is not None:
            return self._call
        self.maybe_open()
        raise StreamUnavailable

    async def _write(self, call: grpc.aio.StreamStreamCall, message: router_pb2.RouteStreamRequest) -> None:
        """Shielded from the caller's cancellation (a client that left): a gRPC write cancelled midway leaves its
        operation pending, and the call then refuses the next write: the stream would break for everyone."""
        write = asyncio.get_running_loop().create_task(self._write_now(call, message))
        write.add_done_callback(_retrieved)
        await asyncio.shield(write)

    async def _write_now(self, call: grpc.aio.StreamStreamCall, message: router_pb2.RouteStreamRequest) -> None:
        try:
            async with self._lock:
                await call.write(message)
        except (grpc.aio.AioRpcError, asyncio.InvalidStateError) as exc:
            self._broke(call, exc)
            raise StreamUnavailable from None

    async def _open(self) -> None:
        """A new call, kept once the router accepted it (its initial metadata came: authorized and implemented)."""
        call = self._stub.RouteStream()
        try:
            refused = await refused_opening(call, OPEN_TIMEOUT_S)
        finally:
            self._opening = None
        if refused is not None:
            self._give_up(*refused)
            return
        self._call = call
        self._reader = asyncio.get_running_loop().create_task(self._read(call))

    def _give_up(self, code: grpc.StatusCode, details: str | None) -> None:
        later = UNSUPPORTED_REOPEN_AFTER_S if code is grpc.StatusCode.UNIMPLEMENTED else REOPEN_AFTER_S
        self._retry_at = time.monotonic() + later
        log.info("router stream not opened (%s: %s); unary calls for %.0f s", code.name, details, later)

    async def _read(self, call: grpc.aio.StreamStreamCall) -> None:
        error: BaseException | None = None
        try:
            while (reply := await call.read()) is not grpc.aio.EOF:
                answer = self._pending.get(reply.call_id)
                if answer is not None and not answer.done():
                    answer.set_result(reply)
        except grpc.aio.AioRpcError as exc:
            error = exc
        finally:
            self._broke(call, error)

    def _broke(self, call: grpc.aio.StreamStreamCall, error: BaseException | None) -> None:
        """The call ended: what still waits on it is sent unary instead, and a new stream is tried later."""
        if self._call is not call:
            return
        self._call = None
        self._retry_at = time.monotonic() + REOPEN_AFTER_S
        if not self._is_closed:
            log.info("router stream ended (%s); unary calls until it is open again", error or "closed by the router")
        for answer in self._pending.values():
            if not answer.done():
                answer.set_result(None)
        call.cancel()


def _retrieved(write: asyncio.Task) -> None:
    """A write whose caller left already: its failure (the stream broke) is handled there, not re-raised here."""
    if not write.cancelled():
        write.exception()


def _route_message(call_id: int, timeout_s: float, message: router_pb2.RouteRequest) -> router_pb2.RouteStreamRequest:
    carrier = trace_carrier()  # NOTE: empty unless tracing is on
    return router_pb2.RouteStreamRequest(call_id=call_id, timeout_s=timeout_s, route=message, trace_context=carrier)
