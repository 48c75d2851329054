"""`tandem up` heals: a decode worker killed outright is started again (with a log line) while the rest keeps
serving, and it registers again; a child with bad settings stops the stack at once, naming it."""

import os
import re
import signal
import subprocess
import sys
import time

import httpx

from tandem.launcher import free_port
from tests.integration.helpers import alive, children_of, wait_for, wait_for_banner
from tests.integration.test_up_sim import registered_workers


def _up(model, tmp_path, port: int, env: dict | None = None) -> subprocess.Popen:
    cmd = [
        sys.executable,
        "-m",
        "tandem.cli",
        "up",
        "--engine",
        "sim",
        "--model",
        str(model),
        "--port",
        str(port),
        "--prefill",
        "0",
        "--decode",
        "2",
        "--num-threads",
        "1",
        "--log-dir",
        str(tmp_path / "logs"),
    ]
    return subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env={**os.environ, **(env or {})}
    )


def _pid_of(launcher_pid: int, worker_id: str) -> int:
    """The pid of the live child started with `--worker-id worker_id`; 0 when there is none."""
    for pid in children_of(launcher_pid):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                if f"--worker-id\0{worker_id}\0".encode() in f.read() and alive(pid):
                    return pid
        except FileNotFoundError:
            continue
    return 0


def test_a_killed_worker_is_started_again_and_the_stack_keeps_serving(tmp_path):
    from tandem.models.init import init_model

    model = init_model(tmp_path / "model", "llama", tiny=True, config_only=True)
    port = free_port()
    launcher = _up(model, tmp_path, port)
    try:
        banner = wait_for_banner(launcher, timeout_s=180)
        router_port = int(banner.split("router 127.0.0.1:")[1].split()[0])
        victim = _pid_of(launcher.pid, "decode-0")
        assert victim
        os.kill(victim, signal.SIGKILL)
        line = launcher.stdout.readline()
        while "decode-0 exited" not in line:
            line = launcher.stdout.readline()
            assert line, "tandem up exited"
        assert "decode-0 exited with signal SIGKILL; starting it again in 0.5 s" in line
        body = {"model": model.name, "prompt": "still there?", "max_tokens": 4}
        reply = httpx.post(f"http://127.0.0.1:{port}/v1/completions", json=body, timeout=30)
        assert reply.status_code == 200, reply.text  # the survivor serves meanwhile
        assert launcher.poll() is None
        new_pid = wait_for(
            lambda: _pid_of(launcher.pid, "decode-0"), lambda pid: pid not in (0, victim), 30, "a new decode-0"
        )
        wait_for(
            lambda: sorted(registered_workers(router_port, tmp_path / "pki")),
            lambda ids: ids == ["decode-0", "decode-1"],
            60,
            "decode-0 registered again",
        )
        assert not alive(victim) and alive(new_pid)
        pids = children_of(launcher.pid)
        launcher.send_signal(signal.SIGTERM)
        assert launcher.wait(timeout=60) == 0
        assert not [p for p in pids if alive(p)]
    finally:
        if launcher.poll() is None:
            launcher.kill()
            launcher.wait()


def test_bad_worker_settings_stop_the_stack_naming_the_worker(tmp_path):
    from tandem.models.init import init_model

    model = init_model(tmp_path / "model", "llama", tiny=True, config_only=True)
    launcher = _up(model, tmp_path, free_port(), env={"TANDEM_WORKER_DRAIN_S": "-1"})
    try:
        out, _ = launcher.communicate(timeout=120)
    finally:
        if launcher.poll() is None:
            launcher.kill()
            launcher.wait()
    assert launcher.returncode == 1
    assert re.search(
        r"tandem up failed: decode-[01] exited with code 2 \(bad settings; a restart would not help\); "
        r"its log ends:\ntandem serve decode: error: drain_s must be >= 0, got -1.0",
        out,
    ), out
    deadline = time.monotonic() + 10
    while children_of(launcher.pid) and time.monotonic() < deadline:
        time.sleep(0.2)
