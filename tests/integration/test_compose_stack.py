"""compose.yaml for real: the images built, the CPU stack up in containers (`up --wait`), chats answered through the
published port, every service's /metrics, decode scaled by hand and by the planner through the scaler (the only
service holding the Docker socket, which refuses a caller without its token),
decode containers killed under load with no request lost, and `down -v` leaving nothing.

Skipped (with the reason) where no Docker engine answers, unless TANDEM_REQUIRE_DOCKER=1 (CI) makes that a failure.
Where no registry is reachable, .ci/run sets TANDEM_COMPOSE_FILES=compose.yaml:compose.offline.yaml after making
the local base images (docker/offline-images.sh). The first build takes minutes; later ones hit the layer cache.
"""

import asyncio
import os
import secrets
import signal
import time
from pathlib import Path

import grpc
import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from services.common.protos import common_pb2, router_pb2, router_pb2_grpc
from tandem.launcher import free_ports
from tests.integration.compose_cli import Compose, ComposeFailed, address, describe, docker, engine_problem, inspect

REPO = Path(__file__).resolve().parents[2]
MODEL = "SmolLM2-135M-Instruct"
UP_TIMEOUT_S = 900  # the first start converts the model, then every worker loads it
pytestmark = pytest.mark.timeout(3600)

# the planner in a hurry: 2 s ticks, a 10 s model interval, quick to shrink
PLANNER_ENV = {
    "TANDEM_PLANNER_TICK_S": "2",
    "TANDEM_PLANNER_ADJUSTMENT_INTERVAL_S": "10",
    "TANDEM_PLANNER_PROMETHEUS_RANGE_S": "15",
    "TANDEM_PLANNER_UP_TICKS": "2",
    "TANDEM_PLANNER_DOWN_TICKS": "3",
    "TANDEM_PLANNER_DOWN_STABILIZATION": "1",
}
# SLOs nothing misses until the planner's own test tightens them (the planner is recreated with those)
STACK_ENV = {
    "TANDEM_CPU_THREADS_PER_WORKER": "1",
    "TANDEM_PLANNER_SLO_ITL_S": "60",
    "TANDEM_PLANNER_SLO_TTFT_S": "600",
    "TANDEM_PLANNER_MIN_PREFILL": "1",
    "TANDEM_PLANNER_MAX_PREFILL": "1",
    "TANDEM_PLANNER_MIN_DECODE": "1",
    "TANDEM_PLANNER_MAX_DECODE": "2",
}
TIGHT_SLO = {"TANDEM_PLANNER_SLO_ITL_S": "0.01"}  # a CPU worker under 16 streams misses it


def compose_files(tmp: Path) -> list[Path]:
    files = [REPO / f for f in os.environ.get("TANDEM_COMPOSE_FILES", "compose.yaml").split(":")]
    test_file = tmp / "compose.test.yaml"
    lines = ["services:", "  planner:", "    environment:"] + [f'      {k}: "{v}"' for k, v in PLANNER_ENV.items()]
    test_file.write_text("\n".join(lines) + "\n")
    return [*files, test_file]


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    problem = engine_problem()
    if problem is not None:
        if os.environ.get("TANDEM_REQUIRE_DOCKER") == "1":
            pytest.fail(f"TANDEM_REQUIRE_DOCKER=1 and {problem}")
        pytest.skip(problem)
    gateway_port, prometheus_port = free_ports(2)
    env = {
        **STACK_ENV,
        "TANDEM_GATEWAY_PORT": str(gateway_port),
        "PROMETHEUS_PORT": str(prometheus_port),
        "DOCKER_GID": str(os.stat("/var/run/docker.sock").st_gid),
        "GRAFANA_ADMIN_PASSWORD": secrets.token_hex(8),
    }
    compose = Compose(
        compose_files(tmp_path_factory.mktemp("compose")), f"tandem-test-{secrets.token_hex(3)}", env, REPO
    )
    try:
        compose.run("build", timeout_s=2400)
        compose.run("up", "--detach", "--wait", "--wait-timeout", str(UP_TIMEOUT_S), timeout_s=UP_TIMEOUT_S + 60)
        yield {
            "compose": compose,
            "gateway": f"http://127.0.0.1:{gateway_port}",
            "prometheus": f"http://127.0.0.1:{prometheus_port}",
        }
    finally:
        compose.run("down", "--volumes", "--remove-orphans", "--timeout", "10", timeout_s=300)


