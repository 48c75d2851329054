"""The router's KV event subscriptions: one task per decode worker streaming StreamKvEvents into the kv policy's
prefix index, resuming after the last applied seq and resyncing from a snapshot after a gap or a lost stream.

I/O only: the index decides what an event means; workers without KV events are left to the approximate index.
"""

import asyncio
import logging
from collections.abc import Callable, Iterable

import grpc

from engines.base.events import KvSnapshot
from services.common.convert import kv_batch_from_pb
from services.common.grpc_server import make_channel
from services.common.protos import worker_pb2, worker_pb2_grpc
from services.router.kv_policy import KvAwarePolicy
from services.router.worker_streams import WorkerStreams

log = logging.getLogger(__name__)
ASK_SNAPSHOT = 2**64 - 1  # NOTE: an after_seq from the future always gets the worker's snapshot


class KvSubscriber(WorkerStreams):
    task_name = "kv-events"

    def __init__(
        self, policy: KvAwarePolicy, retry_s: float = 1.0, connect: Callable[[str], grpc.aio.Channel] = make_channel
    ):
        super().__init__(retry_s, connect)
        self.policy = policy
        self.index = policy.index

    def forget(self, gone_worker_ids: Iterable[str], live_worker_ids: Iterable[str]) -> None:
        """Workers that left: stop their streams and drop them from the policy; keep only live ones indexed."""
        for worker_id in gone_worker_ids:
            self._cancel(worker_id)
            self.policy.remove_worker(worker_id)
        self.index.retain_workers(live_worker_ids)

    async def _follow(self, worker_id: str, address: str) -> None:
        async with self._connect(address) as channel:
            stub = worker_pb2_grpc.WorkerControlStub(channel)
            after_seq = self.index.last_seq(worker_id)
            while True:
                try:
                    if not await self._stream(stub, worker_id, after_seq):
                        await asyncio.sleep(self.retry_s)  # the worker ended the stream: it is stopping
                except grpc.aio.AioRpcError as exc:
                    if exc.code() is grpc.StatusCode.UNIMPLEMENTED:
                        log.info("worker %s publishes no KV events; routing to it by own decisions", worker_id)
                        return
                    log.info("KV event stream of %s lost (%s); resyncing", worker_id, exc.code().name)
                    await asyncio.sleep(self.retry_s)
                except ValueError as exc:  # a malformed event: trust nothing until a snapshot
                    log.warning("bad KV event from %s: %s; resyncing", worker_id, exc)
                    await asyncio.sleep(self.retry_s)
                after_seq = ASK_SNAPSHOT  # NOTE: after a gap or a lost stream, a restarted worker reuses seqs

    async def _stream(self, stub: worker_pb2_grpc.WorkerControlStub, worker_id: str, after_seq: int) -> bool:
        """Apply batches until the stream ends (False) or shows a gap (True: resync at once)."""
        call = stub.StreamKvEvents(worker_pb2.StreamKvEventsRequest(after_seq=after_seq))
        try:
            async for msg in call:
                batch = kv_batch_from_pb(msg)
                if isinstance(batch, KvSnapshot):
                    self.index.resync(worker_id, batch)
                elif not self.index.apply(worker_id, batch):
                    log.info(
                        "gap in KV events of %s after seq %d; resyncing", worker_id, self.index.last_seq(worker_id)
                    )
                    return True
            return False
        finally:
            call.cancel()
