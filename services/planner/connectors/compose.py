"""The compose connector: scales the worker services of compose.yaml with `docker compose up --scale`, and
counts their containers with `docker compose ps`. Builds commands and reads their JSON output; a runner
executes them (subprocess by default), so tests check the exact commands without a Docker engine."""
import json
import shlex
import subprocess
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from services.planner.types import ROLES, ConnectorError, Replicas, WorkerRole

Runner = Callable[[list[str]], str]  # argv -> stdout; raises ConnectorError on failure
TIMEOUT_S = 120.0


@dataclass(frozen=True, slots=True)
class ComposeProject:
    command: str = "docker compose"
    file: str = "compose.yaml"
    project: str = ""
    services: Mapping[WorkerRole, str] = None  # role -> compose service

    def base(self) -> list[str]:
        argv = [*shlex.split(self.command), "-f", self.file]
        return argv + (["-p", self.project] if self.project else [])

    def scale_argv(self, role: WorkerRole, target: int) -> list[str]:
        """Only that service, never its dependencies, and running containers are left as they are."""
        service = self.services[role]
        return [*self.base(), "up", "--detach", "--no-deps", "--no-recreate", "--scale", f"{service}={target}",
                service]

    def ps_argv(self) -> list[str]:
        return [*self.base(), "ps", "--all", "--format", "json", *(self.services[r] for r in ROLES)]


def run_command(argv: list[str]) -> str:
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=TIMEOUT_S)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise ConnectorError(f"{shlex.join(argv)}: {exc}") from None
    if done.returncode != 0:
        raise ConnectorError(f"{shlex.join(argv)} exited {done.returncode}: {done.stderr.strip()[-300:]}")
    return done.stdout


class ComposeConnector:
    name = "compose"

    def __init__(self, project: ComposeProject, runner: Runner = run_command):
        self.project, self.runner = project, runner

    def replicas(self) -> Mapping[WorkerRole, Replicas]:
        containers = parse_ps(self.runner(self.project.ps_argv()))
        return {role: count(containers, self.project.services[role]) for role in ROLES}

    def scale(self, role: WorkerRole, target: int) -> None:
        # NOTE: compose stops the highest-numbered containers with SIGTERM; a worker deregisters and drains
        self.runner(self.project.scale_argv(role, target))


def parse_ps(output: str) -> list[dict]:
    """`docker compose ps --format json`: one JSON object per line (v2.21+) or one JSON array (older)."""
    text = output.strip()
    if not text:
        return []
    try:
        if text.startswith("["):
            return json.loads(text)
        return [json.loads(line) for line in text.splitlines() if line.strip()]
    except json.JSONDecodeError as exc:
        raise ConnectorError(f"docker compose ps printed something that is not JSON: {exc}") from None


def count(containers: list[dict], service: str) -> Replicas:
    """Running and healthy (or without a healthcheck) = ready; created, restarting or health starting =
    starting; removing or stopping = draining; exited ones are gone."""
    ready = starting = draining = 0
    for c in containers:
        if c.get("Service") != service:
            continue
        state, health = c.get("State", ""), c.get("Health", "")
        if state == "running" and health in ("", "healthy"):
            ready += 1
        elif state in ("created", "restarting") or (state == "running" and health == "starting"):
            starting += 1
        elif state in ("removing", "paused") or (state == "running" and health == "unhealthy"):
            draining += 1
    return Replicas(ready, starting, draining)
