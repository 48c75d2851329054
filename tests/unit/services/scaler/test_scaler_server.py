"""The scaler's HTTP service with the planner's compose connector as its client (the real FastAPI app, the real
connector; only `docker compose` is a recorder): the token is required, the policy refuses before any command
runs, and the connector sees the counts compose reports."""

import json
import os

import pytest
from fastapi.testclient import TestClient

from services.common.settings import SettingsError
from services.planner.connectors.compose import ComposeConnector, scaler_client
from services.planner.connectors.compose import ComposeProject as PlannerProject
from services.planner.types import ConnectorError, Replicas, WorkerRole
from services.scaler.compose_cli import ComposeError, ComposeProject
from services.scaler.policy import Bounds, ScalePolicy
from services.scaler.server import create_app, load_or_create_token

TOKEN = "t" * 32
P, D = WorkerRole.PREFILL, WorkerRole.DECODE
PS = [
    {"Service": "decode", "State": "running", "Health": "healthy"},
    {"Service": "decode", "State": "running", "Health": "starting"},
    {"Service": "prefill", "State": "running", "Health": "healthy"},
]


class Recorder:
    def __init__(self, output: str = "", error: Exception | None = None):
        self.argvs: list[list[str]] = []
        self.output, self.error = output, error

    def __call__(self, argv: list[str]) -> str:
        self.argvs.append(argv)
        if self.error is not None:
            raise self.error
        return self.output


def scaler(runner: Recorder, token: str = TOKEN) -> TestClient:
    policy = ScalePolicy("tandem", {"prefill": Bounds(0, 2), "decode": Bounds(1, 4)})
    app = create_app(policy, ComposeProject("docker compose", "/opt/tandem/compose.yaml", "tandem"), TOKEN, runner)
    return TestClient(app, headers={"Authorization": f"Bearer {token}"})


def connector(http, project: str = "tandem", decode: str = "decode") -> ComposeConnector:
    return ComposeConnector(PlannerProject("http://testserver", project, {P: "prefill", D: decode}), http)


def test_the_planner_scales_and_counts_through_the_scaler():
    runner = Recorder("\n".join(json.dumps(c) for c in PS))
    planner = connector(scaler(runner))
    assert planner.replicas() == {D: Replicas(ready=1, starting=1), P: Replicas(ready=1)}
    planner.scale(D, 3)
    base = ["docker", "compose", "-f", "/opt/tandem/compose.yaml", "-p", "tandem"]
    assert runner.argvs == [
        [*base, "ps", "--all", "--format", "json", "prefill", "decode"],
        [*base, "up", "--detach", "--no-deps", "--no-recreate", "--scale", "decode=3", "decode"],
    ]


def test_no_token_or_a_wrong_one_is_401_and_runs_nothing():
    runner = Recorder()
    for headers in (
        {},
        {"Authorization": "Bearer wrong"},
        {"Authorization": f"Basic {TOKEN}"},
        {"Authorization": TOKEN},
    ):
        http = scaler(runner)
        http.headers.clear()
        reply = http.post("/v1/scale", json={"project": "tandem", "service": "decode", "replicas": 2}, headers=headers)
        assert reply.status_code == 401 and reply.json()["error"]["type"] == "authentication_error", headers
        assert (
            http.get("/v1/replicas", params={"project": "tandem", "service": "decode"}, headers=headers).status_code
            == 401
        )
    with pytest.raises(ConnectorError, match="401"):
        connector(scaler(runner, token="x" * 32)).scale(D, 2)
    assert runner.argvs == []
    assert scaler(runner).get("/health").status_code == 200  # the healthcheck needs no token


def test_the_policy_refuses_before_any_command_runs():
    runner = Recorder()
    http = scaler(runner)
    cases = [
        ({"project": "tandem", "service": "gateway", "replicas": 1}, 403),
        ({"project": "other", "service": "decode", "replicas": 2}, 403),
        ({"project": "tandem", "service": "decode", "replicas": 9}, 422),
        ({"project": "tandem", "service": "decode", "replicas": -1}, 422),
        ({"project": "tandem", "service": "decode"}, 422),
        ({"project": "tandem", "service": "decode", "replicas": "many"}, 422),
    ]
    for body, status in cases:
        assert http.post("/v1/scale", json=body).status_code == status, body
    assert http.get("/v1/replicas", params={"project": "tandem", "service": ["decode", "alloy"]}).status_code == 403
    assert http.get("/v1/replicas", params={"project": "other", "service": "decode"}).status_code == 403
    with pytest.raises(ConnectorError, match="403"):
        connector(http, decode="gateway").scale(D, 1)
    assert runner.argvs == []


def test_a_failed_compose_command_is_a_502_the_connector_reports():
    planner = connector(scaler(Recorder(error=ComposeError("docker compose exited 1: no such service"))))
    with pytest.raises(ConnectorError, match="502.*no such service"):
        planner.scale(D, 2)


def test_the_token_file_is_made_once_private_and_then_read(tmp_path):
    path = tmp_path / "token"
    token = load_or_create_token(path)
    assert len(token) >= 32 and (os.stat(path).st_mode & 0o777) == 0o600
    assert load_or_create_token(path) == token
    path.write_text("short\n")
    with pytest.raises(SettingsError, match="shorter"):
        load_or_create_token(path)
    http = scaler_client("http://scaler:8081", str(tmp_path / "token"))
    assert http.headers["Authorization"] == "Bearer short"
    with pytest.raises(ConnectorError, match="token file"):
        scaler_client("http://scaler:8081", str(tmp_path / "absent"))
