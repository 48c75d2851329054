"""compose.yaml and deploy/k8s describe one stack: the same tandem services, on the same ports, with the same
settings, but for the differences named and explained below. Both sides are read with tandem's own parsers, so a
setting changed or renamed on one side only fails here."""

import dataclasses
import importlib
import re
from pathlib import Path

import pytest
import yaml

from tests.unit.deploy.helpers import OBSERVABILITY, check_command, environment, load_compose
from tests.unit.deploy.kube import ROLES, WORKER_ROLES, command, container_env, main_container, of_kind, pod_spec

SERVICES = load_compose()["services"]
# the overlay that runs each compose flavour of the workers (compose profiles: none, gpu, trtllm)
WORKER_SERVICES = {
    "cpu": {"prefill": "prefill", "decode": "decode"},
    "gpu": {"prefill": "prefill-gpu", "decode": "decode-gpu"},
    "trtllm": {"prefill": "prefill-trtllm", "decode": "decode-trtllm"},
}
MODEL_PATH = (
    "a pod links the checkpoint `tandem model fetch $(TANDEM_MODEL_ID)` made at /cache/model, so one id "
    "changes the model; compose names the offline conversion's directory"
)
# setting -> why the manifests differ from compose.yaml there; any other difference fails
REPLICAS = (
    "a cluster runs router replicas behind a headless Service (dns:NAME:PORT: every record); compose one "
    "router until it scales them too"
)
DIFFERENCES = {
    "gateway": {
        "model_dir": MODEL_PATH,
        "router_address": REPLICAS,
        "redis_url": "the cluster's Service is tandem-redis (components/redis), compose's service redis",
        "redis_password": "compose's gateway always mounts the password the certs service makes; a "
        "cluster's gateway reads it only with components/redis",
    },
    "router": {},
    "planner": {
        "connector": "compose scales with `docker compose up --scale`, a cluster through the Kubernetes API",
        "source": "compose always runs Prometheus; on a cluster it is optional, so the planner reads the router",
        "prometheus_url": "(the Prometheus source only)",
        "scaler_url": "(the compose connector only: the scaler runs docker for it)",
        "scaler_token_file": "(the compose connector only)",
        "compose_project": "(the compose connector only)",
        "k8s_namespace": "the pod's own namespace, from the downward API",
    },
    "worker": {
        "model": MODEL_PATH,
        "advertise_host": "a pod advertises its IP (downward API); a container the address its hostname resolves to",
        "worker_id": "a pod is its pod's name (what `tandem worker drain` asks the router about)",
        "router_address": REPLICAS,
        "num_threads": "a pod sees every core of its node: threads = its CPU request; a container its own cpuset",
        "drain_s": "compose keeps the default (its stop_grace_period bounds it); a pod drains longer, inside its grace",
    },
}
GPU_BUDGET = {"k8s_gpu_budget": "a GPU budget only the Kubernetes connector enforces"}
OPERATOR_KEYS = {
    "api_keys_file": "a pod reads the operator's keys from the Secret mounted as a file; compose from "
    "TANDEM_API_KEYS (none by default)",
    "api_keys": "(the operator's keys)",
}
# TANDEM_* names only the manifests set, and what reads them
MANIFEST_ONLY = {
    "TANDEM_MODEL_ID": "the model-fetch init containers' command line",
    "TANDEM_WORKER_KV_PORT": "the port named `kv`, reserved for KV transfer (NIXL/UCX); no setting reads it yet",
}
# names compose sets that a cluster does not need
COMPOSE_ONLY = {
    "TANDEM_PLANNER_SCALER_URL",
    "TANDEM_PLANNER_SCALER_TOKEN_FILE",
    "TANDEM_PLANNER_COMPOSE_PROJECT",
    "TANDEM_PLANNER_PROMETHEUS_URL",
    "TANDEM_REDIS_PASSWORD_FILE",
    "TANDEM_API_KEYS",
}  # a pod reads the keys from a file instead (TANDEM_API_KEYS_FILE)
# compose services a cluster does without: the planner scales Deployments through the Kubernetes API (RBAC)
COMPOSE_ONLY_SERVICES = {"scaler"}


