"""The router's gRPC shell: the Router servicer, the lease sweeper, `serve` and `main`.

No decision logic here: each method reads the proto, calls the core, writes the proto.
"""

import argparse
import asyncio
import functools
import logging
import sys
import time

from services.common.errors import abort_with, status_for
from services.common.grpc_server import GrpcServer, run_until_signal
from services.common.logs import request_id, setup_logging
from services.common.metrics import MetricsEndpoint
from services.common.peer import require_worker
from services.common.protos import router_pb2, router_pb2_grpc
from services.common.settings import SettingsError
from services.common.tls import process_tls
from services.common.tracing import setup_tracing, shutdown_tracing
from services.router.convert import (
    decision_to_pb,
    load_from_pb,
    route_input_from_pb,
    worker_info_from_pb,
    worker_status_to_pb,
)
from services.router.core import RouterCore
from services.router.kv_policy import KvAwarePolicy
from services.router.kv_subscriber import KvSubscriber
from services.router.load_subscriber import LoadSubscriber
from services.router.metrics import RouterMetrics
from services.router.policy import DisaggregationPolicy, make_policy
from services.router.probe import LeaseProber
from services.router.registry import Clock, Registry
from services.router.route_stream import RouteStreams
from services.router.settings import RouterSettings, add_arguments, settings_from
from services.router.types import NoWorkerAvailableError, RouterError, UnknownModelError, WorkerRole

log = logging.getLogger(__name__)
SERVICE_NAME = router_pb2.DESCRIPTOR.services_by_name["Router"].full_name
STARTUP_POLL_S = 0.05


def _maps_errors(method):
    """End the RPC with the status matching a RouterError instead of an opaque UNKNOWN."""

    @functools.wraps(method)
    async def wrapper(self, request, context):
        try:
            return await method(self, request, context)
        except RouterError as exc:
            await abort_with(context, exc)

    return wrapper


def build_core(settings: RouterSettings, clock: Clock = time.monotonic) -> RouterCore:
    registry = Registry(clock, settings.lease_ttl_s, settings.inflight_ttl_s)
    disagg = DisaggregationPolicy(settings.disagg_min_tokens, settings.prefill_max_waiting)
    policy = make_policy(settings.policy, settings.kv_config, clock, index_max_entries=settings.kv_index_max_entries)
    return RouterCore(registry, policy, disagg, busy=settings.busy)


def make_subscriber(core: RouterCore) -> KvSubscriber | None:
    """Subscriptions to workers' KV events, when the policy is kv and uses them."""
    policy = core.policy
    return KvSubscriber(policy) if isinstance(policy, KvAwarePolicy) and policy.event_index is not None else None


