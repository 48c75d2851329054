"""gRPC bootstrap shared by every service: message limits, keepalive and reconnect timing, TLS when configured
(services/common/tls.py) with per-method authorization under mTLS, health and (asked for) reflection services,
client channels, and a serve-until-signal loop that drains before it exits."""

import asyncio
import logging
import signal
from collections.abc import Awaitable, Callable

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection
from prometheus_client import CollectorRegistry

from services.common.authz_guard import AuthzGuard
from services.common.grpc_limits import max_concurrent_rpcs, server_options
from services.common.tls import GrpcTls, process_tls

log = logging.getLogger(__name__)
MAX_MESSAGE_BYTES = 64 << 20  # KV chunks are a few MiB; leave headroom
_SHARED = [
    ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
    ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
    ("grpc.http2.max_pings_without_data", 0),
]
# NOTE: a peer that stops answering pings (SIGSTOP, a dead host, a dropped link) fails its calls with UNAVAILABLE
# within keepalive time + timeout, so the gateway can migrate them; a restarted peer is dialled again within 1 s,
# not after gRPC's default backoff of up to two minutes
CHANNEL_OPTIONS = [
    *_SHARED,
    ("grpc.keepalive_time_ms", 5_000),
    ("grpc.keepalive_timeout_ms", 5_000),
    ("grpc.keepalive_permit_without_calls", 1),
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.min_reconnect_backoff_ms", 100),
    ("grpc.max_reconnect_backoff_ms", 1_000),
]
# servers accept those pings (the default allows one per 5 minutes without data and then sends GOAWAY), and
# ping their clients in turn, so the streams of a client that vanished are cancelled
SERVER_OPTIONS = [
    *_SHARED,
    ("grpc.keepalive_time_ms", 10_000),
    ("grpc.keepalive_timeout_ms", 5_000),
    ("grpc.keepalive_permit_without_calls", 1),
    ("grpc.http2.min_ping_interval_without_data_ms", 1_000),
    # NOTE: a stream that waits long without data (a request queued behind KV loads) takes the keepalive pings
    # instead of closing the connection with "too many pings"
    ("grpc.http2.min_recv_ping_interval_without_data_ms", 1_000),
    ("grpc.http2.max_ping_strikes", 0),
]


def make_channel(address: str, tls: GrpcTls | None = None) -> grpc.aio.Channel:
    """An asyncio channel to a tandem service: TLS when TANDEM_GRPC_TLS_* (or `tls`) says so, else plaintext."""
    tls = tls or process_tls()
    if tls.is_enabled:
        return grpc.aio.secure_channel(address, tls.channel_credentials(), CHANNEL_OPTIONS + tls.channel_options())
    return grpc.aio.insecure_channel(address, options=CHANNEL_OPTIONS)


def make_sync_channel(address: str, tls: GrpcTls | None = None) -> grpc.Channel:
    """The same, blocking (the registrar's heartbeat thread, the launcher's probes, health checks, tests)."""
    tls = tls or process_tls()
    if tls.is_enabled:
        return grpc.secure_channel(address, tls.channel_credentials(), CHANNEL_OPTIONS + tls.channel_options())
    return grpc.insecure_channel(address, options=CHANNEL_OPTIONS)


class GrpcServer:
    """One aio server with the standard health service (open to all), reflection when asked for, and under mutual
    TLS per-method authorization, its refusals counted into `registry`. Servicers register on `server`, which under
    mutual TLS guards every handler as it is added (services/common/authz_guard.py)."""

    def __init__(
        self, address: str, service_names: list[str], registry: CollectorRegistry | None = None, limits: str = ""
    ):
        # `limits`: the service whose grpc_limits apply (message sizes, calls at once); "": the shared options only
        tls = process_tls()
        tls.check_bind(address)
        self.authz = AuthzGuard() if tls.is_mutual else None
        if self.authz is not None and registry is not None:
            registry.register(self.authz.denied)
        options = server_options(SERVER_OPTIONS, limits) if limits else SERVER_OPTIONS
        raw = grpc.aio.server(options=options, maximum_concurrent_rpcs=max_concurrent_rpcs(limits))
        self.server = self.authz.server(raw) if self.authz is not None else raw
        self.health = health.aio.HealthServicer()
        health_pb2_grpc.add_HealthServicer_to_server(self.health, self.server)
        if tls.reflection:
            reflection.enable_server_reflection(
                [*service_names, reflection.SERVICE_NAME, "grpc.health.v1.Health"], self.server
            )
        self.service_names = service_names
        self.port = (
            self.server.add_secure_port(address, tls.server_credentials())
            if tls.is_enabled
            else self.server.add_insecure_port(address)
        )
        if self.port == 0:
            raise OSError(f"cannot listen on {address}")

    async def start(self) -> None:
        await self.server.start()
        await self.set_serving(True)

    async def set_serving(self, is_serving: bool) -> None:
        status = health_pb2.HealthCheckResponse.SERVING if is_serving else health_pb2.HealthCheckResponse.NOT_SERVING
        for name in ["", *self.service_names]:
            await self.health.set(name, status)

    async def stop(self, grace_s: float = 5.0) -> None:
        await self.set_serving(False)
        await self.server.stop(grace_s)


async def run_until_signal(start: Callable[[], Awaitable[None]], stop: Callable[[], Awaitable[None]]) -> None:
    """Start, wait for SIGINT/SIGTERM, then stop (draining) — what every `tandem serve` does."""
    stopped = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stopped.set)
    await start()
    await stopped.wait()
    log.info("signal received; draining")
    await stop()