def compose_settings(name: str, monkeypatch):
    return check_command(SERVICES[name]["command"], environment(SERVICES[name]), monkeypatch)


def k8s_settings(overlay: str, role: str, monkeypatch):
    container = main_container(overlay, role)
    env = container_env(overlay, container)
    return check_command(command(container, env), env, monkeypatch)


def compose_name(overlay: str, role: str) -> str:
    return WORKER_SERVICES[overlay][role] if role in WORKER_ROLES else role


def in_cluster(value):
    """compose's DNS names as the cluster's Services: router:50051 -> tandem-router:50051."""
    if isinstance(value, str):
        return re.sub(r"^(router|planner|gateway):(\d+)$", r"tandem-\1:\2", value)
    return value


def differences(compose, k8s) -> set[str]:
    ours, theirs = dataclasses.asdict(compose), dataclasses.asdict(k8s)
    return {name for name in ours if in_cluster(ours[name]) != theirs[name]}


def test_both_run_the_same_tandem_services():
    served = {s["command"][2] for s in SERVICES.values() if s.get("command", [])[:2] == ["tandem", "serve"]}
    assert served - COMPOSE_ONLY_SERVICES == set(ROLES)
    for overlay in WORKER_SERVICES:
        assert {
            d["spec"]["template"]["metadata"]["labels"]["tandem.io/role"]
            for d in of_kind(overlay, "Deployment").values()
        } == served - COMPOSE_ONLY_SERVICES
    assert SERVICES["model-fetch"]["command"][:3] == ["tandem", "model", "fetch"]  # pods: an init container


@pytest.mark.parametrize("overlay", list(WORKER_SERVICES))
@pytest.mark.parametrize("role", ROLES)
def test_settings_agree_but_where_the_platforms_differ(overlay, role, monkeypatch):
    compose = compose_settings(compose_name(overlay, role), monkeypatch)
    k8s = k8s_settings(overlay, role, monkeypatch)
    allowed = DIFFERENCES["worker" if role in WORKER_ROLES else role]
    if role == "planner" and overlay != "cpu":
        allowed = allowed | GPU_BUDGET
    if role == "gateway" and overlay != "cpu":
        allowed = allowed | OPERATOR_KEYS
    assert differences(compose, k8s) == set(allowed), (overlay, role)  # NOTE: no stale excuse either


@pytest.mark.parametrize("overlay", list(WORKER_SERVICES))
@pytest.mark.parametrize("role", ROLES)
def test_both_listen_on_the_same_ports(overlay, role, monkeypatch):
    compose = compose_settings(compose_name(overlay, role), monkeypatch)
    ports = {"http": compose.port} if role == "gateway" else {"grpc": compose.port, "metrics": compose.metrics_port}
    container = main_container(overlay, role)
    named = {p["name"]: p["containerPort"] for p in container["ports"] if p["name"] != "kv"}
    assert named == ports
    healthcheck = SERVICES[compose_name(overlay, role)]["healthcheck"]["test"][-1]
    assert healthcheck.rsplit(":", 1)[-1].split("/")[0] == str(ports.get("grpc", ports.get("http")))


@pytest.mark.parametrize("overlay", list(WORKER_SERVICES))
@pytest.mark.parametrize("role", ROLES)
def test_every_setting_compose_sets_is_set_in_the_cluster_and_every_name_is_read(overlay, role, monkeypatch):
    compose = {k for k in environment(SERVICES[compose_name(overlay, role)]) if k.startswith("TANDEM_")}
    container = main_container(overlay, role)
    k8s = {k for k in container_env(overlay, container) if k.startswith("TANDEM_")}
    assert compose - COMPOSE_ONLY <= k8s, compose - COMPOSE_ONLY - k8s
    unread = k8s - known_names() - set(MANIFEST_ONLY)
    assert not unread, f"set in the manifests, read by nothing: {sorted(unread)}"
    assert (
        environment(SERVICES[compose_name(overlay, role)])["OTEL_SERVICE_NAME"]
        == container_env(overlay, container)["OTEL_SERVICE_NAME"]
    )


