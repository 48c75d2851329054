"""The virtual connector: replicas of the cluster simulator. A start takes `start_delay_s` of virtual time (the
model load), a removal drains; every replica's GPU time is counted from the moment it is asked for until it has
drained. No I/O; time comes from the simulator."""

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Protocol

from services.planner.types import ROLES, Replicas, WorkerRole


class ScalableCluster(Protocol):
    def add_worker(self, role: WorkerRole) -> str: ...

    def remove_worker(self, worker_id: str) -> None: ...

    def is_drained(self, worker_id: str) -> bool: ...


@dataclass(slots=True)
class _Replica:
    role: WorkerRole
    asked_at: float
    ready_at: float
    worker_id: str = ""  # set once it serves
    draining: bool = False


class VirtualConnector:
    name = "virtual"

    def __init__(self, cluster: ScalableCluster, clock: Callable[[], float], start_delay_s: float = 0.0):
        self.cluster, self.clock, self.start_delay_s = cluster, clock, start_delay_s
        self._replicas: list[_Replica] = []
        self.gpu_seconds = 0.0  # of replicas already gone; `gpu_hours(now)` adds the live ones

    def adopt(self, role: WorkerRole, worker_id: str) -> None:
        """A worker the cluster started with, serving since time 0."""
        self._replicas.append(_Replica(role, 0.0, 0.0, worker_id))

    def replicas(self) -> Mapping[WorkerRole, Replicas]:
        self.advance()
        return {
            role: Replicas(
                sum(1 for r in self._live(role) if r.worker_id),
                sum(1 for r in self._live(role) if not r.worker_id),
                sum(1 for r in self._replicas if r.role is role and r.draining),
            )
            for role in ROLES
        }

    def scale(self, role: WorkerRole, target: int) -> None:
        self.advance()
        live = self._live(role)
        now = self.clock()
        for _ in range(target - len(live)):
            self._replicas.append(_Replica(role, now, now + self.start_delay_s))
        for replica in sorted(live, key=lambda r: (not r.worker_id, r.asked_at))[target:][::-1]:
            self._stop(replica, now)

    def advance(self) -> None:
        """Workers whose start delay has passed begin serving; drained ones are retired."""
        now = self.clock()
        for replica in list(self._replicas):
            if not replica.worker_id and not replica.draining and replica.ready_at <= now:
                replica.worker_id = self.cluster.add_worker(replica.role)
            elif replica.draining and self.cluster.is_drained(replica.worker_id):
                self._retire(replica, now)

    def gpu_hours(self, now: float) -> float:
        return (self.gpu_seconds + sum(now - r.asked_at for r in self._replicas)) / 3600

    def _live(self, role: WorkerRole) -> list[_Replica]:
        return [r for r in self._replicas if r.role is role and not r.draining]

    def _stop(self, replica: _Replica, now: float) -> None:
        if not replica.worker_id:  # still loading: nothing to drain
            self._retire(replica, now)
            return
        replica.draining = True
        self.cluster.remove_worker(replica.worker_id)

    def _retire(self, replica: _Replica, now: float) -> None:
        self._replicas.remove(replica)
        self.gpu_seconds += now - replica.asked_at
