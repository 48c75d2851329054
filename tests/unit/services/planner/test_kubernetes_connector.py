"""The Kubernetes connector: the official client against kmock's in-process API emulator on loopback. The test
serves the scale subresource and drives status and pods itself (the emulator sets no status and answers a
GET /scale with the Deployment); every body the connector sends is validated against the official schema."""
import asyncio
import logging

import kmock
import kubernetes_validate
import pytest
from kubernetes import client

from services.planner.connectors.kubernetes import API_CALLS, KubernetesConnector, KubernetesTarget, load_apis
from services.planner.types import ConnectorError, Replicas, WorkerRole

P, D = WorkerRole.PREFILL, WorkerRole.DECODE
NS = "tandem"
DEPLOYMENTS = {P: "tandem-prefill", D: "tandem-decode"}
K8S_VERSIONS = ("1.30", "1.37")  # the oldest and newest the manifests support


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
        s = self.state[name]
        labels = {"app.kubernetes.io/name": name, "tandem.io/role": name.split("-")[-1]}
        self.mock.objects["apps/v1/deployments", NS, name] = {
            "apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": {"name": name, "namespace": NS, "resourceVersion": str(s["rv"])},
            "spec": {"replicas": s["replicas"], "selector": {"matchLabels": labels},
                     "template": {"metadata": {"labels": labels},
                                  "spec": {"containers": [{"name": "worker", "image": "tandem/worker:1"}]}}},
            "status": {"replicas": max(s["replicas"], len(self.pods[name])), "updatedReplicas": s["updated"],
                       "readyReplicas": s["ready"]}}

    def _scale(self, name: str) -> dict:
        s = self.state[name]
        return {"apiVersion": "autoscaling/v1", "kind": "Scale",
                "metadata": {"name": name, "namespace": NS, "resourceVersion": str(s["rv"])},
                "spec": {"replicas": s["replicas"]}, "status": {"replicas": s["ready"]}}

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
        selector = dict(part.split("=") for part in req.params["labelSelector"].split(","))
        name = selector["app.kubernetes.io/name"]
        assert selector == {"app.kubernetes.io/name": name, "tandem.io/role": name.split("-")[-1]}
        return {"apiVersion": "v1", "kind": "PodList", "metadata": {},
                "items": [{"metadata": {"name": f"{name}-{i}", "namespace": NS}, "status": {"phase": phase}}
                          for i, phase in enumerate(self.pods.get(name, []))]}


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
    assert cluster.bodies == [{"apiVersion": "autoscaling/v1", "kind": "Scale",
                               "metadata": {"name": "tandem-decode", "namespace": NS, "resourceVersion": "1"},
                               "spec": {"replicas": 4}}]
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
    c = KubernetesConnector(KubernetesTarget(NS, {D: "no-such-deployment"}), client.AppsV1Api(api),
                            client.CoreV1Api(api), lambda: clock["now"])
    with pytest.raises(ConnectorError, match="not found") as failed:
        await call(c.replicas)
    assert failed.value.status == 404


async def test_without_a_cluster_the_client_is_configured_from_a_kubeconfig(kmock, cluster, tmp_path, monkeypatch):
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)  # not in a pod: no in-cluster configuration
    kubeconfig = tmp_path / "config"
    kubeconfig.write_text(f"""apiVersion: v1
kind: Config
clusters: [{{name: kmock, cluster: {{server: "{str(kmock.url).rstrip('/')}"}}}}]
users: [{{name: planner, user: {{token: test-token}}}}]
contexts: [{{name: kmock, context: {{cluster: kmock, user: planner, namespace: {NS}}}}}]
current-context: kmock
""")
    apps, _ = load_apis(str(kubeconfig))
    deployment = await call(apps.read_namespaced_deployment, "tandem-decode", NS)
    assert deployment.spec.replicas == 2
    assert kmock[-1].headers["Authorization"] == "Bearer test-token"


async def test_the_calls_it_makes_are_exactly_the_ones_its_role_must_grant(kmock, cluster, clock):
    c = connector(kmock, clock, gpu_budget=16)
    await call(c.replicas)
    await call(c.scale, D, 4)
    cluster.status("tandem-decode", updated=4, ready=3, pods=["Running"] * 3 + ["Pending"])
    await call(c.scale, D, 2)  # refused while a pod is Pending: it had to list them
    verbs = {"GET": "get", "PATCH": "patch"}
    seen = set()
    for request in kmock:
        parts = request.url.path.strip("/").split("/")  # .../namespaces/NS/<resource>[/<name>[/<sub>]]
        resource = parts[parts.index("namespaces") + 2]
        assert parts[parts.index("namespaces") + 1] == NS
        name_and_sub = parts[parts.index("namespaces") + 3:]
        verb = "list" if not name_and_sub and request.method == "GET" else verbs[str(request.method).split(".")[-1]]
        seen.add(("/".join([resource, *name_and_sub[1:]]), verb))
    assert seen == API_CALLS