class RouterServicer(router_pb2_grpc.RouterServicer):
    def __init__(
        self,
        core: RouterCore,
        settings: RouterSettings,
        kv: KvSubscriber | None = None,
        metrics: RouterMetrics | None = None,
        loads: LoadSubscriber | None = None,
    ):
        self.traffic = router_pb2.Traffic()  # cumulative; GetTraffic stamps uptime_s
        self._started = time.monotonic()
        self.core = core
        self.registry = core.registry
        self.settings = settings
        self.kv = kv
        self.loads = loads
        self.metrics = metrics or RouterMetrics(self.registry.views)
        self.streams = RouteStreams(self)

    @_maps_errors
    async def Register(self, request, context):
        info = worker_info_from_pb(request.worker)
        await require_worker(context, info.worker_id, info.role.value)
        is_new = self.registry.register(info, load_from_pb(request.load))
        log.info(
            "%s %s worker %s at %s (model %s)",
            "registered" if is_new else "re-registered",
            info.role.value,
            info.worker_id,
            info.address,
            info.model,
        )
        if self.kv is not None and info.role is WorkerRole.DECODE:
            self.kv.follow(info.worker_id, info.address)
        if self.loads is not None and info.role is WorkerRole.PREFILL:
            self.loads.follow(info.worker_id, info.address)
        return router_pb2.RegisterResponse(
            lease_ttl_s=self.settings.lease_ttl_s, heartbeat_interval_s=self.settings.heartbeat_interval_s
        )

    async def Heartbeat(self, request, context):
        await require_worker(context, request.worker_id)
        is_known = self.registry.heartbeat(request.worker_id, load_from_pb(request.load))
        if not is_known:
            log.info("heartbeat from unknown worker %s; it must register again", request.worker_id)
        return router_pb2.HeartbeatResponse(known=is_known)

    async def Deregister(self, request, context):
        await require_worker(context, request.worker_id)
        if self.registry.deregister(request.worker_id):
            log.info("deregistered worker %s", request.worker_id)
        if self.kv is not None:
            self.kv.forget([request.worker_id], (v.worker_id for v in self.registry.views()))
        if self.loads is not None:
            self.loads.forget([request.worker_id])
        return router_pb2.DeregisterResponse()

    @_maps_errors
    async def Route(self, request, context):
        started = time.perf_counter()
        reply = self.route_now(request, started)
        return reply if reply is not None else await self.route_later(request, started)

    async def RouteStream(self, request_iterator, context):
        await self.streams.serve(request_iterator, context)  # NOTE: a coroutine: grpc runs it on the loop

    def route_now(self, request: router_pb2.RouteRequest, started: float) -> router_pb2.RouteResponse | None:
        """The answer to `request`, decided now; None while a (re)started router's empty pool is waited on (the
        workers are registering again: `route_later`). Raises RouterError when no worker can take it."""
        token = request_id.set(request.req_id)
        try:
            try:
                decision = self.core.route(route_input_from_pb(request, self.settings.kv_hash_secret))
            except (NoWorkerAvailableError, UnknownModelError) as exc:
                if time.monotonic() - self._started < self.settings.startup_grace_s:
                    return None
                self._route_failed(exc)
                raise
            except RouterError as exc:
                self._route_failed(exc)
                raise
            return self._routed(request, decision, started)
        finally:
            request_id.reset(token)

    async def route_later(self, request: router_pb2.RouteRequest, started: float) -> router_pb2.RouteResponse:
        """`route_now`, polled until it decides (it stops waiting once the start-up grace is over)."""
        while True:
            await asyncio.sleep(STARTUP_POLL_S)
            reply = self.route_now(request, started)
            if reply is not None:
                return reply

    def _route_failed(self, exc: RouterError) -> None:
        outcome = status_for(exc).name.lower()
        self.metrics.failed(self.settings.policy, outcome)
        log.info("route failed: %s", exc, extra={"outcome": outcome})

    def _routed(self, request, decision, started: float) -> router_pb2.RouteResponse:
        self.metrics.decided(decision, len(request.token_ids), time.perf_counter() - started)
        asyncio.get_running_loop().call_soon(self.core.flush_deferred)  # NOTE: after this reply, not inside it
        self.traffic.num_routed += 1
        self.traffic.num_prompt_tokens += len(request.token_ids)
        log.info(
            "routed to %s%s",
            decision.decode.worker_id,
            f" after prefill on {decision.prefill.worker_id}" if decision.prefill else "",
            extra={
                "num_tokens": len(request.token_ids),
                "policy": decision.policy,
                "num_cached_tokens": decision.num_cached_tokens,
                "reason": decision.reason,
            },
        )
        return decision_to_pb(decision)

    async def ListWorkers(self, request, context):
        statuses = [worker_status_to_pb(v) for v in self.registry.views()]
        for status in statuses:
            status.quarantine_left_s = self.registry.quarantine_left_s(status.worker.worker_id)
        return router_pb2.ListWorkersResponse(workers=statuses)

    async def Complete(self, request, context):
        self.complete(request)
        return router_pb2.CompleteResponse()

    def complete(self, request: router_pb2.CompleteRequest) -> None:
        self.registry.complete(request.req_id)  # NOTE: idempotent; an unknown req_id already expired
        self.traffic.num_completed += 1

    async def GetTraffic(self, request, context):
        reply = router_pb2.Traffic()
        reply.CopyFrom(self.traffic)
        reply.uptime_s = time.monotonic() - self._started
        return reply

    async def ReportFailure(self, request, context):
        return router_pb2.ReportFailureResponse(quarantine_s=self.report_failure(request))

    def report_failure(self, request: router_pb2.ReportFailureRequest) -> float:
        """Quarantine the worker a gateway saw fail; the quarantine's length (0: the worker is not known)."""
        duration_s = self.settings.quarantine_s
        if not self.registry.quarantine(request.worker_id, duration_s):
            return 0.0
        self.metrics.worker_failed(request.worker_id)
        log.warning(
            "worker %s failed %s (%s): quarantined for %.1f s",
            request.worker_id,
            request.req_id,
            request.reason,
            duration_s,
        )
        return duration_s