def poll(probe, until, timeout_s: float, what: str, interval_s: float = 1.0):
    deadline, last = time.monotonic() + timeout_s, None
    while time.monotonic() < deadline:
        try:
            last = probe()
            if until(last):
                return last
        except (httpx.HTTPError, grpc.RpcError, ComposeFailed) as e:
            last = e
        time.sleep(interval_s)
    raise AssertionError(f"{what} not seen in {timeout_s:.0f}s; last: {last!r}")


def chat(gateway: str, content: str = "What is the capital of France?", max_tokens: int = 16, **extra) -> dict:
    reply = httpx.post(
        f"{gateway}/v1/chat/completions",
        timeout=180,
        json={
            "model": MODEL,
            "temperature": 0,
            "max_tokens": max_tokens,
            "messages": [{"role": "user", "content": content}],
            **extra,
        },
    )
    assert reply.status_code == 200, reply.text
    return reply.json()


async def load(gateway: str, total: int, concurrency: int, during=None, max_tokens: int = 24) -> list:
    """`total` chats from `concurrency` clients; `during()` runs (in a thread) once a quarter of them are sent."""
    outcomes, sent = [], iter(range(total))

    async def client(http: httpx.AsyncClient) -> None:
        for i in sent:
            try:
                reply = await http.post(
                    f"{gateway}/v1/chat/completions",
                    json={
                        "model": MODEL,
                        "max_tokens": max_tokens,
                        "ignore_eos": True,
                        "messages": [{"role": "user", "content": f"Count to ten, request {i}."}],
                    },
                )
                tokens = reply.json().get("usage", {}).get("completion_tokens") if reply.status_code == 200 else None
                outcomes.append((reply.status_code, tokens, reply.text[:200] if tokens is None else ""))
            except httpx.HTTPError as e:
                outcomes.append((None, None, repr(e)))

    async with httpx.AsyncClient(timeout=300) as http:
        tasks = [asyncio.create_task(client(http)) for _ in range(concurrency)]
        if during is not None:
            while len(outcomes) < total // 4:
                await asyncio.sleep(0.2)
            await asyncio.to_thread(during)
        await asyncio.gather(*tasks)
    return outcomes


CREDENTIALS: dict[str, grpc.ChannelCredentials] = {}


def planner_credentials(compose: Compose) -> grpc.ChannelCredentials:
    """The planner's certificate (an admin identity: ListWorkers), read from its container: every gRPC port of the
    stack runs mutual TLS, and a caller without a certificate from the stack's CA is refused."""

    def read(name: str) -> bytes:
        return compose.run("exec", "-T", "planner", "cat", f"/etc/tandem/tls/{name}", timeout_s=60).encode()

    return grpc.ssl_channel_credentials(read("ca.crt"), read("tls.key"), read("tls.crt"))


def decode_workers(compose: Compose) -> list[str]:
    router = next(c for c in compose.containers("router") if c["State"] == "running")
    if compose.project not in CREDENTIALS:  # the certs volume outlives every container: read it once
        CREDENTIALS[compose.project] = planner_credentials(compose)
    credentials = CREDENTIALS[compose.project]
    options = [("grpc.ssl_target_name_override", "tandem")]  # every certificate names "tandem"
    with grpc.secure_channel(f"{address(router['ID'])}:50051", credentials, options) as channel:
        reply = router_pb2_grpc.RouterStub(channel).ListWorkers(router_pb2.ListWorkersRequest(), timeout=5)
    return sorted(w.worker.address for w in reply.workers if w.worker.role == common_pb2.WORKER_ROLE_DECODE)


def test_the_router_refuses_a_caller_without_a_certificate(stack):
    router = next(c for c in stack["compose"].containers("router") if c["State"] == "running")
    with grpc.insecure_channel(f"{address(router['ID'])}:50051") as channel:
        with pytest.raises(grpc.RpcError) as refused:
            router_pb2_grpc.RouterStub(channel).ListWorkers(router_pb2.ListWorkersRequest(), timeout=5)
    assert refused.value.code() == grpc.StatusCode.UNAVAILABLE  # no TLS handshake, no answer
    assert len(decode_workers(stack["compose"])) == 1  # the planner's certificate is answered


