"""deploy/k8s's invariants, on every rendered overlay: selectors select the pods, GPUs go to workers only, probes
everywhere, a grace period that holds the drain, no image left to `latest`, and the planner's Role is exactly the
calls its Kubernetes connector makes. What each container runs is read by tandem's own parsers."""

import os
import re
import shutil
import subprocess
import sys
import tomllib

import pytest

from deploy.k8s import render
from services.common.settings import SettingsError
from services.common.worker_base import SETTLE_S
from services.planner.connectors.kubernetes import API_CALLS
from tests.unit.deploy.helpers import REPO, check_command
from tests.unit.deploy.kube import (
    GPU_OVERLAYS,
    LABELS,
    OVERLAYS,
    POD,
    ROLES,
    WORKER_ROLES,
    all_containers,
    command,
    container_env,
    deployment,
    main_container,
    objects,
    of_kind,
    pod_spec,
)

VERSION = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]
COMPONENTS = {"gateway": "gateway", "router": "router", "planner": "planner", "prefill": "worker", "decode": "worker"}
GPU = "nvidia.com/gpu"
KV_DISK_DIR = "/var/cache/tandem/kv"  # the kv-disk volume, which the README says to name


def settings(overlay: str, role: str, monkeypatch, secrets=None):
    container = main_container(overlay, role)
    env = container_env(overlay, container, secrets)
    return check_command(command(container, env), env, monkeypatch)


def selects(selector: dict, labels: dict) -> bool:
    assert set(selector) == {"matchLabels"}, selector  # NOTE: no matchExpressions to get wrong
    return selector["matchLabels"].items() <= labels.items()


def pod_labels(overlay: str) -> dict[str, dict]:
    return {name: d["spec"]["template"]["metadata"]["labels"] for name, d in of_kind(overlay, "Deployment").items()}


# --- workloads and labels -----------------------------------------------------------------------------------


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_one_deployment_per_service_labelled_by_role(overlay):
    assert set(of_kind(overlay, "Deployment")) == {f"tandem-{role}" for role in ROLES}
    for role in ROLES:
        d = deployment(overlay, role)
        for labels in (d["metadata"]["labels"], d["spec"]["template"]["metadata"]["labels"]):
            assert set(LABELS) <= set(labels), (role, labels)
            assert (labels["app.kubernetes.io/name"], labels["tandem.io/role"]) == (f"tandem-{role}", role)
            assert labels["app.kubernetes.io/component"] == COMPONENTS[role]
            assert labels["app.kubernetes.io/part-of"] == "tandem" and labels["app.kubernetes.io/version"] == VERSION


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_each_deployment_selects_its_own_pods_and_no_others(overlay):
    labels = pod_labels(overlay)
    for name, d in of_kind(overlay, "Deployment").items():
        selector = d["spec"]["selector"]
        # NOTE: a selector cannot change once applied: never the version
        assert set(selector["matchLabels"]) == {"app.kubernetes.io/name", "tandem.io/role"}, name
        assert [other for other, pod in labels.items() if selects(selector, pod)] == [name]


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_services_budgets_and_monitors_select_the_pods_they_name(overlay):
    labels = pod_labels(overlay)
    selectors = {("Service", n): {"matchLabels": s["spec"]["selector"]} for n, s in of_kind(overlay, "Service").items()}
    for kind in ("PodDisruptionBudget", "PodMonitor"):
        selectors |= {(kind, n): o["spec"]["selector"] for n, o in of_kind(overlay, kind).items()}
    assert selectors
    for (kind, name), selector in selectors.items():
        assert [pod for pod, found in labels.items() if selects(selector, found)] == [name], (kind, name)
    services = {n: s["metadata"]["labels"] for n, s in of_kind(overlay, "Service").items()}
    for name, monitor in of_kind(overlay, "ServiceMonitor").items():
        assert [s for s, found in services.items() if selects(monitor["spec"]["selector"], found)] == [name]


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_every_image_is_the_projects_version_never_latest(overlay):
    images = [
        c["image"]
        for d in of_kind(overlay, "Deployment").values()
        for c in all_containers(d["spec"]["template"]["spec"])
    ]
    assert len(images) >= 8
    for image in images:
        name, _, tag = image.rpartition(":")
        assert name.startswith("tandem/") and "/" not in tag, image  # tagged (no tag would mean latest)
        assert tag == VERSION != "latest", image


