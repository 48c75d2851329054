"""The Kubernetes connector: the official client against kmock's in-process API emulator on loopback, serving the
worker Deployments of deploy/k8s as rendered. The test serves the scale subresource and drives status and pods
itself (the emulator sets no status and answers a GET /scale with the Deployment); every body the connector sends
is validated against the official schema, and every call it makes must be one the rendered Role allows."""

import asyncio
import copy
import logging

import kmock
import kubernetes_validate
import pytest
from kubernetes import client

from services.planner.connectors.kubernetes import API_CALLS, KubernetesConnector, KubernetesTarget, load_apis
from services.planner.factory import make_connector
from services.planner.types import ConnectorError, Replicas, WorkerRole
from tests.unit.deploy.helpers import check_command
from tests.unit.deploy.kube import command, container_env, main_container, of_kind
from tests.unit.deploy.test_k8s_render import K8S_VERSIONS  # the oldest and newest the manifests support

P, D = WorkerRole.PREFILL, WorkerRole.DECODE
OVERLAY = "gpu"
PLANNER_CONFIG = next(c["data"] for n, c in of_kind(OVERLAY, "ConfigMap").items() if n.startswith("tandem-planner-"))
DEPLOYMENTS = {
    P: PLANNER_CONFIG["TANDEM_PLANNER_K8S_PREFILL_DEPLOYMENT"],
    D: PLANNER_CONFIG["TANDEM_PLANNER_K8S_DECODE_DEPLOYMENT"],
}
RENDERED = {name: of_kind(OVERLAY, "Deployment")[name] for name in DEPLOYMENTS.values()}
(NS,) = {d["metadata"]["namespace"] for d in RENDERED.values()}


class Cluster:
    """The API server's side of the scale subresource, Deployment status and pods, as the test sets them."""

    def __init__(self, mock: kmock.KubernetesEmulator):
        self.mock = mock
        self.state: dict[str, dict] = {}  # name -> replicas, updated, ready, rv
        self.pods: dict[str, list[str]] = {}  # name -> pod phases
        self.bodies: list[dict] = []
        self.conflicts = 0  # answer the next N patches with 409
        mock["list v1/pods"] << self._list_pods

    def add(self, name: str, replicas: int, ready: int | None = None) -> None:
        ready = replicas if ready is None else ready
        self.state[name] = {"replicas": replicas, "updated": ready, "ready": ready, "rv": 1}
        self.pods[name] = ["Running"] * ready
        path = f"/apis/apps/v1/namespaces/{NS}/deployments/{name}/scale"
        self.mock[f"get {path}"] << (lambda req: self._scale(name))
        self.mock[f"patch {path}"] << (lambda req: self._patch(name, req))
        self._store(name)

    def status(self, name: str, updated: int, ready: int, pods: list[str] | None = None) -> None:
        self.state[name].update(updated=updated, ready=ready)
        self.pods[name] = pods if pods is not None else ["Running"] * ready
        self._store(name)

    def edit_by_hand(self, name: str, replicas: int) -> None:
        self.state[name]["replicas"] = replicas
        self.state[name]["rv"] += 1
        self._store(name)

    def _store(self, name: str) -> None:
        """The rendered Deployment as the API server holds it: the count, a resourceVersion, the status set."""
        s = self.state[name]
        stored = copy.deepcopy(RENDERED[name])
        stored["metadata"]["resourceVersion"] = str(s["rv"])
        stored["spec"]["replicas"] = s["replicas"]
        stored["status"] = {
            "replicas": max(s["replicas"], len(self.pods[name])),
            "updatedReplicas": s["updated"],
            "readyReplicas": s["ready"],
        }
        self.mock.objects["apps/v1/deployments", NS, name] = stored

    def _scale(self, name: str) -> dict:
        s = self.state[name]
        return {
            "apiVersion": "autoscaling/v1",
            "kind": "Scale",
            "metadata": {"name": name, "namespace": NS, "resourceVersion": str(s["rv"])},
            "spec": {"replicas": s["replicas"]},
            "status": {"replicas": s["ready"]},
        }

    def _patch(self, name: str, req) -> object:
        for version in K8S_VERSIONS:
            kubernetes_validate.validate(req.data, version, strict=True)  # raises: the request gets a 500
        assert req.headers["Content-Type"] == "application/merge-patch+json"
        self.bodies.append(req.data)
        s = self.state[name]
        stale = req.data["metadata"]["resourceVersion"] != str(s["rv"])
        if stale or self.conflicts:
            self.conflicts = max(self.conflicts - 1, 0)
            self._store(name)  # NOTE: the emulator already merged the body into its copy; put ours back
            return kmock.Response(status=409, payload={"kind": "Status", "code": 409, "reason": "Conflict"})
        s["replicas"], s["rv"] = req.data["spec"]["replicas"], s["rv"] + 1
        self._store(name)
        return self._scale(name)

    def _list_pods(self, req) -> dict:
        """Every worker pod the selector matches, each labelled as its Deployment's template labels it."""
        selector = dict(part.split("=") for part in req.params["labelSelector"].split(","))
        pods = [
            {
                "metadata": {
                    "name": f"{name}-{i}",
                    "namespace": NS,
                    "labels": RENDERED[name]["spec"]["template"]["metadata"]["labels"],
                },
                "status": {"phase": phase},
            }
            for name, phases in self.pods.items()
            for i, phase in enumerate(phases)
        ]
        return {
            "apiVersion": "v1",
            "kind": "PodList",
            "metadata": {},
            "items": [p for p in pods if selector.items() <= p["metadata"]["labels"].items()],
        }


