"""The compose connector, checked by the commands it builds and how it reads `docker compose ps` (no Docker
engine runs here): one service scaled at a time, never its dependencies, running containers left alone."""
import json

import pytest

from services.planner.connectors.compose import ComposeConnector, ComposeProject, count, parse_ps, run_command
from services.planner.types import ConnectorError, Replicas, WorkerRole

P, D = WorkerRole.PREFILL, WorkerRole.DECODE
PROJECT = ComposeProject("docker compose", "/srv/tandem/compose.yaml", "tandem", {P: "prefill", D: "decode"})


class Recorder:
    def __init__(self, output: str = ""):
        self.argvs: list[list[str]] = []
        self.output = output

    def __call__(self, argv: list[str]) -> str:
        self.argvs.append(argv)
        return self.output


def test_scaling_builds_one_up_scale_command_per_role():
    runner = Recorder()
    ComposeConnector(PROJECT, runner).scale(D, 3)
    assert runner.argvs == [["docker", "compose", "-f", "/srv/tandem/compose.yaml", "-p", "tandem", "up",
                             "--detach", "--no-deps", "--no-recreate", "--scale", "decode=3", "decode"]]
    runner = Recorder()
    ComposeConnector(ComposeProject("docker-compose", "compose.yaml", "", {P: "prefill-gpu", D: "decode-gpu"}),
                     runner).scale(P, 0)
    assert runner.argvs == [["docker-compose", "-f", "compose.yaml", "up", "--detach", "--no-deps", "--no-recreate",
                             "--scale", "prefill-gpu=0", "prefill-gpu"]]


PS_LINES = [  # docker compose v2.21+ prints one JSON object per container
    {"Service": "decode", "State": "running", "Health": "healthy", "Name": "tandem-decode-1"},
    {"Service": "decode", "State": "running", "Health": "starting", "Name": "tandem-decode-2"},
    {"Service": "decode", "State": "created", "Health": "", "Name": "tandem-decode-3"},
    {"Service": "decode", "State": "exited", "Health": "", "Name": "tandem-decode-4"},
    {"Service": "prefill", "State": "running", "Health": "", "Name": "tandem-prefill-1"},
    {"Service": "prefill", "State": "removing", "Health": "", "Name": "tandem-prefill-2"},
    {"Service": "gateway", "State": "running", "Health": "healthy", "Name": "tandem-gateway-1"},
]


def test_replicas_come_from_compose_ps_in_either_json_shape():
    runner = Recorder("\n".join(json.dumps(line) for line in PS_LINES) + "\n")
    replicas = ComposeConnector(PROJECT, runner).replicas()
    assert runner.argvs == [["docker", "compose", "-f", "/srv/tandem/compose.yaml", "-p", "tandem", "ps", "--all",
                             "--format", "json", "prefill", "decode"]]
    assert replicas == {D: Replicas(ready=1, starting=2), P: Replicas(ready=1, draining=1)}
    assert parse_ps(json.dumps(PS_LINES)) == PS_LINES  # older compose: one JSON array
    assert parse_ps("") == [] and count([], "decode") == Replicas()


def test_a_failing_or_garbled_command_is_a_connector_error():
    with pytest.raises(ConnectorError, match="not JSON"):
        parse_ps("Error response from daemon\n")
    with pytest.raises(ConnectorError, match="exited 3"):
        run_command(["sh", "-c", "echo no such service >&2; exit 3"])
    with pytest.raises(ConnectorError, match="No such file"):
        run_command(["/nonexistent/docker", "compose", "ps"])
    assert run_command(["echo", "ok"]) == "ok\n"