def test_each_overlay_runs_its_own_worker_image():
    expected = {
        "cpu": "tandem/worker-cpu",
        "gpu": "tandem/worker-cuda",
        "trtllm": "tandem/worker-trtllm",
        "gpu-monitoring": "tandem/worker-cuda",
    }
    for overlay, image in expected.items():
        for role in WORKER_ROLES:
            assert main_container(overlay, role)["image"] == f"{image}:{VERSION}", (overlay, role)
        assert main_container(overlay, "gateway")["image"] == f"tandem/control-plane:{VERSION}"


# --- GPUs, workers ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_gpu_limits_and_the_gpu_toleration_only_on_workers(overlay):
    for role in ROLES:
        spec = pod_spec(overlay, role)
        on_gpu = overlay in GPU_OVERLAYS and role in WORKER_ROLES
        for container in all_containers(spec):
            resources = container.get("resources", {})
            assert GPU not in resources.get("requests", {}), (role, container["name"])
            is_worker = container in spec["containers"] and on_gpu
            expected = "1" if is_worker else None
            assert resources.get("limits", {}).get(GPU) == expected, (overlay, role, container["name"])
        tolerated = [t for t in spec.get("tolerations", []) if t["key"] == GPU]
        assert tolerated == ([{"key": GPU, "operator": "Exists", "effect": "NoSchedule"}] if on_gpu else []), role


@pytest.mark.parametrize("overlay", OVERLAYS)
@pytest.mark.parametrize("role", WORKER_ROLES)
def test_workers_get_shared_memory_the_downward_api_and_advertise_their_pod_ip(overlay, role, monkeypatch):
    spec, container = pod_spec(overlay, role), main_container(overlay, role)
    volumes = {v["name"]: v for v in spec["volumes"]}
    mounts = {m["mountPath"]: m["name"] for m in container["volumeMounts"]}
    assert volumes[mounts["/dev/shm"]]["emptyDir"]["medium"] == "Memory"
    refs = {v["name"]: v["valueFrom"]["fieldRef"]["fieldPath"] for v in container["env"] if "valueFrom" in v}
    assert refs == {"POD_NAME": "metadata.name", "POD_NAMESPACE": "metadata.namespace", "POD_IP": "status.podIP"}
    worker = settings(overlay, role, monkeypatch)
    assert (worker.role, worker.host, worker.advertise_host) == (role, "0.0.0.0", POD["status.podIP"])
    assert worker.advertised_address(worker.port) == f"{POD['status.podIP']}:{worker.port}"
    assert worker.worker_id == POD["metadata.name"]  # what `tandem worker drain` asks the router about
    assert volumes[mounts[KV_DISK_DIR]]["emptyDir"]  # the disk KV tier's, once the README's settings turn it on
    assert f"TANDEM_WORKER_KV_DISK_DIR={KV_DISK_DIR}" in (render.K8S / "README.md").read_text()
    if overlay != "trtllm":  # the README's merge turns the tier on (trtllm keeps its own tiers)
        tiers = {
            "TANDEM_WORKER_KV_DISK_DIR": KV_DISK_DIR,
            "TANDEM_WORKER_KV_HOST_GB": "4",
            "TANDEM_WORKER_KV_DISK_GB": "16",
        }
        env = container_env(overlay, container) | tiers
        assert check_command(command(container, env), env, monkeypatch).cache.kv_disk_dir == KV_DISK_DIR


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_cpu_threads_follow_the_cpu_request(overlay, monkeypatch):
    for role in WORKER_ROLES:
        cpus = main_container(overlay, role)["resources"]["requests"]["cpu"]
        assert settings(overlay, role, monkeypatch).num_threads == int(cpus), role  # a pod sees all its node's cores


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_prefill_and_decode_are_one_deployment_but_for_the_role(overlay):
    def as_decode(value):
        if isinstance(value, str):
            return value.replace("prefill", "decode")
        if isinstance(value, dict):
            return {as_decode(k): as_decode(v) for k, v in value.items()}
        return [as_decode(v) for v in value] if isinstance(value, list) else value

    for kind in ("Deployment", "Service", "PodDisruptionBudget", "PodMonitor"):
        found = of_kind(overlay, kind)
        if kind == "PodMonitor" and not found:
            continue
        assert as_decode(found["tandem-prefill"]) == found["tandem-decode"], kind


