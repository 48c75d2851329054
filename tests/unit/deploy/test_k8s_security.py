"""deploy/k8s hardened, on every rendered overlay: the NetworkPolicies evaluated into who reaches which port (and
compared with exactly the pairs the services need), and every container of every pod unprivileged on a read-only
root filesystem with its writable paths on volumes (the restricted Pod Security Standard)."""

import pytest

from tests.unit.deploy.helpers import REPO
from tests.unit.deploy.kube import OVERLAYS, ROLES, all_containers, container_env, of_kind, pod_spec

NAMESPACE = "tandem"
# (source role, target role) -> the target's named ports it may open; None: every port
NEEDED = {
    ("gateway", "router"): {"grpc"},
    ("gateway", "prefill"): {"grpc"},
    ("gateway", "decode"): {"grpc"},
    ("prefill", "router"): {"grpc"},
    ("decode", "router"): {"grpc"},
    ("router", "prefill"): {"grpc"},
    ("router", "decode"): {"grpc"},
    ("decode", "prefill"): None,  # PullKv on grpc, and NIXL/UCX on the ports UCX picks
    ("planner", "router"): {"grpc"},
    ("planner", "prefill"): {"grpc"},
    ("planner", "decode"): {"grpc"},
}
PROMETHEUS = ({"app.kubernetes.io/name": "prometheus"}, "monitoring")
STRANGER = ({"app": "anything"}, "default")
KUBE_DNS = ({"k8s-app": "kube-dns"}, "kube-system")


class Pod:
    def __init__(self, labels: dict, namespace: str, ports: dict[str, int] | None = None):
        self.labels, self.namespace, self.ports = labels, namespace, ports or {}


def tandem_pods(overlay: str) -> dict[str, Pod]:
    pods = {}
    for role in ROLES:
        spec = pod_spec(overlay, role)
        labels = of_kind(overlay, "Deployment")[f"tandem-{role}"]["spec"]["template"]["metadata"]["labels"]
        ports = {p["name"]: p["containerPort"] for c in spec["containers"] for p in c.get("ports", [])}
        pods[role] = Pod(labels, NAMESPACE, ports)
    return pods


def _selects(selector: dict, labels: dict) -> bool:
    assert set(selector) <= {"matchLabels"}, selector  # NOTE: no matchExpressions to get wrong
    return selector.get("matchLabels", {}).items() <= labels.items()


def _peer_matches(peer: dict, pod: Pod) -> bool:
    assert "ipBlock" not in peer, peer
    if "namespaceSelector" in peer:
        ns_labels = {"kubernetes.io/metadata.name": pod.namespace}
        if not _selects(peer["namespaceSelector"], ns_labels):
            return False
    elif pod.namespace != NAMESPACE:
        return False
    return _selects(peer.get("podSelector", {}), pod.labels)


def _port_matches(rule: dict, target: Pod, name: str, number: int) -> bool:
    if "ports" not in rule:
        return True
    return any(p.get("protocol", "TCP") == "TCP" and p["port"] in (name, number) for p in rule["ports"])


def _allowed(policies, direction: str, subject: Pod, peer: Pod, target: Pod, name: str, number: int) -> bool:
    """Whether `direction` (Ingress on the target, Egress on the source) lets this connection through."""
    kind, field = ("ingress", "from") if direction == "Ingress" else ("egress", "to")
    isolating = [
        p["spec"]
        for p in policies
        if direction in p["spec"]["policyTypes"]
        and subject.namespace == NAMESPACE
        and _selects(p["spec"]["podSelector"], subject.labels)
    ]
    if subject.namespace != NAMESPACE:
        return True  # no policy of ours isolates a pod elsewhere
    return any(
        (field not in rule or any(_peer_matches(x, peer) for x in rule[field]))
        and _port_matches(rule, target, name, number)
        for spec in isolating
        for rule in spec.get(kind, [])
    )


