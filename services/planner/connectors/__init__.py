"""Connectors: how the planner reads and changes replica counts (local processes, compose, Kubernetes, the
simulator). One Protocol; the service picks one by setting."""

from collections.abc import Mapping
from typing import Protocol

from services.planner.types import Replicas, WorkerRole

CONNECTORS = ("local", "compose", "kubernetes", "virtual")


class Connector(Protocol):
    """Blocking calls (the service runs them off its event loop); failures raise ConnectorError."""

    name: str

    def replicas(self) -> Mapping[WorkerRole, Replicas]:
        """Every role's replicas now."""
        ...

    def scale(self, role: WorkerRole, target: int) -> None:
        """Ask for `target` replicas of `role`: start new ones, or drain and remove the newest."""
        ...