# --- ports, probes, termination ------------------------------------------------------------------------------


def listening_ports(role: str, s, env: dict) -> dict[str, int]:
    if role == "gateway":
        return {"http": s.port}
    ports = {"grpc": s.port, "metrics": s.metrics_port}
    return ports | ({"kv": int(env["TANDEM_WORKER_KV_PORT"])} if role in WORKER_ROLES else {})


@pytest.mark.parametrize("overlay", OVERLAYS)
@pytest.mark.parametrize("role", ROLES)
def test_named_ports_are_the_ones_the_service_listens_on(overlay, role, monkeypatch):
    container = main_container(overlay, role)
    expected = listening_ports(role, settings(overlay, role, monkeypatch), container_env(overlay, container))
    assert {p["name"]: p["containerPort"] for p in container["ports"]} == expected
    service = of_kind(overlay, "Service")[f"tandem-{role}"]
    assert {p["name"]: (p["port"], p["targetPort"]) for p in service["spec"]["ports"]} == {
        name: (port, name) for name, port in expected.items()
    }
    if role in (*WORKER_ROLES, "router"):  # headless: each pod's own address (the router replicas: all of them)
        assert service["spec"]["clusterIP"] == "None"
    else:
        assert service["spec"]["type"] == "ClusterIP" and "clusterIP" not in service["spec"]


@pytest.mark.parametrize("overlay", OVERLAYS)
@pytest.mark.parametrize("role", ROLES)
def test_every_container_has_startup_readiness_and_cheap_liveness_probes(overlay, role, monkeypatch):
    container, s = main_container(overlay, role), settings(overlay, role, monkeypatch)
    probes = {kind: container[f"{kind}Probe"] for kind in ("startup", "readiness", "liveness")}
    if role == "gateway":
        paths = {kind: (p["httpGet"]["path"], p["httpGet"]["port"]) for kind, p in probes.items()}
        # ready = the router answers and lists a decode worker; alive asks nothing of anyone else
        assert paths == {
            "startup": ("/health", "http"),
            "readiness": ("/ready", "http"),
            "liveness": ("/health", "http"),
        }
    else:  # the kubelet's gRPC probe speaks no TLS: the images' healthcheck dials with the pod's certificate
        check = ["python", "/opt/tandem/docker/healthcheck.py", "grpc", f"127.0.0.1:{s.port}"]
        assert probes["startup"]["exec"]["command"] == probes["readiness"]["exec"]["command"] == check
        assert probes["startup"]["timeoutSeconds"] >= 5 and probes["readiness"]["timeoutSeconds"] >= 5
        assert probes["liveness"]["tcpSocket"] == {"port": s.port}  # cheap: the port accepts a connection
    allowed_s = probes["startup"]["periodSeconds"] * probes["startup"]["failureThreshold"]
    if role in WORKER_ROLES:  # loading the model, and on GPUs compiling kernels
        assert allowed_s >= (3600 if overlay in GPU_OVERLAYS else 1800), allowed_s
    assert probes["liveness"]["periodSeconds"] >= probes["readiness"]["periodSeconds"]
    for init in pod_spec(overlay, role).get("initContainers", []):
        assert not {"startupProbe", "readinessProbe", "livenessProbe"} & set(init), init["name"]


