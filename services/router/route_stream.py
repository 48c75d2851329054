"""The router's side of RouteStream: a gateway's Route, Complete and ReportFailure calls arriving as messages on one
long-lived stream. Each Route is answered the moment it is decided, never behind a slower one; the decisions
themselves are the servicer's (the same code as the unary calls), nothing is decided here.

NOTE: a stream that ends (the gateway closed it, or died) completes nothing: the unary path never sends Complete for
a gateway that died mid-request either; its requests leave the in-flight count at the registry's in-flight TTL.
"""

import asyncio
import logging
import time
from collections.abc import AsyncIterator
from typing import Protocol

import grpc

from services.common.protos import router_pb2
from services.common.stream_calls import end_all, failure, refusal
from services.common.tracing import continued_span
from services.router.types import RouterError

log = logging.getLogger(__name__)
ROUTE_SPAN = "/tandem.v1.Router/Route"  # NOTE: the name a unary Route's server span has: one trace reads the same


class RouteAnswers(Protocol):
    """What the stream needs of the router's servicer (services/router/server.py)."""

    def route_now(self, request: router_pb2.RouteRequest, started: float) -> router_pb2.RouteResponse | None: ...

    async def route_later(self, request: router_pb2.RouteRequest, started: float) -> router_pb2.RouteResponse: ...

    def complete(self, request: router_pb2.CompleteRequest) -> None: ...

    def report_failure(self, request: router_pb2.ReportFailureRequest) -> float: ...


class RouteStreams:
    """Serves each RouteStream call with one reading loop: a decision made at once is answered inline; one that must
    wait (a restarted router's empty pool) waits in its own task, bounded by the caller's timeout."""

    def __init__(self, answers: RouteAnswers):
        self._answers = answers
        self._serving: dict[asyncio.Task, grpc.aio.ServicerContext] = {}

    async def close(self) -> None:
        """End every open stream now (the router is stopping): a gateway sends what it would have sent unary."""
        await end_all(self._serving, "the router is stopping")

    async def serve(self, requests: AsyncIterator[router_pb2.RouteStreamRequest], context) -> None:
        stream = _Stream(context)
        serving = asyncio.current_task()
        assert serving is not None  # NOTE: grpc runs every handler in a task
        self._serving[serving] = context
        await context.send_initial_metadata(())  # NOTE: tells the gateway the stream is accepted: it may use it now
        try:
            async for message in requests:
                reply = self._handle(message, stream)
                if reply is not None:
                    await stream.write(reply)
            # NOTE: the gateway closed its side: what still waits is answered (each bounded) before the call ends
            await stream.drain()
        finally:
            stream.cancel()
            self._serving.pop(serving, None)

    def _handle(
        self, message: router_pb2.RouteStreamRequest, stream: "_Stream"
    ) -> router_pb2.RouteStreamResponse | None:
        kind = message.WhichOneof("call")
        try:
            if kind == "route":
                return self._route(message, stream)
            if kind == "complete":
                self._answers.complete(message.complete)
            elif kind == "report_failure":
                self._answers.report_failure(message.report_failure)
            else:
                return _error(message.call_id, grpc.StatusCode.INVALID_ARGUMENT, "a RouteStream message names no call")
        except Exception:  # NOTE: one message's bug fails that message alone, as a unary call's would (UNKNOWN)
            log.exception("RouteStream %s failed", kind)
            return _error(message.call_id, grpc.StatusCode.UNKNOWN, "internal error") if kind == "route" else None
        return None

    def _route(
        self, message: router_pb2.RouteStreamRequest, stream: "_Stream"
    ) -> router_pb2.RouteStreamResponse | None:
        started = time.perf_counter()
        try:
            reply = self._answers.route_now(message.route, started)
        except RouterError as exc:
            return _refused(message.call_id, exc)
        if reply is not None:
            return router_pb2.RouteStreamResponse(call_id=message.call_id, route=reply)
        stream.spawn(self._route_later(message, started, stream))
        return None

    async def _route_later(self, message: router_pb2.RouteStreamRequest, started: float, stream: "_Stream") -> None:
        timeout_s = message.timeout_s if message.timeout_s > 0 else None
        try:
            with continued_span(ROUTE_SPAN, message.trace_context):
                reply = await asyncio.wait_for(self._answers.route_later(message.route, started), timeout_s)
            answer = router_pb2.RouteStreamResponse(call_id=message.call_id, route=reply)
        except RouterError as exc:
            answer = _refused(message.call_id, exc)
        except TimeoutError:
            answer = _error(message.call_id, grpc.StatusCode.DEADLINE_EXCEEDED, "Deadline Exceeded")
        await stream.write(answer)


class _Stream:
    """One call's writing side: one write at a time (gRPC allows no more), and the tasks still answering on it."""

    def __init__(self, context):
        self._context = context
        self._lock = asyncio.Lock()
        self._waiting: set[asyncio.Task] = set()

    async def write(self, reply: router_pb2.RouteStreamResponse) -> None:
        async with self._lock:
            await self._context.write(reply)

    def spawn(self, work) -> None:
        task = asyncio.get_running_loop().create_task(work)
        self._waiting.add(task)
        task.add_done_callback(self._waiting.discard)

    async def drain(self) -> None:
        if self._waiting:
            await asyncio.gather(*self._waiting, return_exceptions=True)

    def cancel(self) -> None:
        for task in self._waiting:
            task.cancel()


def _refused(call_id: int, exc: RouterError) -> router_pb2.RouteStreamResponse:
    return router_pb2.RouteStreamResponse(call_id=call_id, error=failure(exc))  # NOTE: as a unary Route ends


def _error(call_id: int, code: grpc.StatusCode, message: str) -> router_pb2.RouteStreamResponse:
    return router_pb2.RouteStreamResponse(call_id=call_id, error=refusal(code, message))
