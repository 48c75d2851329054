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
from services.router.worker_streams import WorkerStreams

log = logging.getLogger(__name__)


class LoadSubscriber(WorkerStreams):
    task_name = "load"

    def __init__(
        self,
        registry: Registry,
        interval_s: float,
        retry_s: float = 1.0,
        connect: Callable[[str], grpc.aio.Channel] = make_channel,
    ):
        super().__init__(retry_s, connect)
        self.registry = registry
        self.interval_s = interval_s

    def forget(self, gone_worker_ids: Iterable[str]) -> None:
        for worker_id in gone_worker_ids:
            self._cancel(worker_id)

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