@pytest.mark.parametrize("overlay", OVERLAYS)
@pytest.mark.parametrize("role", WORKER_ROLES)
def test_worker_grace_exceeds_its_prestop_and_drain(overlay, role, monkeypatch):
    spec, container = pod_spec(overlay, role), main_container(overlay, role)
    env = container_env(overlay, container)
    worker = settings(overlay, role, monkeypatch)
    hook = check_command(command(container["lifecycle"]["preStop"]["exec"], env), env, monkeypatch)
    assert (hook.command, hook.worker_command, hook.pid) == ("worker", "drain", 1)  # PID 1: `command` is tandem's
    assert container["command"][0] == "tandem" and not spec.get("shareProcessNamespace")
    assert (hook.worker_id, hook.router_address) == (worker.worker_id, worker.router_address)
    # the worker's stop: settle after deregistering, drain, 1 s for the server's last messages, and a margin of 5 s
    # for the engine's shutdown
    stop_s = SETTLE_S + worker.drain_s + 1 + 5
    assert spec["terminationGracePeriodSeconds"] > hook.timeout_s + stop_s
    assert worker.drain_s >= 30


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_gateway_grace_exceeds_its_prestop_and_stream_drain(overlay, monkeypatch):
    spec, container = pod_spec(overlay, "gateway"), main_container(overlay, "gateway")
    sleep = container["lifecycle"]["preStop"]["exec"]["command"]
    assert sleep[0] == "sleep" and int(sleep[1]) >= 3  # the Service's endpoints drop the pod meanwhile
    gateway = settings(overlay, "gateway", monkeypatch)
    assert spec["terminationGracePeriodSeconds"] > int(sleep[1]) + gateway.drain_timeout_s + 5  # the supervisor's 5


# --- the planner, its Role, and who else may touch the API ----------------------------------------------------


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_the_planner_role_grants_exactly_the_calls_its_connector_makes(overlay, monkeypatch):
    planner = settings(overlay, "planner", monkeypatch)
    workers = {planner.k8s_prefill_deployment, planner.k8s_decode_deployment}
    assert workers == {f"tandem-{role}" for role in WORKER_ROLES} <= set(of_kind(overlay, "Deployment"))
    role = of_kind(overlay, "Role")["tandem-planner"]
    granted = set()
    for rule in role["rules"]:
        for resource in rule["resources"]:
            assert rule["apiGroups"] == (["apps"] if resource.startswith("deployments") else [""]), rule
            assert set(rule.get("resourceNames", [])) == (workers if resource != "pods" else set()), rule
            granted |= {(resource, verb) for verb in rule["verbs"]}
    assert granted == API_CALLS
    assert not of_kind(overlay, "ClusterRole") and not of_kind(overlay, "ClusterRoleBinding")


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_only_the_planner_holds_an_api_token_bound_to_its_role(overlay, monkeypatch):
    """(and the tandem-certs Job's pod, which creates the TLS Secrets: tests/unit/deploy/test_k8s_security.py)"""
    assert set(of_kind(overlay, "Role")) == set(of_kind(overlay, "RoleBinding")) == {"tandem-planner", "tandem-certs"}
    binding, role = of_kind(overlay, "RoleBinding")["tandem-planner"], "tandem-planner"
    assert binding["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": role}
    account = pod_spec(overlay, "planner")["serviceAccountName"]
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": account, "namespace": "tandem"}]
    assert account in of_kind(overlay, "ServiceAccount")
    assert settings(overlay, "planner", monkeypatch).connector == "kubernetes"
    for name in ROLES:
        spec = pod_spec(overlay, name)
        assert spec["automountServiceAccountToken"] is (name == "planner"), name
        # NOTE: service links would put TANDEM_ROUTER_PORT=tcp://... and the like into every pod's environment
        assert spec["enableServiceLinks"] is False, name
    assert {o["metadata"].get("namespace") for o in objects(overlay) if o["kind"] != "Namespace"} == {"tandem"}


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_replica_counts_and_no_autoscaler_beside_the_planner(overlay):
    kinds = {o["kind"] for o in objects(overlay)}
    assert not kinds & {"HorizontalPodAutoscaler", "ScaledObject", "VerticalPodAutoscaler"}  # two writers fight
    for role in WORKER_ROLES:  # the planner's: `kubectl apply` must not reset its count
        assert "replicas" not in deployment(overlay, role)["spec"], role
    assert deployment(overlay, "gateway")["spec"]["replicas"] >= 2
    assert deployment(overlay, "planner")["spec"]["replicas"] == 1
    assert deployment(overlay, "planner")["spec"]["strategy"] == {"type": "Recreate"}
    router = deployment(overlay, "router")["spec"]  # replicas that each follow every worker
    assert router["replicas"] == 2 and router["strategy"] == {
        "type": "RollingUpdate",
        "rollingUpdate": {"maxUnavailable": 0},
    }


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_disruption_budgets_for_the_replicated_services_only(overlay):
    budgets = of_kind(overlay, "PodDisruptionBudget")
    # NOTE: a budget on a one-replica Deployment (router, planner) would block every node drain
    assert set(budgets) == {"tandem-gateway", "tandem-prefill", "tandem-decode"}
    for budget in budgets.values():
        assert budget["spec"]["maxUnavailable"] == 1 and "minAvailable" not in budget["spec"]
        assert budget["spec"]["unhealthyPodEvictionPolicy"] == "AlwaysAllow"  # a crash-looping pod never blocks