@pytest.fixture
def cluster(kmock) -> Cluster:
    found = Cluster(kmock)
    found.add(DEPLOYMENTS[P], 1)
    found.add(DEPLOYMENTS[D], 2)
    return found


@pytest.fixture
def clock():
    return {"now": 1000.0}


def connector(kmock, clock, **kw) -> KubernetesConnector:
    api = client.ApiClient(client.Configuration(host=str(kmock.url).rstrip("/")))
    target = KubernetesTarget(NS, DEPLOYMENTS, **kw)
    return KubernetesConnector(target, client.AppsV1Api(api), client.CoreV1Api(api), lambda: clock["now"])


async def call(fn, *args):
    return await asyncio.to_thread(fn, *args)  # the client blocks; kmock answers on this loop


async def test_replicas_are_ready_only_when_desired_updated_and_ready_agree(kmock, cluster, clock):
    c = connector(kmock, clock)
    assert await call(c.replicas) == {P: Replicas(1), D: Replicas(2)}
    cluster.status("tandem-decode", updated=1, ready=2)  # a rollout: one pod still on the old template
    assert (await call(c.replicas))[D] == Replicas(ready=1, starting=1)


async def test_scaling_patches_the_scale_subresource_and_waits_for_ready(kmock, cluster, clock):
    c = connector(kmock, clock)
    await call(c.replicas)
    await call(c.scale, D, 4)
    assert cluster.bodies == [
        {
            "apiVersion": "autoscaling/v1",
            "kind": "Scale",
            "metadata": {"name": "tandem-decode", "namespace": NS, "resourceVersion": "1"},
            "spec": {"replicas": 4},
        }
    ]
    assert (await call(c.replicas))[D] == Replicas(ready=2, starting=2)
    cluster.status("tandem-decode", updated=4, ready=4)
    assert (await call(c.replicas))[D] == Replicas(ready=4)
    await call(c.scale, D, 4)
    assert len(cluster.bodies) == 1  # already there: nothing sent


async def test_no_scale_down_while_a_pod_is_pending(kmock, cluster, clock, caplog):
    c = connector(kmock, clock)
    await call(c.replicas)
    await call(c.scale, D, 3)
    cluster.status("tandem-decode", updated=3, ready=2, pods=["Running", "Running", "Pending"])
    with caplog.at_level(logging.INFO):
        await call(c.scale, D, 1)
    assert len(cluster.bodies) == 1 and cluster.state["tandem-decode"]["replicas"] == 3
    assert "still Pending" in caplog.text
    cluster.status("tandem-decode", updated=3, ready=3)
    await call(c.scale, D, 1)
    assert cluster.state["tandem-decode"]["replicas"] == 1


