"""The local connector: scales the worker processes of `tandem up` through the launcher's control endpoint
(tandem/stack_control.py). Blocking HTTP on loopback; the launcher starts, drains and stops the processes."""

from collections.abc import Mapping
from typing import Any

import httpx

from services.planner.types import ROLES, ConnectorError, Replicas, WorkerRole

TIMEOUT_S = 5.0


class LocalConnector:
    name = "local"

    def __init__(self, control_url: str, client: httpx.Client | None = None):
        if not control_url:
            raise ConnectorError("connector local needs the launcher's control URL (tandem up --planner sets it)")
        self.url = control_url.rstrip("/")
        self.client = client or httpx.Client(timeout=TIMEOUT_S)

    def replicas(self) -> Mapping[WorkerRole, Replicas]:
        return _parse(self._call("GET", "/workers"))

    def scale(self, role: WorkerRole, target: int) -> None:
        _parse(self._call("POST", "/scale", {"role": role.value, "replicas": target}))

    def _call(self, method: str, path: str, body: dict | None = None) -> dict:
        try:
            reply = self.client.request(method, self.url + path, json=body)
        except httpx.HTTPError as exc:
            raise ConnectorError(f"launcher control endpoint {self.url}: {exc}") from None
        if reply.status_code != 200:
            raise ConnectorError(f"launcher refused {method} {path}: {reply.status_code} {reply.text[:200]}")
        return reply.json()


def _parse(doc: dict) -> dict[WorkerRole, Replicas]:
    try:
        return {role: _replicas(doc[role.value]) for role in ROLES}
    except (KeyError, TypeError, ValueError) as exc:
        raise ConnectorError(f"launcher answered something that is not a replica count: {exc!r}") from None


def _replicas(fields: dict[str, Any]) -> Replicas:
    counts: dict[str, Any] = {k: int(v) for k, v in fields.items()}
    return Replicas(**counts)