class RouterService:
    """The servicer on a GrpcServer, plus the task that sweeps lapsed leases and stale in-flight entries."""

    def __init__(self, settings: RouterSettings, clock: Clock = time.monotonic):
        self.settings = settings
        self.core = build_core(settings, clock)
        self.registry = self.core.registry
        self.kv = make_subscriber(self.core)
        interval_s = settings.load_stream_interval_s
        self.loads = LoadSubscriber(self.registry, interval_s) if interval_s > 0 else None
        index = self.core.policy.event_index
        self.metrics = RouterMetrics(
            self.registry.views, index_blocks=index.blocks_per_worker if index is not None else None
        )
        self.metrics.start_at_zero(settings.policy)
        self.server = GrpcServer(settings.address, [SERVICE_NAME], self.metrics.registry, limits="router")
        self.servicer = RouterServicer(self.core, settings, self.kv, self.metrics, self.loads)
        router_pb2_grpc.add_RouterServicer_to_server(self.servicer, self.server.server)
        self.prober = LeaseProber(self.registry, settings.probe_timeout_s, settings.max_lease_extensions)
        self._sweeper: asyncio.Task | None = None
        self._metrics_endpoint: MetricsEndpoint | None = None

    @property
    def port(self) -> int:
        return self.server.port

    @property
    def metrics_port(self) -> int:
        return self._metrics_endpoint.port if self._metrics_endpoint else -1

    async def start(self) -> None:
        self._metrics_endpoint = MetricsEndpoint(self.metrics.registry, self.settings.host, self.settings.metrics_port)
        await self.server.start()
        self._sweeper = asyncio.create_task(self._sweep_forever(), name="router-sweeper")
        log.info(
            "router serving on %s:%d (policy %s)",
            self.settings.host,
            self.port,
            self.settings.policy,
            extra={"metrics_port": self.metrics_port},
        )

    async def stop(self, grace_s: float = 5.0) -> None:
        if self._sweeper is not None:
            self._sweeper.cancel()
            await asyncio.gather(self._sweeper, return_exceptions=True)
        if self.kv is not None:
            await self.kv.close()
        if self.loads is not None:
            await self.loads.close()
        await self.servicer.streams.close()
        await self.server.stop(grace_s)
        if self._metrics_endpoint is not None:
            self._metrics_endpoint.close()

    async def sweep(self) -> None:
        expired = await self.prober.sweep()
        for worker_id in expired:
            log.info("lease expired: worker %s left the pool", worker_id)
        if expired and self.kv is not None:
            self.kv.forget(expired, (v.worker_id for v in self.registry.views()))
        if expired and self.loads is not None:
            self.loads.forget(expired)
        stale = self.registry.expire_inflight()
        if stale:
            log.info(
                "dropped %d in-flight requests never completed within %.0f s", len(stale), self.settings.inflight_ttl_s
            )

    async def _sweep_forever(self) -> None:
        while True:
            await asyncio.sleep(self.settings.sweep_interval_s)
            try:
                await self.sweep()
            except Exception:  # NOTE: a bug here must not stop leases from ever expiring again
                log.exception("lease sweep failed")


async def serve(settings: RouterSettings) -> None:
    service = RouterService(settings)
    await run_until_signal(service.start, service.stop)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="tandem serve router", description="the tandem router")
    parser.add_argument("-v", "--verbose", action="store_true", help="log every routing decision")
    add_arguments(parser)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        settings = settings_from(args)
        process_tls().check_bind(settings.address)
    except SettingsError as exc:
        print(f"tandem router: error: {exc}", file=sys.stderr)
        return 2
    setup_logging("router")
    if args.verbose:  # our decisions only; grpc's and asyncio's debug output would drown them
        logging.getLogger("services").setLevel(logging.DEBUG)
    setup_tracing("router")
    try:
        asyncio.run(serve(settings))
    finally:
        shutdown_tracing()
    return 0


if __name__ == "__main__":
    sys.exit(main())
