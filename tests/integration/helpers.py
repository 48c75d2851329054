"""Helpers for tests against a live stack: bounded polling, worker idleness, SSE parsing, and the
OpenAI error-body check every error test shares. No fixtures here (they live in conftest.py)."""

import json
import os
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TypeVar

import httpx

from tandem.launcher import Stack
from tests.integration.conftest import all_worker_stats

T = TypeVar("T")


def poll(probe: Callable[[], T], is_done: Callable[[T], bool], timeout_s: float, interval_s: float = 0.1) -> T:
    """Call `probe` until `is_done(value)` or the time is up; the last value either way."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = probe()
        if is_done(value) or time.monotonic() >= deadline:
            return value
        time.sleep(interval_s)


def wait_for(probe: Callable[[], T], is_done: Callable[[T], bool], timeout_s: float, what: str) -> T:
    """Poll `probe` until `is_done(value)`; fail naming `what` and the last value seen."""
    value = poll(probe, is_done, timeout_s)
    assert is_done(value), f"{what}: not reached within {timeout_s:.0f}s; last seen: {value!r}"
    return value


def busy_counts(stack: Stack) -> dict[str, dict[str, int]]:
    """Per worker, the load counters that must all be 0 once no request is in flight."""
    return {
        worker_id: {
            "num_waiting": s.load.num_waiting,
            "num_running": s.load.num_running,
            "num_held": s.load.num_held,
            "num_blocks_used": s.load.num_blocks_used,
        }
        for worker_id, s in sorted(all_worker_stats(stack).items())
    }


def wait_all_idle(stack: Stack, num_workers: int, timeout_s: float = 10.0) -> None:
    """Every one of `num_workers` registered workers holds no sequence and no KV block."""

    def is_idle(counts: dict) -> bool:
        return len(counts) == num_workers and all(not any(c.values()) for c in counts.values())

    wait_for(lambda: busy_counts(stack), is_idle, timeout_s, f"all {num_workers} workers idle")


def sse_data(response: httpx.Response) -> Iterator[str]:
    """The `data:` payloads of an SSE response, in order (comments and other fields skipped)."""
    for line in response.iter_lines():
        if line.startswith("data:"):
            yield line[len("data:") :].strip()


def sse_json(response: httpx.Response) -> Iterator[dict | str]:
    """Each event's JSON, or the literal "[DONE]"."""
    for data in sse_data(response):
        yield data if data == "[DONE]" else json.loads(data)


def assert_error_body(body: dict, *, type: str, code: str | None = None, param: str | None = None) -> dict:
    """An OpenAI error: exactly {"error": {message, type, param, code}} with a non-empty message."""
    assert set(body) == {"error"}, body
    err = body["error"]
    assert set(err) == {"message", "type", "param", "code"}, err
    assert isinstance(err["message"], str) and err["message"].strip(), err
    assert err["type"] == type, err
    assert err["code"] == code, err
    assert err["param"] == param, err
    return err


def assert_error(
    response: httpx.Response,
    status: int,
    *,
    type: str,
    code: str | None = None,
    param: str | None = None,
    retry_after: str | None = None,
) -> dict:
    """The response is an OpenAI-style JSON error with this status (and Retry-After when given)."""
    assert response.status_code == status, (response.status_code, response.text)
    assert response.headers["content-type"].startswith("application/json"), response.headers
    assert response.headers.get("retry-after") == retry_after, dict(response.headers)
    return assert_error_body(response.json(), type=type, code=code, param=param)


# -- `tandem up` as a process ------------------------------------------------------------------------


def wait_for_banner(launcher: subprocess.Popen, timeout_s: float) -> str:
    """What `tandem up` printed up to its ready banner's last line; fails if it exits or stays silent."""
    lines = []
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        line = launcher.stdout.readline()
        assert line, "tandem up exited early:\n" + "".join(lines)
        lines.append(line)
        if "Ctrl-C stops everything" in line:
            return "".join(lines)
    raise AssertionError(f"no banner within {timeout_s:.0f}s:\n" + "".join(lines))


def services_of(pid: int) -> set[int]:
    """The launcher's own children: one per service (each worker's engine process is the worker's child)."""
    out = subprocess.run(["ps", "-o", "pid=", "--ppid", str(pid)], capture_output=True, text=True)
    return {int(p) for p in out.stdout.split()}


def children_of(pid: int) -> set[int]:
    """Every live process whose parent chain reaches `pid` (the launcher gives each its own session)."""
    found, frontier = set(), {pid}
    while frontier:
        parent = frontier.pop()
        out = subprocess.run(["ps", "-o", "pid=", "--ppid", str(parent)], capture_output=True, text=True)
        kids = {int(p) for p in out.stdout.split()}
        frontier |= kids - found
        found |= kids
    return found


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with open(f"/proc/{pid}/stat") as f:  # a zombie waits only for its parent to reap it
        return f.read().split()[2] != "Z"


def log_warnings(log_dir: Path, limit: int = 40) -> str:
    """The warning and error lines of every service log under `log_dir`, and the RPCs that ended other than OK,
    for a failed assertion to show why."""
    lines = [
        f"{path.name}: {line}"
        for path in sorted(log_dir.glob("*.log"))
        for line in path.read_text(errors="replace").splitlines()
        if '"level": "warn' in line or '"level": "error' in line or ('"code": "' in line and '"code": "OK"' not in line)
    ]
    return "\n".join(lines[-limit:]) or "(no warnings in the logs)"
