"""The decode worker's gate for KV handles: the signature, lease, prompt and replay checks (kv_signing), then the
source — a prefill worker the router has registered at that address — before any pull or READ. The router's pool
is cached and asked again only when it is stale or a verified handle names a worker the cache has not seen (a
forged handle never gets that far, so strangers cannot make it call the router)."""

import asyncio
import logging
import time

import grpc

from services.common.grpc_server import make_channel
from services.common.kv_signing import HandleNotTrusted, KvVerifier
from services.common.protos import common_pb2, router_pb2, router_pb2_grpc
from services.common.router_addresses import router_addresses

log = logging.getLogger(__name__)
POOL_TTL_S = 5.0  # the cached pool is refreshed when older than this
MISS_REFRESH_S = 0.5  # and on a miss, at most this often (a miss waits for its turn)
LIST_TIMEOUT_S = 2.0


class PrefillPool:
    """(worker_id, address) of the router's registered prefill workers, from ListWorkers."""

    def __init__(self, router_address: str, clock=time.monotonic, sleep=asyncio.sleep):
        self._addresses = router_addresses(router_address)
        self._clock, self._sleep = clock, sleep
        self._known: frozenset[tuple[str, str]] = frozenset()
        self._fetched_at = -1e9
        self._lock = asyncio.Lock()
        self._channels: dict[str, grpc.aio.Channel] = {}

    async def is_registered(self, worker_id: str, address: str) -> bool:
        if self._clock() - self._fetched_at > POOL_TTL_S:
            await self._refresh(0.0)
        if (worker_id, address) not in self._known:
            await self._refresh(MISS_REFRESH_S)
        return (worker_id, address) in self._known

    async def _refresh(self, min_age_s: float) -> None:
        async with self._lock:  # NOTE: concurrent misses share one ListWorkers
            wait_s = min_age_s - (self._clock() - self._fetched_at)
            if wait_s > 0:  # NOTE: a miss waits its turn rather than refusing a worker that registered just now
                await self._sleep(wait_s)
            self._fetched_at = self._clock()
            for address in self._addresses:  # the first replica that answers
                try:
                    reply = await self._stub(address).ListWorkers(
                        router_pb2.ListWorkersRequest(), timeout=LIST_TIMEOUT_S
                    )
                except grpc.aio.AioRpcError as exc:
                    log.warning("KV gate: router %s did not list its workers (%s)", address, exc.code().name)
                    continue
                self._known = frozenset(
                    (s.worker.worker_id, s.worker.address)
                    for s in reply.workers
                    if s.worker.role == common_pb2.WORKER_ROLE_PREFILL
                )
                return

    def _stub(self, address: str) -> router_pb2_grpc.RouterStub:
        if address not in self._channels:
            self._channels[address] = make_channel(address)
        return router_pb2_grpc.RouterStub(self._channels[address])

    async def close(self) -> None:
        for channel in self._channels.values():
            await channel.close()


class KvGate:
    def __init__(self, verifier: KvVerifier, pool: PrefillPool | None, clock=time.time):
        self.verifier, self.pool, self._clock = verifier, pool, clock

    async def admit(self, handle: common_pb2.KvHandle, token_ids) -> None:
        """Raise KvHandleError unless the handle may be used for these tokens; it is then used up."""
        now = self._clock()
        self.verifier.check(handle, token_ids, now)
        self.verifier.claim(handle, now)  # NOTE: before the await, so two copies in flight cannot both pass
        if self.pool is not None and not await self.pool.is_registered(handle.worker_id, handle.address):
            raise HandleNotTrusted(
                f"the KV handle names {handle.worker_id!r} at {handle.address}, which is not a "
                "registered prefill worker",
                "unregistered_source",
            )