# --- configuration, secrets, the model ----------------------------------------------------------------------


@pytest.mark.parametrize("overlay", OVERLAYS)
@pytest.mark.parametrize("role", ROLES)
def test_every_container_command_parses_into_valid_settings(overlay, role, monkeypatch):
    spec = pod_spec(overlay, role)
    for container in all_containers(spec):
        env = container_env(overlay, container)
        try:
            parsed = check_command(command(container, env), env, monkeypatch)
        except SystemExit as exc:
            pytest.fail(f"{overlay} {role} {container['name']}: {command(container, env)} does not parse ({exc})")
        assert parsed is not None
        for source in container["envFrom"]:  # generated, so named by a hash of their contents
            name = source["configMapRef"]["name"]
            assert name in of_kind(overlay, "ConfigMap") and re.fullmatch(r"tandem-[a-z]+-[a-z0-9]{10}", name), name


def test_a_setting_change_rolls_exactly_the_pods_that_read_it(tmp_path):
    def changed(env_file: str, old: str, new: str) -> list[str]:
        tree = tmp_path / env_file  # NOTE: a fresh path per change: renders are cached by path
        shutil.copytree(render.K8S, tree, ignore=shutil.ignore_patterns("golden"))
        path = tree / "base" / "config" / env_file
        assert old in path.read_text()
        path.write_text(path.read_text().replace(old, new))
        before, after = of_kind("cpu", "Deployment"), of_kind(tree / "overlays" / "cpu", "Deployment")
        return sorted(n for n in before if before[n]["spec"]["template"] != after[n]["spec"]["template"])

    assert changed("planner.env", "MAX_DECODE=4", "MAX_DECODE=5") == ["tandem-planner"]
    assert changed("worker.env", "DRAIN_S=60", "DRAIN_S=90") == ["tandem-decode", "tandem-prefill"]
    assert changed("common.env", "LOG_LEVEL=info", "LOG_LEVEL=debug") == sorted(f"tandem-{r}" for r in ROLES)


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_api_keys_come_from_a_secret_mounted_as_a_file(overlay, monkeypatch):
    container, spec = main_container(overlay, "gateway"), pod_spec(overlay, "gateway")
    assert not any(v["name"].startswith("TANDEM_API_KEYS") for v in container.get("env", []))  # not in the env
    (mount,) = [m for m in container["volumeMounts"] if m["name"] == "api-keys"]
    (volume,) = [v for v in spec["volumes"] if v["name"] == "api-keys"]
    assert mount["readOnly"] and volume["secret"]["secretName"].startswith("tandem-api-keys")
    assert not volume["secret"].get("optional") and volume["secret"]["defaultMode"] == 0o440
    generated = [name for name in of_kind(overlay, "Secret") if name.startswith("tandem-api-keys")]
    assert len(generated) == (1 if overlay == "cpu" else 0)  # elsewhere the operator's own Secret
    if overlay == "cpu":  # a cluster to try it on: no keys, said so by the setting, not by an empty file
        assert settings(overlay, "gateway", monkeypatch).api_keys == ()
        return
    keys = {volume["secret"]["secretName"]: {"keys": "key-1\nkey-2\n"}}
    parsed = settings(overlay, "gateway", monkeypatch, keys)
    assert parsed.api_keys == ("key-1", "key-2") and parsed.api_keys_file.endswith("/keys")
    with pytest.raises(SettingsError, match="names no key"):
        settings(overlay, "gateway", monkeypatch, {volume["secret"]["secretName"]: {"keys": "\n"}})


