"""`docker compose` for the scaler: the two commands it may run (scale one service, list services' containers)
and how their output is read. Builds argv and parses text; a runner executes them, so tests need no engine."""

import json
import shlex
import subprocess
from collections.abc import Callable, Iterable
from dataclasses import dataclass

Runner = Callable[[list[str]], str]  # argv -> stdout; raises ComposeError on failure
TIMEOUT_S = 120.0


class ComposeError(RuntimeError):
    """docker compose failed or printed what it should not have."""


@dataclass(frozen=True, slots=True)
class Counts:
    """A service's containers: serving, not serving yet, leaving."""

    ready: int = 0
    starting: int = 0
    draining: int = 0


@dataclass(frozen=True, slots=True)
class ComposeProject:
    command: str = "docker compose"
    file: str = "compose.yaml"
    project: str = ""

    def base(self) -> list[str]:
        argv = [*shlex.split(self.command), "-f", self.file]
        return argv + (["-p", self.project] if self.project else [])

    def scale_argv(self, service: str, target: int) -> list[str]:
        """Only that service, never its dependencies, and running containers are left as they are."""
        return [*self.base(), "up", "--detach", "--no-deps", "--no-recreate", "--scale", f"{service}={target}", service]

    def ps_argv(self, services: Iterable[str]) -> list[str]:
        return [*self.base(), "ps", "--all", "--format", "json", *services]


def run_command(argv: list[str]) -> str:
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=TIMEOUT_S)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise ComposeError(f"{shlex.join(argv)}: {exc}") from None
    if done.returncode != 0:
        raise ComposeError(f"{shlex.join(argv)} exited {done.returncode}: {done.stderr.strip()[-300:]}")
    return done.stdout


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
        raise ComposeError(f"docker compose ps printed something that is not JSON: {exc}") from None


def count(containers: list[dict], service: str) -> Counts:
    """Running and healthy (or without a healthcheck) = ready; created, restarting or health starting =
    starting; removing, paused or unhealthy = draining; exited ones are gone."""
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
    return Counts(ready, starting, draining)