async def test_the_gpu_budget_is_never_exceeded(kmock, cluster, clock):
    c = connector(kmock, clock, gpus_per_replica=2, gpu_budget=10)  # prefill holds 1 x 2 GPUs
    await call(c.replicas)
    await call(c.scale, D, 8)
    assert cluster.state["tandem-decode"]["replicas"] == 4  # (10 - 2) / 2
    await call(c.scale, P, 5)
    assert cluster.state["tandem-prefill"]["replicas"] == 1  # the decode pool already holds the rest


async def test_a_count_changed_by_hand_is_held_off_then_adopted(kmock, cluster, clock, caplog):
    c = connector(kmock, clock, manual_hold_s=300)
    await call(c.replicas)
    cluster.edit_by_hand("tandem-decode", 5)
    cluster.status("tandem-decode", updated=5, ready=5)
    with caplog.at_level(logging.WARNING):
        replicas = await call(c.replicas)
    assert replicas[D] == Replicas(ready=5, is_held=True) and not replicas[P].is_held
    assert "tandem-decode was scaled by hand (5, the planner had set 2)" in caplog.text
    await call(c.scale, D, 2)
    assert cluster.bodies == [] and cluster.state["tandem-decode"]["replicas"] == 5  # it does not fight
    clock["now"] += 301
    assert (await call(c.replicas))[D] == Replicas(ready=5)
    await call(c.scale, D, 3)
    assert cluster.state["tandem-decode"]["replicas"] == 3


async def test_a_hand_edit_racing_a_patch_is_a_conflict_then_a_hold(kmock, cluster, clock):
    c = connector(kmock, clock)
    await call(c.replicas)
    cluster.conflicts = 1  # a concurrent change the 409 reports (the count itself unchanged)
    with pytest.raises(ConnectorError, match="409"):
        await call(c.scale, D, 3)
    await call(c.scale, D, 3)  # the next tick succeeds
    assert cluster.state["tandem-decode"]["replicas"] == 3
    cluster.conflicts = 1
    cluster.edit_by_hand("tandem-decode", 6)  # between the connector's read and its patch: see the 409
    await call(c.scale, D, 4)
    assert cluster.state["tandem-decode"]["replicas"] == 6 and (await call(c.replicas))[D].is_held


async def test_a_missing_deployment_is_a_404_connector_error(kmock, cluster, clock):
    api = client.ApiClient(client.Configuration(host=str(kmock.url).rstrip("/")))
    c = KubernetesConnector(
        KubernetesTarget(NS, {D: "no-such-deployment"}),
        client.AppsV1Api(api),
        client.CoreV1Api(api),
        lambda: clock["now"],
    )
    with pytest.raises(ConnectorError, match="not found") as failed:
        await call(c.replicas)
    assert failed.value.status == 404


def write_kubeconfig(kmock, path):
    path.write_text(f"""apiVersion: v1
kind: Config
clusters: [{{name: kmock, cluster: {{server: "{str(kmock.url).rstrip("/")}"}}}}]
users: [{{name: planner, user: {{token: test-token}}}}]
contexts: [{{name: kmock, context: {{cluster: kmock, user: planner, namespace: {NS}}}}}]
current-context: kmock
""")
    return path


async def test_without_a_cluster_the_client_is_configured_from_a_kubeconfig(kmock, cluster, tmp_path, monkeypatch):
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)  # not in a pod: no in-cluster configuration
    apps, _ = load_apis(str(write_kubeconfig(kmock, tmp_path / "config")))
    deployment = await call(apps.read_namespaced_deployment, "tandem-decode", NS)
    assert deployment.spec.replicas == 2
    assert kmock[-1].headers["Authorization"] == "Bearer test-token"


