"""compose.yaml for real, where a Docker engine is reachable: build the images, bring the CPU stack up, get a
chat completion through the gateway and see Prometheus scrape the gateway and the workers.

Skipped (with the reason) where no engine answers; building the images the first time takes minutes.
"""
import os
import secrets
import shutil
import socket
import subprocess
import time
from pathlib import Path

import httpx
import pytest

REPO = Path(__file__).resolve().parents[2]
READY_TIMEOUT_S = 900  # first start: the offline model conversion, then loading it in every worker


def _engine_problem() -> str | None:
    """Why no stack can be started here, or None. A real probe: the engine must answer a ping."""
    try:
        import docker

        docker.from_env(timeout=5).ping()
    except Exception as e:  # noqa: BLE001 - the SDK raises DockerException, requests' and OSError's kinds
        return f"no Docker engine reachable: {type(e).__name__}: {e}"
    if shutil.which("docker") is None:
        return "the docker CLI is not installed"
    out = subprocess.run(["docker", "compose", "version"], capture_output=True, text=True)
    if out.returncode != 0:
        return f"the docker compose plugin is not installed: {out.stderr.strip() or out.stdout.strip()}"
    return None


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _poll(fetch, until, timeout_s: float, what: str):
    deadline, last = time.monotonic() + timeout_s, None
    while time.monotonic() < deadline:
        try:
            last = fetch()
            if until(last):
                return last
        except httpx.HTTPError as e:
            last = e
        time.sleep(2)
    raise AssertionError(f"{what} not seen in {timeout_s:.0f}s; last: {last!r}")


@pytest.fixture(scope="module")
def compose_stack():
    problem = _engine_problem()
    if problem is not None:
        pytest.skip(problem)
    from testcontainers.compose import DockerCompose

    ports = {"TANDEM_GATEWAY_PORT": _free_port(), "PROMETHEUS_PORT": _free_port(), "GRAFANA_PORT": _free_port()}
    # NOTE: its own project name, so neither a developer's `docker compose up` here nor its volumes are touched
    env = {"COMPOSE_PROJECT_NAME": f"tandem-test-{secrets.token_hex(3)}", **{k: str(v) for k, v in ports.items()}}
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    stack = DockerCompose(REPO, compose_file_name="compose.yaml", build=True, wait=False, keep_volumes=False)
    try:
        stack.start()
        yield {name: f"http://127.0.0.1:{port}" for name, port in ports.items()}, stack
    finally:
        try:
            stack.stop()  # down, volumes included
        finally:
            for k, v in saved.items():
                os.environ.pop(k) if v is None else os.environ.__setitem__(k, v)


@pytest.mark.timeout(READY_TIMEOUT_S + 1800)  # plus building the images
def test_a_chat_completion_through_the_gateway_and_prometheus_scrapes_it(compose_stack):
    urls, stack = compose_stack
    gateway, prometheus = urls["TANDEM_GATEWAY_PORT"], urls["PROMETHEUS_PORT"]
    try:
        _poll(lambda: httpx.get(f"{gateway}/ready", timeout=5).status_code, lambda code: code == 200,
              READY_TIMEOUT_S, "gateway ready")
    except AssertionError as e:
        stdout, stderr = stack.get_logs()
        raise AssertionError(f"{e}\n{(stdout + stderr)[-4000:]}") from None

    reply = httpx.post(f"{gateway}/v1/chat/completions", timeout=120, json={
        "model": "SmolLM2-135M-Instruct", "temperature": 0, "max_tokens": 16,
        "messages": [{"role": "user", "content": "What is the capital of France?"}]})
    assert reply.status_code == 200, reply.text
    body = reply.json()
    assert body["choices"][0]["message"]["content"].strip()
    assert body["usage"]["completion_tokens"] > 0

    def targets():
        active = httpx.get(f"{prometheus}/api/v1/targets", timeout=5).json()["data"]["activeTargets"]
        return {(t["labels"]["job"], t["health"]) for t in active}

    seen = _poll(targets, lambda t: {("gateway", "up"), ("router", "up"), ("prefill", "up"), ("decode", "up")} <= t,
                 120, "Prometheus scraping gateway, router, prefill and decode")
    assert ("gateway", "up") in seen

    def served() -> float:
        query = {"query": 'sum(tandem_gateway_requests_total{status="200"})'}
        result = httpx.get(f"{prometheus}/api/v1/query", params=query, timeout=5).json()["data"]["result"]
        return float(result[0]["value"][1]) if result else 0.0

    _poll(served, lambda n: n >= 1, 60, "the completion counted by Prometheus")