def reaches(policies, source: Pod, target: Pod, name: str) -> bool:
    number = target.ports[name]
    return _allowed(policies, "Egress", source, target, target, name, number) and _allowed(
        policies, "Ingress", target, source, target, name, number
    )


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_everything_is_denied_by_default(overlay):
    policies = of_kind(overlay, "NetworkPolicy")
    deny = policies["tandem-default-deny"]["spec"]
    assert deny["podSelector"] == {} and set(deny["policyTypes"]) == {"Ingress", "Egress"}
    assert "ingress" not in deny and "egress" not in deny


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_tandem_pods_reach_exactly_the_ports_their_role_pairs_need(overlay):
    policies = list(of_kind(overlay, "NetworkPolicy").values())
    pods = tandem_pods(overlay)
    for (src, dst), target in ((pair, pods[pair[1]]) for pair in [(s, d) for s in ROLES for d in ROLES if s != d]):
        needed = NEEDED.get((src, dst), set())
        open_ports = {name for name in target.ports if reaches(policies, pods[src], target, name)}
        assert open_ports == (set(target.ports) if needed is None else needed), (src, dst)
    for role in ROLES:  # nobody reaches itself by the network either (a replica calls no other replica)
        assert not any(
            reaches(policies, pods[role], pods[role], n)
            for n in pods[role].ports
            if (role, role) not in NEEDED and n != "http"
        ), role


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_clients_reach_only_the_gateway_and_prometheus_only_metrics(overlay):
    policies = list(of_kind(overlay, "NetworkPolicy").values())
    pods = tandem_pods(overlay)
    stranger, prometheus = Pod(*STRANGER), Pod(*PROMETHEUS)
    for role, pod in pods.items():
        for name in pod.ports:
            assert reaches(policies, stranger, pod, name) == (role == "gateway"), (role, name)
            scraped = name == "metrics" or (role == "gateway" and name == "http")  # the gateway's /metrics
            assert reaches(policies, prometheus, pod, name) == scraped, (role, name)


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_every_pod_resolves_names_and_only_the_planner_reaches_the_kubernetes_api(overlay):
    policies = list(of_kind(overlay, "NetworkPolicy").values())
    pods = tandem_pods(overlay)
    dns = Pod(*KUBE_DNS, {"dns": 53})
    api_server = Pod({"component": "kube-apiserver"}, "kube-system", {"https": 6443})
    for role, pod in pods.items():
        assert _allowed(policies, "Egress", pod, dns, dns, "dns", 53), role
        fetches_model = any(c["name"] == "model-fetch" for c in pod_spec(overlay, role).get("initContainers", []))
        assert _allowed(policies, "Egress", pod, api_server, api_server, "https", 6443) == (role == "planner"), role
        hub = Pod({}, "internet", {"https": 443})
        assert _allowed(policies, "Egress", pod, hub, hub, "https", 443) == (role == "planner" or fetches_model), role


# --- the containers ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("overlay", OVERLAYS)
@pytest.mark.parametrize("role", ROLES)
def test_every_container_is_unprivileged_on_a_read_only_root(overlay, role):
    spec = pod_spec(overlay, role)
    assert spec["securityContext"]["seccompProfile"]["type"] == "RuntimeDefault"
    assert not spec.get("hostNetwork") and not spec.get("hostPID") and not spec.get("hostIPC")
    for container in all_containers(spec):
        sc = container["securityContext"]
        where = (overlay, role, container["name"])
        assert sc["runAsNonRoot"] is True and sc["runAsUser"] != 0 and sc["runAsGroup"] != 0, where
        assert sc["allowPrivilegeEscalation"] is False and sc["readOnlyRootFilesystem"] is True, where
        assert sc["capabilities"] == {"drop": ["ALL"]}, where  # nothing added back
        assert not sc.get("privileged"), where


@pytest.mark.parametrize("overlay", OVERLAYS)
@pytest.mark.parametrize("role", ROLES)
def test_what_a_container_writes_is_on_a_volume(overlay, role):
    spec = pod_spec(overlay, role)
    volumes = {v["name"]: v for v in spec["volumes"]}
    assert "emptyDir" in volumes["tmp"]
    for container in all_containers(spec):
        mounts = {m["mountPath"]: m for m in container.get("volumeMounts", [])}
        assert mounts["/tmp"]["name"] == "tmp", (overlay, role, container["name"])
        assert container_env(overlay, container)["HOME"] == "/tmp"  # caches under ~ land on the volume
        for path, mount in mounts.items():
            assert mount["name"] in volumes, path
            source = volumes[mount["name"]]
            assert {"emptyDir", "secret", "persistentVolumeClaim"} & set(source), (mount["name"], source)
            if "secret" in source:
                assert mount.get("readOnly"), path


