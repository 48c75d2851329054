"""The Kubernetes connector: scales the prefill and decode Deployments through their `scale` subresource with
the official client. A change counts as done only when desired = updated = ready replicas; it never scales down
while a pod is Pending, never asks for more GPUs than the budget, and leaves a count changed by hand alone for
`manual_hold_s` (logged, and reported as held). Blocking client calls; the service runs them off its loop."""

import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

from services.planner.types import ROLES, ConnectorError, Replicas, WorkerRole

log = logging.getLogger(__name__)
NAMESPACE_FILE = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")
# every (resource, verb) this connector calls, in its namespace: what the planner's Role must grant, and no more
API_CALLS = frozenset(
    {("deployments", "get"), ("deployments/scale", "get"), ("deployments/scale", "patch"), ("pods", "list")}
)


@dataclass(frozen=True, slots=True)
class KubernetesTarget:
    namespace: str
    deployments: Mapping[WorkerRole, str]
    gpus_per_replica: int = 1
    gpu_budget: int = 0  # 0: none
    manual_hold_s: float = 300.0


def load_apis(kubeconfig: str = ""):
    """(AppsV1Api, CoreV1Api) from in-cluster configuration, else the kubeconfig (the given file or default)."""
    from kubernetes import client, config  # NOTE: imported only by this connector

    try:
        if kubeconfig:
            raise config.ConfigException("a kubeconfig was named")
        config.load_incluster_config()
    except config.ConfigException:
        config.load_kube_config(config_file=kubeconfig or None)
    return client.AppsV1Api(), client.CoreV1Api()


def own_namespace(configured: str) -> str:
    if configured:
        return configured
    return NAMESPACE_FILE.read_text().strip() if NAMESPACE_FILE.is_file() else "default"


class KubernetesConnector:
    name = "kubernetes"

    def __init__(self, target: KubernetesTarget, apps, core, clock: Callable[[], float] = time.monotonic):
        self.target, self.apps, self.core, self.clock = target, apps, core, clock
        self._asked: dict[WorkerRole, int] = {}  # the count this planner last set (or found at start)
        self._held_until: dict[WorkerRole, float] = {}

    def replicas(self) -> Mapping[WorkerRole, Replicas]:
        return {role: self._replicas(role) for role in ROLES if role in self.target.deployments}

    def scale(self, role: WorkerRole, target: int) -> None:
        name = self.target.deployments[role]
        if self._is_held(role):
            log.info("not scaling %s: its count was changed by hand", name)
            return
        target = self._within_budget(role, target)
        scale = self._call(self.apps.read_namespaced_deployment_scale, name)
        current = scale.spec.replicas or 0
        if current != self._asked.get(role, current):
            return self._hold(role, current)
        if target < current and self._num_pending(role):
            log.info("not scaling %s down to %d: a pod it added is still Pending", name, target)
            return
        if target != current:
            self._patch(role, name, scale.metadata.resource_version, target)

    # -- reading -----------------------------------------------------------------------------
    def _replicas(self, role: WorkerRole) -> Replicas:
        deployment = self._call(self.apps.read_namespaced_deployment, self.target.deployments[role])
        spec, status = deployment.spec.replicas or 0, deployment.status
        updated, ready = (status.updated_replicas or 0), (status.ready_replicas or 0)
        if role not in self._asked:
            self._asked[role] = spec  # NOTE: what it finds at start is the planner's to change
        elif spec != self._asked[role] and not self._is_held(role):
            self._hold(role, spec)
        serving = min(updated, ready, spec)  # NOTE: done only when desired = updated = ready
        return Replicas(serving, spec - serving, max((status.replicas or 0) - spec, 0), self._is_held(role))

    def _num_pending(self, role: WorkerRole) -> int:
        deployment = self._call(self.apps.read_namespaced_deployment, self.target.deployments[role])
        labels = deployment.spec.selector.match_labels or {}
        selector = ",".join(f"{k}={v}" for k, v in sorted(labels.items()))
        pods = self._call(self.core.list_namespaced_pod, label_selector=selector)
        return sum(1 for p in pods.items if p.status.phase == "Pending" and not p.metadata.deletion_timestamp)

    # -- writing -----------------------------------------------------------------------------
    def _patch(self, role: WorkerRole, name: str, resource_version: str, target: int) -> None:
        body = {
            "apiVersion": "autoscaling/v1",
            "kind": "Scale",
            "metadata": {"name": name, "namespace": self.target.namespace, "resourceVersion": resource_version},
            "spec": {"replicas": target},
        }  # NOTE: the resourceVersion makes a concurrent change a 409
        try:
            self._call(
                self.apps.patch_namespaced_deployment_scale,
                name,
                body=body,
                _content_type="application/merge-patch+json",
            )
        except ConnectorError as exc:
            if exc.status != 409:
                raise
            current = self._call(self.apps.read_namespaced_deployment_scale, name).spec.replicas or 0
            if current != self._asked.get(role):
                return self._hold(role, current)
            raise ConnectorError(f"scaling {name}: changed concurrently (409); the next tick tries again") from None
        log.info("scaled deployment %s/%s to %d replicas", self.target.namespace, name, target)
        self._asked[role] = target

    def _within_budget(self, role: WorkerRole, target: int) -> int:
        t = self.target
        if not t.gpu_budget:
            return target
        others = sum(
            self._call(self.apps.read_namespaced_deployment_scale, t.deployments[r]).spec.replicas or 0
            for r in ROLES
            if r != role and r in t.deployments
        )
        most = max((t.gpu_budget - others * t.gpus_per_replica) // t.gpus_per_replica, 0)
        if target > most:
            log.warning("GPU budget %d: %s gets %d replicas, not %d", t.gpu_budget, t.deployments[role], most, target)
        return min(target, most)

    # -- hand edits --------------------------------------------------------------------------
    def _hold(self, role: WorkerRole, found: int) -> None:
        name = self.target.deployments[role]
        log.warning(
            "deployment %s was scaled by hand (%d, the planner had set %d): leaving it alone for %.0f s",
            name,
            found,
            self._asked.get(role, found),
            self.target.manual_hold_s,
        )
        self._held_until[role] = self.clock() + self.target.manual_hold_s
        self._asked[role] = found  # NOTE: once the hold ends, the planner starts from the operator's count

    def _is_held(self, role: WorkerRole) -> bool:
        return self.clock() < self._held_until.get(role, float("-inf"))

    def _call(self, method, *args, **kwargs):
        from kubernetes.client.exceptions import ApiException

        try:
            return method(*args, namespace=self.target.namespace, **kwargs)
        except ApiException as exc:
            what = "not found" if exc.status == 404 else f"{exc.status} {exc.reason}"
            raise ConnectorError(f"{method.__name__}{args}: {what}", status=exc.status) from None