def test_the_name_check_knows_the_settings_and_flags_a_typo():
    names = known_names()
    assert {
        "TANDEM_WORKER_DRAIN_S",
        "TANDEM_ROUTER_POLICY",
        "TANDEM_PLANNER_K8S_GPU_BUDGET",
        "TANDEM_API_KEYS",
        "TANDEM_MODEL",
        "TANDEM_LOG_FORMAT",
        "TANDEM_OFFLINE",
    } <= names
    assert "TANDEM_WORKER_DRAIN_SECONDS" not in names


def known_names() -> set[str]:
    """Every TANDEM_* variable some part of tandem reads: each service's settings, and the process-wide ones (each
    checked to appear in the module said to read it)."""
    from services.common.worker_settings import SOURCE as WORKER
    from services.gateway.settings import SOURCE as GATEWAY
    from services.planner.settings import SOURCE as PLANNER
    from services.router.settings import SOURCE as ROUTER

    names = {s.env for source in (GATEWAY, WORKER, ROUTER, PLANNER) for s in source.settings()}
    process_wide = {
        "TANDEM_CACHE_DIR": "tandem.models.fetch",
        "TANDEM_OFFLINE": "tandem.models.fetch",
        "TANDEM_LOG_FORMAT": "services.common.logs",
        "TANDEM_LOG_LEVEL": "services.common.logs",
    }
    for name, module in process_wide.items():
        assert name in Path(importlib.import_module(module).__file__).read_text(), (name, module)
    from services.common import tls

    names |= {tls.ENV_PREFIX + n for n in ("CA", "CERT", "KEY", "CLIENT_AUTH", "SERVER_NAME")}  # every gRPC process
    from services.common.settings import FILE_SECRETS

    names |= {name + "_FILE" for name in FILE_SECRETS if name in names}  # a secret handed over as a file
    return names | set(process_wide)


@pytest.mark.parametrize("overlay", list(WORKER_SERVICES))
def test_both_fetch_the_same_model_offline(overlay, monkeypatch):
    from tandem.models.fetch import DEFAULT_MODEL_ID

    fetch = compose_settings("model-fetch", monkeypatch)
    assert fetch.model_id is None and environment(SERVICES["model-fetch"])["TANDEM_OFFLINE"] == "1"
    for role in ("gateway", *WORKER_ROLES):
        (init,) = pod_spec(overlay, role)["initContainers"]
        env = container_env(overlay, init)
        args = check_command(command(init, env), env, monkeypatch)
        assert (args.model_id, env["TANDEM_OFFLINE"]) == (DEFAULT_MODEL_ID, "1"), role
    gateway = compose_settings("gateway", monkeypatch)
    assert gateway.served_model_name == k8s_settings(overlay, "gateway", monkeypatch).served_model_name


def test_prometheus_scrapes_the_same_services_both_ways():
    config = yaml.safe_load((OBSERVABILITY / "prometheus" / "prometheus.yml").read_text())
    jobs = {job["job_name"] for job in config["scrape_configs"]} - {"prometheus"}
    monitors = {**of_kind("gpu-monitoring", "ServiceMonitor"), **of_kind("gpu-monitoring", "PodMonitor")}
    scraped = {
        (m["spec"].get("endpoints") or m["spec"]["podMetricsEndpoints"])[0]["relabelings"][0]["replacement"]
        for m in monitors.values()
    }
    assert scraped == jobs == set(ROLES)