def test_every_image_runs_as_the_unprivileged_tandem_user():
    package_users = {"prometheus.Dockerfile": "prometheus", "redis.Dockerfile": "redis"}  # Debian's own
    for path in sorted((REPO / "docker").glob("*.Dockerfile")):
        lines = [line.strip() for line in path.read_text().splitlines()]
        users = [line for line in lines if line.startswith("USER ")]
        assert users and users[-1] == f"USER {package_users.get(path.name, 'tandem')}", path.name
        if path.name not in package_users:
            assert any("useradd --uid 10001" in line for line in lines), path.name


# --- certificates: the tandem-certs Job -------------------------------------------------------------------------

TLS_SECRETS = {f"tandem-tls-{role}" for role in ROLES}


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_each_pod_mounts_only_its_own_roles_tls_secret_read_only(overlay):
    for role in ROLES:
        spec = pod_spec(overlay, role)
        secrets = {v["secret"]["secretName"] for v in spec["volumes"] if "secret" in v} & (
            TLS_SECRETS | {"tandem-pki-ca"}
        )
        assert secrets == {f"tandem-tls-{role}"}, role
        (volume,) = [v for v in spec["volumes"] if v.get("secret", {}).get("secretName") == f"tandem-tls-{role}"]
        assert volume["secret"]["defaultMode"] == 0o440 and spec["securityContext"]["fsGroup"] == 10001, role
        (container,) = spec["containers"]
        (mount,) = [m for m in container["volumeMounts"] if m["name"] == volume["name"]]
        assert mount == {"name": volume["name"], "mountPath": "/etc/tandem/tls", "readOnly": True}
        env = container_env(overlay, container)
        assert {env[f"TANDEM_GRPC_TLS_{k}"].rsplit("/", 1)[0] for k in ("CA", "CERT", "KEY")} != set()
        assert all(
            env[f"TANDEM_GRPC_TLS_{k}"].endswith(f)
            for k, f in (("CA", "/ca.crt"), ("CERT", "/tls.crt"), ("KEY", "/tls.key"))
        )
        assert "TANDEM_GRPC_INSECURE" not in env and env.get("TANDEM_GRPC_TLS_CLIENT_AUTH", "1") == "1", role


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_the_certs_job_is_hardened_and_may_touch_only_tandems_secrets(overlay):
    job = of_kind(overlay, "Job")["tandem-certs"]
    spec = job["spec"]["template"]["spec"]
    assert spec["securityContext"]["seccompProfile"]["type"] == "RuntimeDefault"
    (container,) = spec["containers"]
    sc = container["securityContext"]
    assert sc["runAsNonRoot"] and sc["readOnlyRootFilesystem"] and sc["capabilities"] == {"drop": ["ALL"]}
    assert container["command"] == ["python", "/opt/tandem/docker/k8s-certs.py"]
    assert (REPO / "docker" / "k8s-certs.py").is_file()
    assert {v["name"]: v for v in spec["volumes"]}["tmp"]["emptyDir"]["medium"] == "Memory"  # the CA key: no disk
    role = of_kind(overlay, "Role")["tandem-certs"]
    granted = {
        (verb, name)
        for rule in role["rules"]
        for verb in rule["verbs"]
        for name in rule.get("resourceNames", ["*"])
        if rule["resources"] == ["secrets"]
    }
    assert len(granted) == sum(len(r["verbs"]) * len(r.get("resourceNames", ["*"])) for r in role["rules"])
    assert granted == {("create", "*")} | {
        (v, n) for v in ("get", "update") for n in TLS_SECRETS | {"tandem-pki-ca", "tandem-redis-auth"}
    }
    assert spec["serviceAccountName"] == "tandem-certs"
    policies = list(of_kind(overlay, "NetworkPolicy").values())
    pod = Pod(job["spec"]["template"]["metadata"]["labels"], NAMESPACE, {})
    api_server = Pod({"component": "kube-apiserver"}, "kube-system", {"https": 6443})
    assert _allowed(policies, "Egress", pod, api_server, api_server, "https", 6443)
    for target in tandem_pods(overlay).values():  # and no tandem pod
        assert not any(_allowed(policies, "Egress", pod, target, target, n, p) for n, p in target.ports.items())


