"""The gateway's router replicas: Route calls spread over them in turn and fail over to the next on a transport
error; a request's Complete and failure reports go to the replica that routed it (its in-flight account lives
there). One replica behaves as before: a restarting router is waited for. No decisions: routers make them.
"""
import itertools

import grpc

from services.common.protos import router_pb2, router_pb2_grpc

# NOTE: the router's own refusals (bad request, unknown model, busy) are answers: the next replica would agree
FAILOVER_CODES = frozenset({grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED,
                            grpc.StatusCode.CANCELLED, grpc.StatusCode.UNKNOWN})


class RouterPool:
    def __init__(self, channels: list[grpc.aio.Channel]):
        if not channels:
            raise ValueError("need at least one router channel")
        self.stubs = [router_pb2_grpc.RouterStub(c) for c in channels]
        self._turn = itertools.count()
        self._routed_by: dict[str, router_pb2_grpc.RouterStub] = {}  # req_id -> the replica that routed it

    async def route(self, request: router_pb2.RouteRequest, timeout_s: float) -> router_pb2.RouteResponse:
        """The next replica's answer; on a transport error the one after it, and so on. With one replica, or when
        all failed, one last call that waits for a replica to be ready (a restart), up to the timeout."""
        start = next(self._turn) % len(self.stubs)
        order = self.stubs[start:] + self.stubs[:start]
        if len(order) > 1:
            for stub in order:
                try:
                    reply = await stub.Route(request, timeout=timeout_s)
                except grpc.aio.AioRpcError as exc:
                    if exc.code() not in FAILOVER_CODES:
                        raise
                    continue
                self._routed_by[request.req_id] = stub
                return reply
        reply = await order[0].Route(request, timeout=timeout_s, wait_for_ready=True)
        self._routed_by[request.req_id] = order[0]
        return reply

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