def calls(kmock) -> list[tuple[str, str, str, str | None]]:
    """Each request kmock saw as RBAC reads it: (API group, resource[/subresource], verb, object name or None)."""
    verbs = {"GET": "get", "PATCH": "patch"}
    found = []
    for request in kmock:
        parts = request.url.path.strip("/").split("/")  # api/v1 or apis/<group>/v1, namespaces/NS/<resource>/...
        at = parts.index("namespaces")
        assert parts[at + 1] == NS
        name_and_sub = parts[at + 3 :]
        verb = "list" if not name_and_sub and request.method == "GET" else verbs[str(request.method).split(".")[-1]]
        group = parts[1] if parts[0] == "apis" else ""
        found.append((group, "/".join([parts[at + 2], *name_and_sub[1:]]), verb, (name_and_sub or [None])[0]))
    return found


def is_allowed(rules: list[dict], group: str, resource: str, verb: str, name: str | None) -> bool:
    """RBAC's rule match: a rule with resourceNames allows only requests for one of those names (never a list)."""
    return any(
        group in r["apiGroups"]
        and resource in r["resources"]
        and verb in r["verbs"]
        and (not r.get("resourceNames") or name in r["resourceNames"])
        for r in rules
    )


async def test_the_calls_it_makes_are_exactly_the_ones_its_role_must_grant(kmock, cluster, clock):
    c = connector(kmock, clock, gpu_budget=16)
    await call(c.replicas)
    await call(c.scale, D, 4)
    cluster.status("tandem-decode", updated=4, ready=3, pods=["Running"] * 3 + ["Pending"])
    await call(c.scale, D, 2)  # refused while a pod is Pending: it had to list them
    assert {(resource, verb) for _, resource, verb, _ in calls(kmock)} == API_CALLS


def test_the_rule_check_refuses_what_the_role_does_not_grant():
    role = of_kind(OVERLAY, "Role")["tandem-planner"]  # (tandem-certs is the certificate Job's)
    assert is_allowed(role["rules"], "apps", "deployments/scale", "patch", "tandem-decode")
    assert not is_allowed(role["rules"], "apps", "deployments/scale", "patch", "tandem-gateway")
    assert not is_allowed(role["rules"], "apps", "deployments", "patch", "tandem-decode")
    assert not is_allowed(role["rules"], "apps", "deployments", "list", None)
    assert not is_allowed(role["rules"], "", "pods", "delete", "tandem-decode-0")


async def test_the_planner_as_deployed_scales_its_workers_within_its_role_and_gpu_budget(
    kmock, cluster, tmp_path, monkeypatch
):
    """The connector the rendered planner pod builds from its own settings (only pointed at kmock by a kubeconfig,
    where the pod would use its ServiceAccount): every call it makes is one the rendered Role allows."""
    container = main_container(OVERLAY, "planner")
    env = container_env(OVERLAY, container) | {
        "TANDEM_PLANNER_K8S_KUBECONFIG": str(write_kubeconfig(kmock, tmp_path / "config"))
    }
    settings = check_command(command(container, env), env, monkeypatch)
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    c = make_connector(settings)
    assert await call(c.replicas) == {P: Replicas(1), D: Replicas(2)}
    await call(c.scale, D, 20)
    budget = settings.k8s_gpu_budget // settings.k8s_gpus_per_replica
    assert budget > 0 and cluster.state["tandem-decode"]["replicas"] == budget - 1  # prefill holds one GPU
    cluster.status("tandem-decode", updated=budget - 1, ready=budget - 2, pods=["Running"] * (budget - 2) + ["Pending"])
    await call(c.scale, D, 2)
    assert cluster.state["tandem-decode"]["replicas"] == budget - 1  # a pod it added is still Pending
    role = of_kind(OVERLAY, "Role")["tandem-planner"]  # (tandem-certs is the certificate Job's)
    made = calls(kmock)
    assert {verb for *_, verb, _ in made} == {"get", "patch", "list"}
    assert [c for c in made if not is_allowed(role["rules"], *c)] == []
