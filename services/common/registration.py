"""Keeps a worker registered with the router (with each replica: `Registrars`): register, heartbeat with load,
re-register when the lease was lost, retry with backoff while the router is away, deregister on stop. It runs on its
own thread with a blocking gRPC channel, so that heartbeats keep their timing however busy the worker's event loop
is (streams, KV transfers)."""

import asyncio
import logging
import threading
from collections.abc import Callable

import grpc

from services.common.grpc_server import make_sync_channel
from services.common.protos import common_pb2, router_pb2, router_pb2_grpc
from services.common.router_addresses import router_addresses

log = logging.getLogger(__name__)
# NOTE: a restarted router must see every worker again within a second or two: its KV index and its pool are
# rebuilt from their registrations (the router subscribes to each one's KV events when it registers)
MAX_BACKOFF_S = 1.0
RPC_TIMEOUT_S = 5.0


class Registrar:
    def __init__(self, router_address: str, info: router_pb2.WorkerInfo, load: Callable[[], common_pb2.WorkerLoad]):
        self.info, self.load = info, load  # NOTE: `load` is called on the registrar's thread
        self.channel = make_sync_channel(router_address)
        self.stub = router_pb2_grpc.RouterStub(self.channel)
        self.interval_s = 1.0
        self.registered = threading.Event()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="registrar", daemon=True)
        self._is_stopped = False

    def start(self) -> None:
        self._thread.start()

    async def stop(self) -> None:
        """Deregister and stop heartbeating; idempotent."""
        if self._is_stopped:
            return
        self._is_stopped = True
        self._stop.set()
        await asyncio.to_thread(self._finish)

    def _finish(self) -> None:
        if self._thread.is_alive():
            self._thread.join(RPC_TIMEOUT_S + 1)
        try:
            self.stub.Deregister(router_pb2.DeregisterRequest(worker_id=self.info.worker_id), timeout=2)
        except grpc.RpcError as exc:
            log.info("deregister failed (router away?): %s", exc.code().name)
        self.channel.close()

    def _run(self) -> None:
        backoff = 0.2
        while not self._stop.is_set():
            try:
                self._register()
                backoff = 0.2
                while self._heartbeat():
                    if self._stop.wait(self.interval_s):
                        return
                log.warning("router forgot worker %s; registering again", self.info.worker_id)
            except grpc.RpcError as exc:
                self.registered.clear()
                log.warning("router unreachable (%s); retrying in %.1fs", exc.code().name, backoff)
                self._stop.wait(backoff)
                backoff = min(backoff * 2, MAX_BACKOFF_S)

    def _register(self) -> None:
        reply = self.stub.Register(
            router_pb2.RegisterRequest(worker=self.info, load=self.load()), timeout=RPC_TIMEOUT_S
        )
        self.interval_s = reply.heartbeat_interval_s or 1.0
        self.registered.set()
        log.info("registered %s with the router (lease %.1fs)", self.info.worker_id, reply.lease_ttl_s)

    def _heartbeat(self) -> bool:
        request = router_pb2.HeartbeatRequest(worker_id=self.info.worker_id, load=self.load())
        return self.stub.Heartbeat(request, timeout=RPC_TIMEOUT_S).known


class Registrars:
    """One Registrar per router replica (`router_address` a comma list, or dns:NAME:PORT): every replica follows
    every worker, so each decides on its own full view."""

    def __init__(self, router_address: str, info: router_pb2.WorkerInfo, load: Callable[[], common_pb2.WorkerLoad]):
        self.members = [Registrar(a, info, load) for a in router_addresses(router_address)]

    def start(self) -> None:
        for member in self.members:
            member.start()

    async def stop(self) -> None:
        await asyncio.gather(*(member.stop() for member in self.members))