def metrics(container: str, port: int = 9464) -> dict[str, float]:
    """Each sample name of the container's /metrics, summed over its labels."""
    reply = httpx.get(f"http://{address(container)}:{port}/metrics", timeout=10)
    reply.raise_for_status()
    sums: dict[str, float] = {}
    for family in text_string_to_metric_families(reply.text):
        for sample in family.samples:
            sums[sample.name] = sums.get(sample.name, 0.0) + sample.value
    return sums


def running(compose: Compose, service: str) -> list[dict]:
    return [c for c in compose.containers(service) if c["State"] == "running"]


def test_a_chat_and_a_streamed_chat_through_the_published_port(stack):
    body = chat(stack["gateway"])
    assert body["choices"][0]["message"]["content"].strip() and body["usage"]["completion_tokens"] > 0
    with httpx.stream(
        "POST",
        f"{stack['gateway']}/v1/chat/completions",
        timeout=180,
        json={
            "model": MODEL,
            "temperature": 0,
            "max_tokens": 16,
            "stream": True,
            "messages": [{"role": "user", "content": "Name a colour."}],
        },
    ) as reply:
        assert reply.status_code == 200
        events = [line[len("data: ") :] for line in reply.iter_lines() if line.startswith("data: ")]
    assert events[-1] == "[DONE]" and len(events) > 2
    assert any('"content"' in e for e in events[:-1])


def test_every_service_serves_metrics_and_prometheus_scrapes_them(stack):
    compose = stack["compose"]
    assert "tandem_gateway_requests_total" in httpx.get(f"{stack['gateway']}/metrics", timeout=10).text
    prefixes = {
        "router": "tandem_router_",
        "prefill": "tandem_worker_",
        "decode": "tandem_worker_",
        "planner": "tandem_planner_",
    }
    for service, prefix in prefixes.items():
        containers = running(compose, service)
        assert containers, f"{service}: {describe(compose.containers(service))}"
        for c in containers:
            assert c["Health"] == "healthy", describe([c])
            assert any(name.startswith(prefix) for name in metrics(c["ID"])), c["Name"]
    fetch = compose.containers("model-fetch")
    assert [(c["State"], c["ExitCode"]) for c in fetch] == [("exited", 0)], describe(fetch)

    def targets():
        active = httpx.get(f"{stack['prometheus']}/api/v1/targets", timeout=5).json()["data"]["activeTargets"]
        return {t["labels"]["job"] for t in active if t["health"] == "up"}

    poll(
        targets,
        lambda up: {"gateway", "router", "prefill", "decode", "planner"} <= up,
        120,
        "Prometheus scraping every tandem service",
    )


def test_the_scaler_refuses_a_caller_without_its_token_or_outside_its_allow_list(stack):
    compose = stack["compose"]
    [scaler] = running(compose, "scaler")
    url = f"http://{address(scaler['ID'])}:8081"
    body = {"project": compose.project, "service": "decode", "replicas": 2}
    assert httpx.post(f"{url}/v1/scale", json=body, timeout=10).status_code == 401
    token = compose.run("exec", "-T", "scaler", "cat", "/var/lib/tandem/scaler/token").strip()
    auth = {"Authorization": f"Bearer {token}"}
    for service, replicas in (("gateway", 0), ("router", 3), ("decode", 99)):
        reply = httpx.post(
            f"{url}/v1/scale", json={**body, "service": service, "replicas": replicas}, headers=auth, timeout=10
        )
        assert reply.status_code in (403, 422), reply.text
    reply = httpx.get(
        f"{url}/v1/replicas", params={"project": compose.project, "service": "decode"}, headers=auth, timeout=60
    )
    assert reply.status_code == 200 and reply.json()["services"]["decode"]["ready"] == 1, reply.text
    assert len(running(compose, "gateway")) == 1 and len(running(compose, "decode")) == 1


