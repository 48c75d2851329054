"""`tandem up` as a user runs it: it prints the URL once ready, serves, and on SIGTERM or Ctrl-C
(SIGINT) stops every process it started, leaving none behind."""

import json
import os
import re
import signal
import subprocess
import sys
import time

import httpx
import pytest

from tandem.launcher import free_port
from tests.integration.helpers import alive, children_of, services_of, wait_for_banner


@pytest.mark.parametrize("stop_signal", [signal.SIGTERM, signal.SIGINT])
def test_up_serves_then_stops_everything(tiny_stack_model, tmp_path, stop_signal):
    port = free_port()
    cmd = [
        sys.executable,
        "-m",
        "tandem.cli",
        "up",
        "--model",
        str(tiny_stack_model),
        "--port",
        str(port),
        "--prefill",
        "1",
        "--decode",
        "1",
        "--num-threads",
        "1",
        "--log-dir",
        str(tmp_path / "logs"),
    ]
    launcher = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        text = wait_for_banner(launcher, timeout_s=120)
        assert f"tandem is up: http://127.0.0.1:{port}" in text
        assert re.search(r"curl http://127\.0\.0\.1:\d+/v1/chat/completions", text)
        endpoints = dict(re.findall(r"^metrics: (\S+) (http://127\.0\.0\.1:\d+/metrics)$", text, re.M))
        assert set(endpoints) == {"router", "prefill-0", "decode-0", "gateway"}, text
        for url in endpoints.values():
            assert httpx.get(url, timeout=5).text.startswith("# HELP"), url
        targets = json.loads((tmp_path / "logs" / "prometheus-targets.json").read_text())
        assert sorted(f"http://{t}/metrics" for g in targets for t in g["targets"]) == sorted(endpoints.values())
        services, pids = services_of(launcher.pid), children_of(launcher.pid)
        assert len(services) == 4, f"router, prefill, decode and gateway expected, found {services}"
        reply = httpx.post(
            f"http://127.0.0.1:{port}/v1/completions",
            timeout=30,
            json={"model": tiny_stack_model.name, "prompt": "hello", "max_tokens": 4},
        )
        assert reply.status_code == 200, reply.text
        launcher.send_signal(stop_signal)
        assert launcher.wait(timeout=30) == 0
        lingering = [p for p in pids if alive(p)]
        assert not lingering, f"processes left behind: {lingering}"
    finally:
        if launcher.poll() is None:
            launcher.kill()
            launcher.wait()


def test_up_with_prometheus_scrapes_every_service_and_nothing_outlives_a_killed_launcher(tiny_stack_model, tmp_path):
    """`make up`'s `tandem up --prometheus`: Prometheus comes up on the file_sd file and finds all four services;
    SIGKILL on the launcher (no chance to clean up) still takes every child, Prometheus included, down."""
    import shutil

    if shutil.which("prometheus") is None:
        if os.environ.get("TANDEM_REQUIRE_PROMETHEUS"):
            pytest.fail("TANDEM_REQUIRE_PROMETHEUS is set (.ci/run) but no prometheus binary is installed")
        pytest.skip("the prometheus binary is not installed")
    port, prom_port = free_port(), free_port()
    cmd = [
        sys.executable,
        "-m",
        "tandem.cli",
        "up",
        "--model",
        str(tiny_stack_model),
        "--port",
        str(port),
        "--num-threads",
        "1",
        "--log-dir",
        str(tmp_path / "logs"),
        "--prometheus",
        str(prom_port),
    ]
    launcher = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        banner = wait_for_banner(launcher, timeout_s=120)
        assert f"prometheus: http://127.0.0.1:{prom_port}" in banner
        pids = children_of(launcher.pid)
        assert len(pids) >= 5, f"router, prefill, decode, gateway and prometheus expected, found {pids}"

        def jobs_up() -> set[str]:
            try:
                reply = httpx.get(
                    f"http://127.0.0.1:{prom_port}/api/v1/query", params={"query": "up == 1"}, timeout=5
                ).json()
            except (httpx.HTTPError, ValueError):
                return set()
            return {r["metric"].get("job", "") for r in reply.get("data", {}).get("result", [])}

        deadline = time.monotonic() + 30
        while jobs_up() != {"router", "prefill", "decode", "gateway"} and time.monotonic() < deadline:
            time.sleep(0.5)
        assert jobs_up() == {"router", "prefill", "decode", "gateway"}
        launcher.kill()
        launcher.wait()
        deadline = time.monotonic() + 20
        while any(alive(p) for p in pids) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not [p for p in pids if alive(p)], "processes outlived the killed launcher"
    finally:
        if launcher.poll() is None:
            launcher.kill()
            launcher.wait()
