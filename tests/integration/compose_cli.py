"""The `docker compose` CLI for the compose stack test: one project, its commands, its containers.

A failed command raises at once with compose's own error and the last log lines of every container that exited
badly; nothing here waits on a readiness loop that a failed build or pull would only time out.
"""

import json
import os
import shutil
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

from services.scaler.compose_cli import parse_ps

LOG_LINES = 30


class ComposeFailed(AssertionError):
    """A compose command failed; the message carries its stderr and the logs of containers that exited."""


def engine_problem() -> str | None:
    """Why no stack can run here, or None: the CLI, its compose v2 plugin and an engine that answers."""
    if shutil.which("docker") is None:
        return "the docker CLI is not installed"
    version = subprocess.run(["docker", "compose", "version", "--short"], capture_output=True, text=True)
    if version.returncode != 0 or not version.stdout.strip().lstrip("v").startswith("2."):
        return f"the docker compose v2 plugin is not installed: {version.stderr.strip() or version.stdout.strip()}"
    info = subprocess.run(["docker", "info", "--format", "{{.ServerVersion}}"], capture_output=True, text=True)
    if info.returncode != 0 or not info.stdout.strip():
        return f"no Docker engine reachable: {info.stderr.strip()[-300:]}"
    return None


@dataclass
class Compose:
    files: list[Path]
    project: str
    env: dict[str, str] = field(default_factory=dict)
    cwd: Path = Path(".")

    def argv(self, *args: str) -> list[str]:
        return ["docker", "compose", *(a for f in self.files for a in ("-f", str(f))), "-p", self.project, *args]

    def run(self, *args: str, timeout_s: float = 300) -> str:
        """stdout of `docker compose ARGS`; ComposeFailed with compose's error when it exits non-zero."""
        try:
            done = subprocess.run(
                self.argv(*args),
                capture_output=True,
                text=True,
                timeout=timeout_s,
                cwd=self.cwd,
                env={**os.environ, **self.env},
            )
        except subprocess.TimeoutExpired as e:
            raise ComposeFailed(
                f"docker compose {' '.join(args)}: no answer in {timeout_s:.0f}s\n"
                f"{_text(e.stderr)[-3000:]}{self.exited_logs()}"
            ) from None
        if done.returncode != 0:
            raise ComposeFailed(
                f"docker compose {' '.join(args)} exited {done.returncode}:\n"
                f"{done.stderr.strip()[-3000:]}{self.exited_logs()}"
            )
        return done.stdout

    def containers(self, *services: str) -> list[dict]:
        return parse_ps(self.run("ps", "--all", "--format", "json", *services, timeout_s=60))

    def exited_logs(self) -> str:
        """The last lines of every container that exited other than cleanly, for a failure message."""
        try:
            containers = self.containers()
        except ComposeFailed:
            return ""
        parts = []
        for c in containers:
            if c.get("State") in ("exited", "dead") and c.get("ExitCode", 0) != 0:
                logs = subprocess.run(
                    ["docker", "logs", "--tail", str(LOG_LINES), c["ID"]], capture_output=True, text=True
                )
                parts.append(
                    f"\n--- {c['Name']} exited {c.get('ExitCode')}; its last lines:\n{logs.stdout}{logs.stderr}"
                )
        return "".join(parts)

    def leftovers(self) -> dict[str, list[str]]:
        """Containers, networks and volumes that still carry this project's label."""
        label = f"label=com.docker.compose.project={self.project}"
        found = {}
        for kind, listing in (
            ("container", ["ps", "--all"]),
            ("network", ["network", "ls"]),
            ("volume", ["volume", "ls"]),
        ):
            out = subprocess.run(["docker", *listing, "--quiet", "--filter", label], capture_output=True, text=True)
            found[kind] = out.stdout.split()
        return found


def inspect(container: str, template: str) -> str:
    out = subprocess.run(["docker", "inspect", "--format", template, container], capture_output=True, text=True)
    if out.returncode != 0:
        raise ComposeFailed(f"docker inspect {container}: {out.stderr.strip()}")
    return out.stdout.strip()


def address(container: str) -> str:
    """The container's address on its compose network (the host reaches it over the bridge)."""
    return inspect(container, "{{range .NetworkSettings.Networks}}{{.IPAddress}} {{end}}").split()[0]


def docker(*args: str) -> str:
    out = subprocess.run(["docker", *args], capture_output=True, text=True, timeout=120)
    if out.returncode != 0:
        raise ComposeFailed(f"docker {' '.join(args)}: {out.stderr.strip()}")
    return out.stdout


def _text(data) -> str:
    return data.decode(errors="replace") if isinstance(data, bytes) else data or ""


def describe(containers: list[dict]) -> str:
    return json.dumps([{k: c.get(k) for k in ("Name", "State", "Health", "ExitCode")} for c in containers])
