"""What the Kubernetes tests read: every overlay rendered once by kubectl (deploy/k8s/render.py), its objects by kind
and name, and a container's environment and command as the kubelet would build them (ConfigMaps, Secrets, the
downward API, $(VAR) references), so tandem's own parsers can read what a pod would run."""

import base64
import re
import tempfile
from functools import cache
from pathlib import Path

import yaml

from deploy.k8s import render

OVERLAYS = render.OVERLAYS
GPU_OVERLAYS = ("gpu", "trtllm", "gpu-monitoring")
WORKER_ROLES = ("prefill", "decode")
ROLES = ("gateway", "router", "planner", *WORKER_ROLES)
LABELS = (
    "app.kubernetes.io/name",
    "app.kubernetes.io/part-of",
    "app.kubernetes.io/component",
    "app.kubernetes.io/version",
    "tandem.io/role",
)
# what the downward API gives a pod of these tests
POD = {"metadata.name": "tandem-decode-5d8f7c9b6d-x2x7q", "metadata.namespace": "tandem", "status.podIP": "10.1.2.3"}
_REFERENCE = re.compile(r"\$\$|\$\((\w+)\)")
# the Secrets an operator makes before applying an overlay that does not render them (the README's commands)
OPERATOR_SECRETS = {"tandem-api-keys": {"keys": "sk-operator-1\nsk-operator-2\n"}}


@cache
def rendered(overlay: str | Path) -> str:
    return render.render(overlay)


@cache
def objects(overlay: str | Path) -> tuple[dict, ...]:
    return tuple(doc for doc in yaml.safe_load_all(rendered(overlay)) if doc)


def of_kind(overlay: str | Path, kind: str) -> dict[str, dict]:
    return {o["metadata"]["name"]: o for o in objects(overlay) if o["kind"] == kind}


def deployment(overlay: str, role: str) -> dict:
    return of_kind(overlay, "Deployment")[f"tandem-{role}"]


def pod_spec(overlay: str, role: str) -> dict:
    return deployment(overlay, role)["spec"]["template"]["spec"]


def main_container(overlay: str, role: str) -> dict:
    (container,) = pod_spec(overlay, role)["containers"]
    return container


def all_containers(spec: dict) -> list[dict]:
    return [*spec.get("initContainers", []), *spec["containers"]]


def expand(value: str, env: dict[str, str]) -> str:
    """The kubelet's $(VAR) expansion: a defined variable's value, $$ -> $, anything else left as written."""
    return _REFERENCE.sub(lambda m: "$" if m.group(0) == "$$" else env.get(m.group(1), m.group(0)), value)


def container_env(overlay: str | Path, container: dict, secrets: dict[str, dict[str, str]] | None = None) -> dict:
    """The container's environment: envFrom in order, then env (later wins, $(VAR) expanded). A Secret the render
    does not hold is the operator's: its value comes from `secrets`, else it is empty."""
    env: dict[str, str] = {}
    for source in container.get("envFrom", []):
        ref = source.get("configMapRef") or source["secretRef"]
        env.update(_data(overlay, "ConfigMap" if "configMapRef" in source else "Secret", ref["name"], secrets))
    for var in container.get("env", []):
        if "value" in var:
            env[var["name"]] = expand(var["value"], env)
            continue
        ref = var["valueFrom"]
        if "fieldRef" in ref:
            env[var["name"]] = POD[ref["fieldRef"]["fieldPath"]]
        elif "secretKeyRef" in ref:
            key = ref["secretKeyRef"]
            data = _data(overlay, "Secret", key["name"], secrets)
            if key["key"] in data or not key.get("optional"):
                env[var["name"]] = data.get(key["key"], "")
        else:
            key = ref["configMapKeyRef"]
            env[var["name"]] = _data(overlay, "ConfigMap", key["name"], secrets)[key["key"]]
    return _with_secret_files(overlay, container, env, secrets)


def _with_secret_files(overlay, container: dict, env: dict[str, str], secrets) -> dict[str, str]:
    """Each Secret volume the container mounts, written to a temporary folder (the operator's Secrets from
    `secrets`, else OPERATOR_SECRETS); a variable naming a file under its mountPath then names that copy."""
    volumes = {
        v["name"]: v
        for o in objects(overlay)
        if o["kind"] == "Deployment"
        for c in all_containers(o["spec"]["template"]["spec"])
        if c is container
        for v in o["spec"]["template"]["spec"].get("volumes", [])
    }
    for mount in container.get("volumeMounts", []):
        secret = volumes.get(mount["name"], {}).get("secret")
        if secret is None:
            continue
        data = _data(overlay, "Secret", secret["secretName"], secrets or OPERATOR_SECRETS)
        folder = _secret_folder(tuple(sorted(data.items())))
        prefix = mount["mountPath"].rstrip("/") + "/"
        env = {k: str(folder / v[len(prefix) :]) if v.startswith(prefix) else v for k, v in env.items()}
    return env


def command(container: dict, env: dict[str, str]) -> list[str]:
    return [expand(arg, env) for arg in [*container.get("command", []), *container.get("args", [])]]


def _data(overlay, kind: str, name: str, secrets) -> dict[str, str]:
    found = of_kind(overlay, kind).get(name)
    if found is None:
        assert kind == "Secret", f"{overlay}: {kind} {name} is referenced but not rendered"
        return (secrets or {}).get(name, {})
    if kind == "Secret":
        return {k: base64.b64decode(v).decode() for k, v in found.get("data", {}).items()}
    return dict(found.get("data", {}))


@cache
def _secret_folder(items: tuple[tuple[str, str], ...]) -> Path:
    folder = Path(tempfile.mkdtemp(prefix="tandem-secret-"))
    for key, value in items:
        (folder / key).write_text(value)
    return folder
