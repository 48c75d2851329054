"""The gateway's router replicas: Route calls spread over them in turn and fail over to the next on a transport
error; a request's Complete and failure reports go to the replica that routed it (its in-flight account lives
there). One replica behaves as before: a restarting router is waited for. Replicas named by DNS are looked up again
when one fails (a replaced pod has a new address). The calls ride each replica's RouteStream when it is open
(router_pool_stream.py). It speaks domain types; the protobuf stays inside (convert.py builds and reads it). No
decisions: routers make them.
"""

import asyncio
import itertools
import logging
import time
from collections.abc import Callable

import grpc

from services.common import convert
from services.common.domain import FailureReport, ListedWorker, Route, RouteRequest
from services.common.protos import router_pb2
from services.common.router_addresses import RouterAddressError, router_addresses
from services.gateway.router_pool_stream import Replica

log = logging.getLogger(__name__)

# NOTE: the router's own refusals (bad request, unknown model, busy) are answers: the next replica would agree
FAILOVER_CODES = frozenset(
    {grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.CANCELLED, grpc.StatusCode.UNKNOWN}
)


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
    ):
        if not channels:
            raise ValueError("need at least one router channel")
        self._by_address = {a: Replica(c) for a, c in zip(addresses or range(len(channels)), channels)}
        self._replicas = list(self._by_address.values())
        self._resolve, self._connect = resolve, connect
        self._min_interval_s, self._resolved_at = min_resolve_interval_s, time.monotonic()
        self._refreshing: asyncio.Task | None = None
        self._turn = itertools.count()
        self._routed_by: dict[str, Replica] = {}  # req_id -> the replica that routed it

    @property
    def channels(self) -> dict[str, grpc.aio.Channel]:
        """address -> channel, of the replicas in use"""
        return {a: r.channel for a, r in self._by_address.items()}

    @classmethod
    def from_addresses(cls, raw: str, connect: Callable[[str], grpc.aio.Channel]) -> "RouterPool":
        """A comma list of host:port and dns:NAME:PORT entries; DNS names are looked up again after failures."""
        addresses = router_addresses(raw)
        resolve = (lambda: router_addresses(raw)) if "dns:" in raw else None
        return cls([connect(a) for a in addresses], resolve, connect, addresses)

    async def route(self, request: RouteRequest, timeout_s: float) -> Route:
        """The next replica's answer; on a transport error the one after it, and so on. With one replica, or when
        all failed, one last call that waits for a replica to be ready (a restart), up to the timeout. When that
        fails too and the replicas' addresses have changed since, once more over the new ones."""
        message = convert.route_request_to_pb(request)
        try:
            return convert.route_from_pb(await self._route(request.req_id, message, timeout_s))
        except grpc.aio.AioRpcError as exc:
            if exc.code() not in FAILOVER_CODES or not await self.refresh():
                raise
        return convert.route_from_pb(await self._route(request.req_id, message, timeout_s))

    async def list_workers(self, timeout_s: float) -> list[ListedWorker]:
        """The workers one replica lists (each in turn until one answers; the last error when none does)."""
        for replica in self._replicas:  # NOTE: the readiness probe comes before traffic: the streams open meanwhile
            replica.stream.maybe_open()
        message = convert.list_workers_request_to_pb()
        return convert.listed_workers_from_pb(
            await self._any(lambda replica: replica.stub.ListWorkers(message, timeout=timeout_s))
        )

    async def report_failure(self, report: FailureReport, timeout_s: float) -> None:
        """To the replica that routed the request (the first one for a request never routed)."""
        replica = self._routed_by.get(report.req_id, self._replicas[0])
        await replica.report_failure(convert.failure_report_to_pb(report), timeout_s)

    async def complete(self, req_id: str, timeout_s: float) -> None:
        """To the replica that routed the request, which then forgets it."""
        replica = self._routed_by.pop(req_id, self._replicas[0])
        await replica.complete(convert.complete_request_to_pb(req_id), timeout_s)

    async def _route(self, req_id: str, message: router_pb2.RouteRequest, timeout_s: float) -> router_pb2.RouteResponse:
        replicas = self._replicas
        start = next(self._turn) % len(replicas)
        order = replicas[start:] + replicas[:start]
        if len(order) > 1:
            for replica in order:
                try:
                    reply = await replica.route(message, timeout_s)
                except grpc.aio.AioRpcError as exc:
                    if exc.code() not in FAILOVER_CODES:
                        raise
                    self._refresh_soon()
                    continue
                self._routed_by[req_id] = replica
                return reply
        reply = await order[0].route(message, timeout_s, wait_for_ready=True)
        self._routed_by[req_id] = order[0]
        return reply

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
        if set(addresses) == set(self._by_address):
            return False
        old = self._by_address
        self._by_address = {a: old.get(a) or Replica(self._connect(a)) for a in addresses}
        self._replicas = list(self._by_address.values())
        log.info("router replicas now %s", ", ".join(addresses))
        for address, replica in old.items():
            if address not in self._by_address:
                await replica.close()
        return True

    def _refresh_soon(self) -> None:
        if self._resolve is not None and (self._refreshing is None or self._refreshing.done()):
            self._refreshing = asyncio.get_running_loop().create_task(self.refresh())

    async def close(self) -> None:
        if self._refreshing is not None:
            await asyncio.gather(self._refreshing, return_exceptions=True)
        await asyncio.gather(*(replica.close() for replica in self._replicas))

    async def _any(self, call):
        """`call(replica)` on each replica in turn until one answers; the last error when none does."""
        start = next(self._turn) % len(self._replicas)
        last = None
        for replica in self._replicas[start:] + self._replicas[:start]:
            try:
                return await call(replica)
            except grpc.aio.AioRpcError as exc:
                if exc.code() not in FAILOVER_CODES:
                    raise
                last = exc
        raise last