@pytest.mark.parametrize("overlay", OVERLAYS)
@pytest.mark.parametrize("role", ["gateway", *WORKER_ROLES])
def test_the_model_is_fetched_into_the_volume_the_service_reads(overlay, role, monkeypatch):
    spec = pod_spec(overlay, role)
    (fetch,) = spec["initContainers"]
    env = container_env(overlay, fetch)
    args = check_command(command(fetch, env), env, monkeypatch)
    assert (args.model_command, args.model_id, str(args.link)) == ("fetch", env["TANDEM_MODEL_ID"], env["TANDEM_MODEL"])
    assert env["HF_HUB_OFFLINE"] == "0"  # the images say 1: TANDEM_OFFLINE alone decides
    served = settings(overlay, role, monkeypatch)
    assert (served.model_dir if role == "gateway" else served.model) == env["TANDEM_MODEL"]
    fetch_mount = {m["name"]: m for m in fetch["volumeMounts"]}["model"]
    (serve_mount,) = [m for m in main_container(overlay, role)["volumeMounts"] if m["name"] == "model"]
    assert env["TANDEM_MODEL"].startswith(fetch_mount["mountPath"] + "/") and not fetch_mount.get("readOnly")
    assert serve_mount == {"name": "model", "mountPath": fetch_mount["mountPath"], "readOnly": True}


def test_the_model_fetch_init_container_links_the_checkpoint_the_services_read(tmp_path, smollm2_dir):
    """The init container's command run here as a pod runs it (offline: the image's own copy of SmolLM2), but into a
    cache and a link under this test's folders: the link the services read ends at the converted checkpoint."""
    (fetch,) = pod_spec("cpu", "decode")["initContainers"]
    env = container_env("cpu", fetch) | {
        "TANDEM_CACHE_DIR": str(smollm2_dir.parents[1]),
        "TANDEM_MODEL": str(tmp_path / "model"),
    }
    argv = command(fetch, env)
    done = subprocess.run(
        [sys.executable, "-m", "tandem.cli", *argv[1:]],
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    link = tmp_path / "model"
    assert link.is_symlink() and link.resolve() == smollm2_dir.resolve()
    assert (link / "config.json").is_file() and (link / "tokenizer.json").is_file()


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_every_service_is_scraped_by_a_monitor_where_monitoring_is_on(overlay, monkeypatch):
    monitors = {**of_kind(overlay, "ServiceMonitor"), **of_kind(overlay, "PodMonitor")}
    if overlay != "gpu-monitoring":
        assert not monitors
        return
    assert set(monitors) == {f"tandem-{role}" for role in ROLES}
    for role in ROLES:
        container, monitor = main_container(overlay, role), monitors[f"tandem-{role}"]
        (endpoint,) = monitor["spec"].get("endpoints") or monitor["spec"]["podMetricsEndpoints"]
        assert (endpoint["port"], endpoint["path"]) == ("http" if role == "gateway" else "metrics", "/metrics")
        assert endpoint["port"] in {p["name"] for p in container["ports"]}
        assert endpoint["relabelings"] == [{"targetLabel": "service", "replacement": role}]
        assert endpoint["interval"] == "5s"  # the dashboards' $__rate_interval assumes it
