"""The local connector against the launcher's real control endpoint over a fake stack: counts read, scaling
starts workers or drains the newest first, bad requests get 400, an unreachable launcher is a ConnectorError."""

import httpx
import pytest

from services.planner.connectors.local import LocalConnector
from services.planner.types import ConnectorError, Replicas, WorkerRole
from tandem.stack_control import ControlServer


class FakeStack:
    def __init__(self):
        self.live = {"prefill": ["prefill-0"], "decode": ["decode-0"]}
        self.draining: list[str] = []

    def live_workers(self, role):
        return list(self.live[role])

    def add_worker(self, role):
        name = f"{role}-{len(self.live[role]) + len(self.draining)}"
        self.live[role].append(name)
        return name

    def remove_worker(self, name):
        role = name.split("-")[0]
        self.live[role].remove(name)
        self.draining.append(name)

    def worker_counts(self):
        return {
            role: {"ready": len(names), "starting": 0, "draining": sum(1 for d in self.draining if d.startswith(role))}
            for role, names in self.live.items()
        }


@pytest.fixture
def control():
    server = ControlServer(FakeStack())
    server.start()
    yield server
    server.close()


def test_reads_and_scales_the_launchers_workers(control):
    connector = LocalConnector(control.url)
    assert connector.replicas() == {WorkerRole.PREFILL: Replicas(1), WorkerRole.DECODE: Replicas(1)}
    connector.scale(WorkerRole.DECODE, 3)
    assert control.stack.live["decode"] == ["decode-0", "decode-1", "decode-2"]
    connector.scale(WorkerRole.DECODE, 1)
    assert control.stack.draining == ["decode-2", "decode-1"]  # the newest first
    assert connector.replicas()[WorkerRole.DECODE] == Replicas(ready=1, draining=2)


def test_bad_requests_and_a_missing_launcher(control):
    for body in ({"role": "gateway", "replicas": 2}, {"role": "decode", "replicas": -1}, {"role": "decode"}):
        reply = httpx.post(f"{control.url}/scale", json=body)
        assert reply.status_code == 400 and reply.json()["error"], body
    assert httpx.get(f"{control.url}/nope").status_code == 404
    with pytest.raises(ConnectorError, match="launcher refused POST /scale: 400"):
        LocalConnector(control.url).scale(WorkerRole.DECODE, 65)  # more than a launcher runs
    with pytest.raises(ConnectorError, match="control endpoint"):
        LocalConnector("http://127.0.0.1:1").replicas()
    with pytest.raises(ConnectorError, match="control URL"):
        LocalConnector("")
