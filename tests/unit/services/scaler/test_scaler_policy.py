"""The scaler's pure parts: the allow-list it parses, the bounds it enforces, the compose commands it builds and
how it reads `docker compose ps` (no Docker engine runs here)."""

import json

import pytest

from services.common.settings import SettingsError
from services.scaler.compose_cli import ComposeError, ComposeProject, Counts, count, parse_ps, run_command
from services.scaler.policy import Bounds, ScalePolicy, ScaleRefused, parse_allow_list
from services.scaler.settings import ScalerSettings

POLICY = ScalePolicy("tandem", {"decode": Bounds(1, 4), "prefill": Bounds(0, 2)})


def test_the_allow_list_parses_and_refuses_what_is_not_service_min_max():
    assert parse_allow_list(" prefill=0:4, decode=1:8 ,") == {"prefill": Bounds(0, 4), "decode": Bounds(1, 8)}
    for bad in ("", "decode", "decode=1", "decode=a:2", "decode=3:1", "=1:2", "decode=-1:2"):
        with pytest.raises(ValueError):
            parse_allow_list(bad)


def test_only_allowed_services_of_its_own_project_within_bounds():
    POLICY.check_scale("tandem", "decode", 4)
    POLICY.check_scale("tandem", "prefill", 0)
    refusals = [
        ("other", "decode", 2, 403),
        ("tandem", "gateway", 1, 403),
        ("tandem", "grafana", 0, 403),
        ("tandem", "decode", 0, 422),
        ("tandem", "decode", 5, 422),
        ("tandem", "prefill", 3, 422),
    ]
    for project, service, replicas, status in refusals:
        with pytest.raises(ScaleRefused) as refused:
            POLICY.check_scale(project, service, replicas)
        assert refused.value.status == status, (project, service, replicas)


def test_settings_need_a_project_and_a_token_file_and_a_valid_allow_list():
    good = ScalerSettings(project="tandem", token_file="/t")
    assert good.policy.allowed["decode"] == Bounds(1, 8)
    for kwargs in (
        {"token_file": "/t"},
        {"project": "tandem"},
        {"project": "tandem", "token_file": "/t", "services": "decode=9:1"},
    ):
        with pytest.raises(SettingsError):
            ScalerSettings(**kwargs)


def test_the_two_compose_commands_it_may_run():
    project = ComposeProject("docker compose", "/opt/tandem/compose.yaml", "tandem")
    assert project.scale_argv("decode", 3) == [
        "docker",
        "compose",
        "-f",
        "/opt/tandem/compose.yaml",
        "-p",
        "tandem",
        "up",
        "--detach",
        "--no-deps",
        "--no-recreate",
        "--scale",
        "decode=3",
        "decode",
    ]
    assert ComposeProject("docker-compose", "compose.yaml", "").ps_argv(["prefill", "decode"]) == [
        "docker-compose",
        "-f",
        "compose.yaml",
        "ps",
        "--all",
        "--format",
        "json",
        "prefill",
        "decode",
    ]


PS_LINES = [  # docker compose v2.21+ prints one JSON object per container
    {"Service": "decode", "State": "running", "Health": "healthy", "Name": "tandem-decode-1"},
    {"Service": "decode", "State": "running", "Health": "starting", "Name": "tandem-decode-2"},
    {"Service": "decode", "State": "created", "Health": "", "Name": "tandem-decode-3"},
    {"Service": "decode", "State": "exited", "Health": "", "Name": "tandem-decode-4"},
    {"Service": "prefill", "State": "running", "Health": "", "Name": "tandem-prefill-1"},
    {"Service": "prefill", "State": "removing", "Health": "", "Name": "tandem-prefill-2"},
    {"Service": "gateway", "State": "running", "Health": "healthy", "Name": "tandem-gateway-1"},
]


def test_compose_ps_is_read_in_either_json_shape():
    lines = parse_ps("\n".join(json.dumps(line) for line in PS_LINES) + "\n")
    assert lines == PS_LINES == parse_ps(json.dumps(PS_LINES))  # older compose: one JSON array
    assert count(lines, "decode") == Counts(ready=1, starting=2)
    assert count(lines, "prefill") == Counts(ready=1, draining=1)
    assert parse_ps("") == [] and count([], "decode") == Counts()


def test_a_failing_or_garbled_command_is_a_compose_error():
    with pytest.raises(ComposeError, match="not JSON"):
        parse_ps("Error response from daemon\n")
    with pytest.raises(ComposeError, match="exited 3"):
        run_command(["sh", "-c", "echo no such service >&2; exit 3"])
    with pytest.raises(ComposeError, match="No such file"):
        run_command(["/nonexistent/docker", "compose", "ps"])
    assert run_command(["echo", "ok"]) == "ok\n"
