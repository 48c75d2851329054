"""A real redis-server (Debian's package) on a free loopback port, for the response store's tests. Without the
binary the test fails when TANDEM_REQUIRE_REDIS is set (.ci/run installs it) and skips, saying why, elsewhere."""

import contextlib
import os
import shutil
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tandem.launcher import free_port

START_TIMEOUT_S = 10.0


def redis_binary() -> str:
    binary = shutil.which("redis-server")
    if binary is None:
        if os.environ.get("TANDEM_REQUIRE_REDIS"):
            pytest.fail("TANDEM_REQUIRE_REDIS is set (.ci/run) but no redis-server binary is installed")
        pytest.skip("redis-server is not installed (.ci/run installs Debian's redis-server package)")
    return binary


@contextlib.contextmanager
def running_redis(work: Path) -> Iterator[str]:
    """Starts redis-server (no persistence) and yields its URL; stops it after."""
    port = free_port()
    command = [
        redis_binary(),
        "--port",
        str(port),
        "--bind",
        "127.0.0.1",
        "--save",
        "",
        "--appendonly",
        "no",
        "--dir",
        str(work),
    ]
    with open(work / "redis.log", "w") as log:
        proc = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)
    try:
        _wait_for_ping(port, proc, work / "redis.log")
        yield f"redis://127.0.0.1:{port}/0"
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _wait_for_ping(port: int, proc: subprocess.Popen, log_path: Path) -> None:
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        assert proc.poll() is None, log_path.read_text()
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5) as sock:
                sock.sendall(b"PING\r\n")
                if sock.recv(16).startswith(b"+PONG"):
                    return
        except OSError:
            pass
        time.sleep(0.05)
    raise AssertionError("redis-server did not answer PING:\n" + log_path.read_text())