def test_the_job_makes_one_secret_per_role_with_only_that_roles_files(tmp_path):
    import importlib.util

    spec = importlib.util.spec_from_file_location("k8s_certs", REPO / "docker" / "k8s-certs.py")
    job = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(job)
    import os
    import sys
    from pathlib import Path

    bin_dir = Path(sys.executable).parent
    os.environ["PATH"] = f"{bin_dir}:{os.environ['PATH']}"  # the Job's `tandem` (the image's) is this venv's here
    pki_dir = job.init_pki(tmp_path)
    assert (pki_dir / "redis.password").stat().st_mode & 0o077 == 0
    bodies = {b["metadata"]["name"]: b for b in job.secret_bodies(pki_dir)}
    assert list(bodies)[-1] == "tandem-pki-ca"  # last: its presence means every role's Secret exists
    assert set(bodies) == TLS_SECRETS | {"tandem-pki-ca", "tandem-redis-auth"}
    password = bodies["tandem-redis-auth"]["stringData"]["redis.password"]
    assert len(password.strip()) == 48 and bodies["tandem-tls-gateway"]["stringData"]["redis.password"] == password
    for role in ROLES:
        body = bodies[f"tandem-tls-{role}"]
        worker = role in ("prefill", "decode")
        assert body["type"] == "kubernetes.io/tls"
        hasher = role != "planner"  # the gateway, router and workers key their block hashes with it
        assert set(body["stringData"]) == {"tls.crt", "tls.key", "ca.crt"} | (
            {"kv-signing.key"} if worker else set()
        ) | ({"kv-hash.secret"} if hasher else set()) | ({"redis.password"} if role == "gateway" else set())
        assert "PRIVATE KEY" in body["stringData"]["tls.key"] and body["metadata"]["labels"]["tandem.io/role"] == role
    assert "ca.key" in bodies["tandem-pki-ca"]["stringData"]
    secrets = {b["stringData"].get("kv-hash.secret") for b in bodies.values()} - {None}
    assert len(secrets) == 1 and len(bytes.fromhex(secrets.pop().strip())) == 32  # one secret, everywhere
    assert all("ca.key" not in b["stringData"] for n, b in bodies.items() if n != "tandem-pki-ca")


def test_a_deployment_from_before_the_hash_secret_and_redis_password_gets_them_where_they_are_read():
    import importlib.util
    from types import SimpleNamespace

    spec = importlib.util.spec_from_file_location("k8s_certs", REPO / "docker" / "k8s-certs.py")
    job = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(job)

    class Core:  # the Kubernetes API, as far as the Job uses it
        def __init__(self):
            self.store = {n: SimpleNamespace(data={"tls.crt": "x"}) for n in TLS_SECRETS | {"tandem-pki-ca"}}
            self.created = []

        def read_namespaced_secret(self, name, namespace):
            from kubernetes.client.exceptions import ApiException

            if name not in self.store:
                raise ApiException(status=404)
            return self.store[name]

        def replace_namespaced_secret(self, name, namespace, body):
            self.store[name] = body

        def create_namespaced_secret(self, namespace, body):
            self.created.append(body.metadata.name)
            self.store[body.metadata.name] = body

    core = Core()
    assert job.backfill_hash_secret(core, "tandem", core.store["tandem-pki-ca"]) == 0
    has = {n for n, s in core.store.items() if "kv-hash.secret" in s.data}
    assert has == {f"tandem-tls-{r}" for r in ("gateway", "router", "prefill", "decode")} | {"tandem-pki-ca"}
    assert len({core.store[n].data["kv-hash.secret"] for n in has}) == 1
    assert core.created == ["tandem-redis-auth"]  # and the Redis password, in the gateway's Secret too
    with_password = {n for n, s in core.store.items() if "redis.password" in s.data}
    assert with_password == {"tandem-tls-gateway", "tandem-redis-auth", "tandem-pki-ca"}
    assert len({core.store[n].data["redis.password"] for n in with_password}) == 1
    before = dict(core.store["tandem-tls-router"].data)
    job.backfill_hash_secret(core, "tandem", core.store["tandem-pki-ca"])  # a later run changes nothing
    assert core.store["tandem-tls-router"].data == before
