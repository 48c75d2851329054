"""The router's load subscriptions: one task per prefill worker streaming StreamLoad into the registry, so the
disaggregation check reads the worker's real queue as it changes instead of guessing from routes since its last
heartbeat. I/O only: the registry records, the disaggregation policy decides.
"""
import asyncio
import logging
from collections.abc import Callable, Iterable

import grpc

from services.common.grpc_server import make_channel
from services.common.protos import worker_pb2, worker_pb2_grpc
from services.router.convert import load_from_pb
from services.router.registry import Registry

log = logging.getLogger(__name__)


class LoadSubscriber:
    def __init__(self, registry: Registry, interval_s: float, retry_s: float = 1.0,
                 connect: Callable[[str], grpc.aio.Channel] = make_channel):
        self.registry = registry
        self.interval_s = interval_s
        self.retry_s = retry_s
        self._connect = connect
        self._tasks: dict[str, tuple[str, asyncio.Task]] = {}  # worker_id -> (address, task)

    def follow(self, worker_id: str, address: str) -> None:
        """Subscribe to a worker's load (again if its address changed); a live subscription is kept."""
        current = self._tasks.get(worker_id)
        if current is not None and current[0] == address and not current[1].done():
            return
        self._cancel(worker_id)
        task = asyncio.create_task(self._follow(worker_id, address), name=f"load-{worker_id}")
        self._tasks[worker_id] = (address, task)

    def forget(self, gone_worker_ids: Iterable[str]) -> None:
        for worker_id in gone_worker_ids:
            self._cancel(worker_id)

    def is_following(self, worker_id: str) -> bool:
        current = self._tasks.get(worker_id)
        return current is not None and not current[1].done()

    async def close(self) -> None:
        tasks = [task for _, task in self._tasks.values()]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self._tasks.clear()

    def _cancel(self, worker_id: str) -> None:
        current = self._tasks.pop(worker_id, None)
        if current is not None:
            current[1].cancel()

    async def _follow(self, worker_id: str, address: str) -> None:
        async with self._connect(address) as channel:
            stub = worker_pb2_grpc.WorkerControlStub(channel)
            while True:
                call = stub.StreamLoad(worker_pb2.StreamLoadRequest(interval_s=self.interval_s))
                try:
                    async for msg in call:
                        if not self.registry.report_load(worker_id, load_from_pb(msg)):
                            return  # it left the pool: its next registration follows it again
                except grpc.aio.AioRpcError as exc:
                    if exc.code() is grpc.StatusCode.UNIMPLEMENTED:
                        log.info("worker %s streams no load; its heartbeats alone say how busy it is", worker_id)
                        return
                    log.info("load stream of %s lost (%s); retrying", worker_id, exc.code().name)
                finally:
                    call.cancel()
                await asyncio.sleep(self.retry_s)
