"""gRPC bootstrap shared by every service: message limits, health and reflection services,
client channels, and a serve-until-signal loop that drains before it exits."""
import asyncio
import logging
import signal
from collections.abc import Awaitable, Callable

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

log = logging.getLogger(__name__)
MAX_MESSAGE_BYTES = 64 << 20  # KV chunks are a few MiB; leave headroom
OPTIONS = [
    ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
    ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
    ("grpc.keepalive_time_ms", 10_000),
    ("grpc.keepalive_timeout_ms", 5_000),
    ("grpc.keepalive_permit_without_calls", 1),
    ("grpc.http2.max_pings_without_data", 0),
]


def make_channel(address: str) -> grpc.aio.Channel:
    return grpc.aio.insecure_channel(address, options=OPTIONS)


class GrpcServer:
    """One aio server with the standard health and reflection services."""

    def __init__(self, address: str, service_names: list[str]):
        self.server = grpc.aio.server(options=OPTIONS)
        self.health = health.aio.HealthServicer()
        health_pb2_grpc.add_HealthServicer_to_server(self.health, self.server)
        reflection.enable_server_reflection([*service_names, reflection.SERVICE_NAME, "grpc.health.v1.Health"],
                                            self.server)
        self.service_names = service_names
        self.port = self.server.add_insecure_port(address)
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
