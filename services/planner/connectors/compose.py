"""The compose connector: asks the scaler service (services/scaler), over HTTP with a bearer token, to count and
scale the worker services of one compose project. It never runs docker itself and never sees the Docker socket."""

from collections.abc import Mapping
from dataclasses import dataclass

import httpx

from services.planner.types import ROLES, ConnectorError, Replicas, WorkerRole

TIMEOUT_S = 150.0  # the scaler's own `docker compose` may take up to 120 s


@dataclass(frozen=True, slots=True)
class ComposeProject:
    scaler_url: str
    project: str
    services: Mapping[WorkerRole, str]  # role -> compose service


class ComposeConnector:
    name = "compose"

    def __init__(self, project: ComposeProject, http: httpx.Client):
        self.project, self.http = project, http

    def replicas(self) -> Mapping[WorkerRole, Replicas]:
        names = [self.project.services[r] for r in ROLES]
        body = self._call("GET", "/v1/replicas", params={"project": self.project.project, "service": names})
        counts = body.get("services", {})
        return {role: _replicas(counts.get(self.project.services[role], {})) for role in ROLES}

    def scale(self, role: WorkerRole, target: int) -> None:
        # NOTE: compose stops the highest-numbered containers with SIGTERM; a worker deregisters and drains
        self._call(
            "POST",
            "/v1/scale",
            json={"project": self.project.project, "service": self.project.services[role], "replicas": target},
        )

    def _call(self, method: str, path: str, **kwargs) -> dict:
        try:
            reply = self.http.request(method, path, **kwargs)
        except httpx.HTTPError as exc:
            raise ConnectorError(f"the scaler at {self.project.scaler_url}: {exc!r}") from None
        if reply.status_code != 200:
            raise ConnectorError(f"the scaler refused {method} {path}: HTTP {reply.status_code} {reply.text[:300]}")
        try:
            return reply.json()
        except ValueError:
            raise ConnectorError(f"the scaler answered {path} with something that is not JSON") from None


def _replicas(c: Mapping[str, int]) -> Replicas:
    return Replicas(int(c.get("ready", 0)), int(c.get("starting", 0)), int(c.get("draining", 0)))


def scaler_client(url: str, token_file: str) -> httpx.Client:
    """An HTTP client for the scaler at `url`, presenting the token in `token_file`."""
    try:
        token = open(token_file, encoding="utf-8").read().strip()
    except OSError as exc:
        raise ConnectorError(f"the scaler's token file: {exc}") from None
    return httpx.Client(base_url=url, timeout=TIMEOUT_S, headers={"Authorization": f"Bearer {token}"})
