"""Before a worker whose lease lapsed is evicted, ask it: a worker that still answers its gRPC health check is slow
(a long step, a busy loop), not gone, and gets its lease extended; one that does not answer in time is evicted.

I/O only (the health calls); what a lease is and how often it may be extended is the registry's.
"""

import asyncio
import logging
from collections.abc import Awaitable, Callable

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from services.common.grpc_server import make_channel
from services.router.registry import Registry

log = logging.getLogger(__name__)
Probe = Callable[[str, float], Awaitable[bool]]


async def is_serving(address: str, timeout_s: float) -> bool:
    """True when the server at `address` says SERVING within `timeout_s`."""
    async with make_channel(address) as channel:
        try:
            reply = await health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=timeout_s)
        except grpc.aio.AioRpcError:
            return False
    return reply.status == health_pb2.HealthCheckResponse.SERVING


class LeaseProber:
    def __init__(self, registry: Registry, timeout_s: float, max_extensions: int, probe: Probe = is_serving):
        self.registry, self.timeout_s, self.max_extensions = registry, timeout_s, max_extensions
        self._probe = probe

    async def sweep(self) -> list[str]:
        """Probe every lapsed worker at once; extend the ones that answer, evict the rest. The evicted ids."""
        lapsed = {w: v.address for w in self.registry.lapsed() if (v := self.registry.info(w)) is not None}
        answers = await asyncio.gather(*(self._probe(address, self.timeout_s) for address in lapsed.values()))
        evicted = []
        for worker_id, is_alive in zip(lapsed, answers):
            if not self.registry.is_lapsed(worker_id):
                continue  # NOTE: it heartbeat (or left) while we asked
            if is_alive and self.registry.extend(worker_id, self.max_extensions):
                log.warning("worker %s missed its lease but answers its health check: lease extended", worker_id)
            elif self.registry.evict(worker_id):
                evicted.append(worker_id)
        return evicted
