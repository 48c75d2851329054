"""Keeps a worker registered with the router: register, heartbeat with load, re-register when
the lease was lost, retry with backoff while the router is away, deregister on stop."""
import asyncio
import logging
from collections.abc import Callable

import grpc

from services.common.grpc_server import make_channel
from services.common.protos import common_pb2, router_pb2, router_pb2_grpc

log = logging.getLogger(__name__)
# NOTE: a restarted router must see every worker again within a second or two: its KV index and its pool are
# rebuilt from their registrations (the router subscribes to each one's KV events when it registers)
MAX_BACKOFF_S = 1.0


class Registrar:
    def __init__(self, router_address: str, info: router_pb2.WorkerInfo,
                 load: Callable[[], common_pb2.WorkerLoad]):
        self.info, self.load = info, load
        self.channel = make_channel(router_address)
        self.stub = router_pb2_grpc.RouterStub(self.channel)
        self.interval_s = 1.0
        self.registered = asyncio.Event()
        self._task: asyncio.Task | None = None
        self._is_stopped = False

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="registrar")

    async def stop(self) -> None:
        """Deregister and stop heartbeating; idempotent."""
        if self._is_stopped:
            return
        self._is_stopped = True
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        try:
            await self.stub.Deregister(router_pb2.DeregisterRequest(worker_id=self.info.worker_id), timeout=2)
        except grpc.aio.AioRpcError as exc:
            log.info("deregister failed (router away?): %s", exc.code().name)
        await self.channel.close()

    async def _run(self) -> None:
        backoff = 0.2
        while True:
            try:
                await self._register()
                backoff = 0.2
                while await self._heartbeat():
                    await asyncio.sleep(self.interval_s)
                log.warning("router forgot worker %s; registering again", self.info.worker_id)
            except grpc.aio.AioRpcError as exc:
                self.registered.clear()
                log.warning("router unreachable (%s); retrying in %.1fs", exc.code().name, backoff)
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, MAX_BACKOFF_S)

    async def _register(self) -> None:
        reply = await self.stub.Register(router_pb2.RegisterRequest(worker=self.info, load=self.load()), timeout=5)
        self.interval_s = reply.heartbeat_interval_s or 1.0
        self.registered.set()
        log.info("registered %s with the router (lease %.1fs)", self.info.worker_id, reply.lease_ttl_s)

    async def _heartbeat(self) -> bool:
        request = router_pb2.HeartbeatRequest(worker_id=self.info.worker_id, load=self.load())
        return (await self.stub.Heartbeat(request, timeout=5)).known
