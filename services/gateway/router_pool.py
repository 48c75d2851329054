"""The gateway's router replicas: Route calls spread over them in turn and fail over to the next on a transport
error; a request's Complete and failure reports go to the replica that routed it (its in-flight account lives
there): finished requests ride on the next Route to that replica, or go as one batched Complete when no Route
follows within `complete_delay_s` (a unary call is what mutual TLS makes dear). One replica behaves as before: a restarting router is waited for. Replicas named by DNS are looked up again
when one fails (a replaced pod has a new address). No decisions: routers make them.
"""

import asyncio
import itertools
import logging
import time
from collections.abc import Callable

import grpc

from services.common.protos import router_pb2, router_pb2_grpc
from services.common.router_addresses import RouterAddressError, router_addresses

log = logging.getLogger(__name__)

# NOTE: the router's own refusals (bad request, unknown model, busy) are answers: the next replica would agree
FAILOVER_CODES = frozenset(
    {grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.CANCELLED, grpc.StatusCode.UNKNOWN}
)
# NOTE: how stale the router's in-flight count may get when no Route follows a finished request (an idle gateway);
# under load the next Route carries it at once
COMPLETE_DELAY_S = 0.05
COMPLETE_TIMEOUT_S = 5.0


class RouterPool:
    """`resolve` (optional) gives the replicas' current addresses and `connect` a channel to one: after a transport
    error the pool looks them up again (at most once per `min_resolve_interval_s`) and swaps in what changed."""

    def __init__(
        self,
        channels: list[grpc.aio.Channel],
        resolve: Callable[[], list[str]] | None = None,
        connect: Callable[[str], grpc.aio.Channel] | None = None,
        addresses: list[str] | None = None,
        min_resolve_interval_s: float = 1.0,
        complete_delay_s: float = COMPLETE_DELAY_S,
    ):
        if not channels:
            raise ValueError("need at least one router channel")
        self.channels = dict(zip(addresses or range(len(channels)), channels))  # address -> channel
        self.stubs = [router_pb2_grpc.RouterStub(c) for c in channels]
        self._resolve, self._connect = resolve, connect
        self._min_interval_s, self._resolved_at = min_resolve_interval_s, time.monotonic()
        self._refreshing: asyncio.Task | None = None
        self._turn = itertools.count()
        self._routed_by: dict[str, router_pb2_grpc.RouterStub] = {}  # req_id -> the replica that routed it
        self._complete_delay_s = complete_delay_s
        self._finished: dict[router_pb2_grpc.RouterStub, list[str]] = {}  # replica -> req_ids not yet told
        self._flushes: dict[router_pb2_grpc.RouterStub, asyncio.Task] = {}  # replica -> its waiting batched Complete
        self._sending: set[asyncio.Task] = set()  # batched Completes under way

    @classmethod
    def from_addresses(cls, raw: str, connect: Callable[[str], grpc.aio.Channel]) -> "RouterPool":
        """A comma list of host:port and dns:NAME:PORT entries; DNS names are looked up again after failures."""
        addresses = router_addresses(raw)
        resolve = (lambda: router_addresses(raw)) if "dns:" in raw else None
        return cls([connect(a) for a in addresses], resolve, connect, addresses)

    async def route(self, request: router_pb2.RouteRequest, timeout_s: float) -> router_pb2.RouteResponse:
        """The next replica's answer; on a transport error the one after it, and so on. With one replica, or when
        all failed, one last call that waits for a replica to be ready (a restart), up to the timeout. When that
        fails too and the replicas' addresses have changed since, once more over the new ones."""
        try:
            return await self._route(request, timeout_s)
        except grpc.aio.AioRpcError as exc:
            if exc.code() not in FAILOVER_CODES or not await self.refresh():
                raise
        return await self._route(request, timeout_s)

    async def _route(self, request: router_pb2.RouteRequest, timeout_s: float) -> router_pb2.RouteResponse:
        stubs = self.stubs
        start = next(self._turn) % len(stubs)
        order = stubs[start:] + stubs[:start]
        if len(order) > 1:
            for stub in order:
                try:
                    reply = await self._route_on(stub, request, timeout=timeout_s)
                except grpc.aio.AioRpcError as exc:
                    if exc.code() not in FAILOVER_CODES:
                        raise
                    self._refresh_soon()
                    continue
                self._routed_by[request.req_id] = stub
                return reply
        reply = await self._route_on(order[0], request, timeout=timeout_s, wait_for_ready=True)
        self._routed_by[request.req_id] = order[0]
        return reply

    async def _route_on(
        self, stub: router_pb2_grpc.RouterStub, request: router_pb2.RouteRequest, **call
    ) -> router_pb2.RouteResponse:
        """One Route call carrying the replica's finished requests; they are kept for a resend when it fails (a
        Complete is idempotent, so one the router took before failing does no harm when sent again)."""
        finished = self._finished.pop(stub, [])
        del request.completed_req_ids[:]
        request.completed_req_ids.extend(finished)
        try:
            return await stub.Route(request, **call)
        except grpc.aio.AioRpcError:
            self._hold(stub, finished)
            raise
        finally:
            del request.completed_req_ids[:]

    def complete(self, req_id: str) -> None:
        """`req_id` is finished: tell the replica that routed it with its next Route, or after `complete_delay_s`."""
        self._hold(self.done(req_id), [req_id], resent=False)

    def _hold(self, stub: router_pb2_grpc.RouterStub, req_ids: list[str], resent: bool = True) -> None:
        if not req_ids:
            return
        held = self._finished.get(stub, [])
        self._finished[stub] = req_ids + held if resent else held + req_ids  # NOTE: in the order they finished
        task = self._flushes.get(stub)
        if task is None or task.done():
            self._flushes[stub] = asyncio.get_running_loop().create_task(self._flush_later(stub))

    async def _flush_later(self, stub: router_pb2_grpc.RouterStub) -> None:
        await asyncio.sleep(self._complete_delay_s)
        task = self._flushes.pop(stub)  # NOTE: from here a newly finished request needs a flush of its own
        self._sending.add(task)
        try:
            await self._flush(stub)
        finally:
            self._sending.discard(task)

    async def _flush(self, stub: router_pb2_grpc.RouterStub) -> None:
        finished = self._finished.pop(stub, [])
        if not finished:
            return  # a Route took them
        request = router_pb2.CompleteRequest(req_id=finished[0], more_req_ids=finished[1:])
        try:
            await stub.Complete(request, timeout=COMPLETE_TIMEOUT_S)
        except grpc.aio.AioRpcError as exc:
            # NOTE: as a lost Complete always was: the router drops them after its in-flight TTL
            log.warning("complete of %d requests not delivered: %s", len(finished), exc.code().name)

    async def refresh(self) -> bool:
        """Look the replicas up again (unless done within the interval); True when the set changed."""
        if self._resolve is None or time.monotonic() - self._resolved_at < self._min_interval_s:
            return False
        self._resolved_at = time.monotonic()
        try:
            addresses = await asyncio.to_thread(self._resolve)
        except RouterAddressError as exc:
            log.warning("router replicas not resolved again: %s", exc)
            return False
        if set(addresses) == set(self.channels):
            return False
        old = self.channels
        self.channels = {a: old.get(a) or self._connect(a) for a in addresses}
        self.stubs = [router_pb2_grpc.RouterStub(c) for c in self.channels.values()]
        log.info("router replicas now %s", ", ".join(addresses))
        for address, channel in old.items():
            if address not in self.channels:
                await channel.close()
        return True

    def _refresh_soon(self) -> None:
        if self._resolve is not None and (self._refreshing is None or self._refreshing.done()):
            self._refreshing = asyncio.get_running_loop().create_task(self.refresh())

    async def close(self) -> None:
        for task in self._flushes.values():  # NOTE: all still sleeping: what they hold goes now, below
            task.cancel()
        await asyncio.gather(
            *(self._flush(stub) for stub in list(self._finished)), *self._sending, return_exceptions=True
        )
        if self._refreshing is not None:
            await asyncio.gather(self._refreshing, return_exceptions=True)
        for channel in self.channels.values():
            await channel.close()

    def of(self, req_id: str) -> router_pb2_grpc.RouterStub:
        """The replica that routed `req_id` (the first one for a request never routed)."""
        return self._routed_by.get(req_id, self.stubs[0])

    def done(self, req_id: str) -> router_pb2_grpc.RouterStub:
        """As `of`, and forget the request."""
        return self._routed_by.pop(req_id, self.stubs[0])

    async def any(self, call):
        """`call(stub)` on each replica in turn until one answers; the last error when none does."""
        start = next(self._turn) % len(self.stubs)
        last = None
        for stub in self.stubs[start:] + self.stubs[:start]:
            try:
                return await call(stub)
            except grpc.aio.AioRpcError as exc:
                if exc.code() not in FAILOVER_CODES:
                    raise
                last = exc
        raise last
