"""The simulator's router replicas: N independent RouterCores (each its own registry, policy and prefix index), every
one fed every worker's KV events and load, as live replicas follow every worker; arrivals spread over them in turn,
as gateways spread Route calls, and a request completes on the replica that routed it. With N = 1, one router.

Pure: no I/O; time is the simulator's.
"""

from collections.abc import Callable, Iterable
from typing import NamedTuple

from engines.base.events import KvEvent
from engines.base.types import KvLayout
from services.router.core import RouterCore
from services.router.policy import DisaggregationPolicy
from services.router.prefix_index import PrefixIndex
from services.router.registry import Registry
from services.router.types import RouteDecision, RouteInput, WorkerInfo, WorkerLoad
from tandem.cluster.policies import make_sim_policy

_FOREVER = 1e18  # leases and in-flight entries never lapse in a simulation


class Replica(NamedTuple):
    registry: Registry
    index: PrefixIndex | None
    core: RouterCore


class SimRouters:
    def __init__(
        self,
        num_routers: int,
        policy_name: str,
        clock: Callable[[], float],
        layout: KvLayout,
        seed: int,
        overlap_weight: float,
        inflight_weight: float,
        disagg_min_tokens: int,
    ):
        if num_routers < 1:
            raise ValueError(f"need at least one router, got {num_routers}")
        self.replicas: list[Replica] = []
        for i in range(num_routers):
            registry = Registry(clock, lease_ttl_s=_FOREVER, inflight_ttl_s=_FOREVER)
            # NOTE: a replica of a seeded random policy draws its own sequence, as separate processes would
            policy, index = make_sim_policy(policy_name, clock, layout, seed + i, overlap_weight, inflight_weight)
            self.replicas.append(
                Replica(registry, index, RouterCore(registry, policy, DisaggregationPolicy(disagg_min_tokens)))
            )
        self._next = 0
        self._routed_by: dict[str, Replica] = {}  # req_id -> the replica that routed it, until it completes

    @property
    def first(self) -> Replica:
        return self.replicas[0]

    def route(self, request: RouteInput) -> RouteDecision:
        replica = self.replicas[self._next]
        self._next = (self._next + 1) % len(self.replicas)
        decision = replica.core.route(request)
        self._routed_by[request.req_id] = replica
        return decision

    def complete(self, req_id: str) -> None:
        replica = self._routed_by.pop(req_id, None)
        if replica is not None:
            replica.registry.complete(req_id)

    def register(self, info: WorkerInfo, load: WorkerLoad) -> None:
        for replica in self.replicas:
            replica.registry.register(info, load)

    def deregister(self, worker_id: str) -> None:
        for replica in self.replicas:
            replica.registry.deregister(worker_id)

    def heartbeat(self, worker_id: str, load: WorkerLoad) -> None:
        for replica in self.replicas:
            replica.registry.heartbeat(worker_id, load)

    def apply_events(self, worker_id: str, events: Iterable[KvEvent]) -> None:
        events = list(events)
        for replica in self.replicas:
            if replica.index is not None and events:
                replica.index.apply(worker_id, events)