def test_the_planner_scales_decode_through_the_scaler_under_a_spike_and_back(stack):
    compose, gateway = stack["compose"], stack["gateway"]
    assert len(running(compose, "decode")) == 1
    compose.env.update(TIGHT_SLO)
    compose.run("up", "--detach", "--wait", "--no-deps", "planner", timeout_s=300)  # recreated with the tight SLO

    async def spike_until_grown() -> list:
        grown = asyncio.create_task(
            asyncio.to_thread(
                poll,
                lambda: len(running(compose, "decode")),
                lambda n: n == 2,
                300,
                "the planner's second decode worker",
            )
        )
        outcomes = []
        while not grown.done():
            outcomes += await load(gateway, 16, 16, max_tokens=32)
        await grown  # raises when the planner never added one
        return outcomes

    outcomes = asyncio.run(spike_until_grown())
    poll(lambda: len(decode_workers(compose)), lambda n: n == 2, 300, "the router listing the new worker")
    poll(lambda: len(running(compose, "decode")), lambda n: n == 1, 300, "the planner removing the worker after")
    failed = [o for o in outcomes if o[0] != 200]
    assert not failed, f"{len(failed)} of {len(outcomes)} failed: {failed[:3]}"
    log = compose.run("logs", "--no-color", "planner")
    assert "scaling decode from 1 to 2" in log and "scaling decode from 2 to 1" in log, log[-3000:]


def test_scaled_by_hand_the_router_lists_three_decode_workers_and_routes_to_each(stack):
    compose = stack["compose"]
    compose.run("stop", "planner")  # from here on decode is scaled by hand; the planner would undo it
    compose.run(
        "up",
        "--detach",
        "--wait",
        "--no-recreate",
        "--no-deps",
        "--scale",
        "decode=3",
        "decode",
        timeout_s=UP_TIMEOUT_S,
    )
    poll(lambda: len(decode_workers(compose)), lambda n: n == 3, 10, "3 decode workers at the router", 0.5)
    ids = [c["ID"] for c in running(compose, "decode")]
    assert len(ids) == 3
    before = {i: metrics(i).get("tandem_worker_generated_tokens_total", 0.0) for i in ids}

    def served_by_all(_):
        asyncio.run(load(stack["gateway"], 12, 12, max_tokens=8))
        return all(metrics(i).get("tandem_worker_generated_tokens_total", 0.0) > before[i] for i in ids)

    poll(lambda: None, served_by_all, 120, "requests routed to every one of the 3 decode workers", 0)


def test_decode_containers_killed_under_load_lose_no_request_and_come_back(stack):
    compose = stack["compose"]
    ids = sorted(c["ID"] for c in running(compose, "decode"))
    assert len(ids) == 3
    killed, crashed = ids[0], ids[1]

    def kill() -> None:
        docker("kill", killed)  # `docker kill`: Docker counts it as stopped by hand, so no restart policy applies
        os.kill(int(inspect(crashed, "{{.State.Pid}}")), signal.SIGKILL)  # a crash, as the kernel's OOM killer

    outcomes = asyncio.run(load(stack["gateway"], 64, 16, during=kill))
    failed = [o for o in outcomes if o[0] != 200 or o[1] != 24]
    assert len(outcomes) == 64 and not failed, f"{len(failed)} of 64 lost: {failed[:3]}"
    poll(
        lambda: inspect(crashed, "{{.RestartCount}} {{.State.Health.Status}}"),
        lambda s: int(s.split()[0]) >= 1 and s.endswith("healthy") and not s.endswith("unhealthy"),
        UP_TIMEOUT_S,
        "the crashed decode container restarted by its restart policy and healthy again",
    )
    assert inspect(killed, "{{.State.Status}}") == "exited"
    compose.run(
        "up",
        "--detach",
        "--wait",
        "--no-recreate",
        "--no-deps",
        "--scale",
        "decode=3",
        "decode",
        timeout_s=UP_TIMEOUT_S,
    )
    poll(lambda: len(decode_workers(compose)), lambda n: n == 3, 60, "3 decode workers again")


def test_down_leaves_no_container_network_or_volume(stack):
    compose = stack["compose"]
    compose.run("down", "--volumes", "--remove-orphans", "--timeout", "10", timeout_s=300)
    assert compose.leftovers() == {"container": [], "network": [], "volume": []}
