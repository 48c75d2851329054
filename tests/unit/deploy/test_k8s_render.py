"""deploy/k8s checked offline: every overlay renders with `kubectl kustomize` into its committed golden render, its
built-in kinds validate strictly against the API schemas of the oldest and newest Kubernetes versions supported, and
the Prometheus operator's kinds against their vendored definitions."""

import copy
from functools import cache
from pathlib import Path

import jsonschema
import kubernetes_validate
import pytest
import yaml

from deploy.k8s import render
from tests.unit.deploy.kube import OVERLAYS, deployment, objects, of_kind, rendered

# gRPC probes are GA from 1.27, a PDB's unhealthyPodEvictionPolicy from 1.31 (on by default since 1.27)
K8S_VERSIONS = ("1.30", "1.37")
CRDS = Path(__file__).parent / "crds"
MONITORING = "monitoring.coreos.com/v1"


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_each_overlay_renders_into_its_golden_file(overlay):
    golden = render.GOLDEN / f"{overlay}.yaml"
    assert golden.read_text() == rendered(overlay), f"{golden.name} is out of date: make k8s-golden"


def test_the_dashboards_configmap_holds_observabilitys_dashboards():
    assert render.out_of_date(render.dashboard_copies()) == [], "python deploy/k8s/render.py --update"
    assert sorted(render.DASHBOARDS_COPY.glob("*.json")) == sorted(render.dashboard_copies())
    configmap = of_kind("gpu-monitoring", "ConfigMap")["tandem-grafana-dashboards"]
    assert configmap["metadata"]["labels"]["grafana_dashboard"] == "1"  # what Grafana's sidecar looks for
    assert configmap["data"] == {p.name: p.read_text() for p in sorted(render.DASHBOARDS.glob("*.json"))}
    assert len(configmap["data"]) >= 4


def test_the_render_check_names_an_out_of_date_golden_file(tmp_path):
    stale = {tmp_path / "cpu.yaml": rendered("cpu")}
    assert render.out_of_date(stale) == [tmp_path / "cpu.yaml"]
    (tmp_path / "cpu.yaml").write_text(rendered("cpu"))
    assert render.out_of_date(stale) == []


@pytest.mark.parametrize("version", K8S_VERSIONS)
@pytest.mark.parametrize("overlay", OVERLAYS)
def test_built_in_kinds_validate_strictly(overlay, version):
    checked = 0
    for obj in objects(overlay):
        if obj["apiVersion"] != MONITORING:
            kubernetes_validate.validate(obj, version, strict=True)
            checked += 1
    assert checked >= 20


def test_strict_validation_catches_a_misspelt_field_and_a_wrong_type():
    misspelt = copy.deepcopy(deployment("gpu", "decode"))
    misspelt["spec"]["template"]["spec"]["containers"][0]["startupprobe"] = {"grpc": {"port": 50061}}
    with pytest.raises(kubernetes_validate.ValidationError, match="startupprobe"):
        kubernetes_validate.validate(misspelt, K8S_VERSIONS[0], strict=True)
    wrong = copy.deepcopy(deployment("gpu", "decode"))
    wrong["spec"]["template"]["spec"]["terminationGracePeriodSeconds"] = "90"
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(wrong, K8S_VERSIONS[-1], strict=True)


@cache
def crd_schema(kind: str) -> dict:
    """The vendored definition's v1 schema, made strict: a field the schema does not name is an error (the API
    server would drop it silently, so a misspelt `intervall` would never reach the operator)."""
    crd = yaml.safe_load((CRDS / f"monitoring.coreos.com_{kind.lower()}s.yaml").read_text())
    assert crd["spec"]["names"]["kind"] == kind
    (version,) = [v for v in crd["spec"]["versions"] if v["name"] == "v1"]
    return _strict(copy.deepcopy(version["schema"]["openAPIV3Schema"]))


def _strict(schema):
    if isinstance(schema, dict):
        if (
            "properties" in schema
            and "additionalProperties" not in schema
            and not schema.get("x-kubernetes-preserve-unknown-fields")
        ):
            schema["additionalProperties"] = False
        for value in schema.values():
            _strict(value)
    elif isinstance(schema, list):
        for value in schema:
            _strict(value)
    return schema


@pytest.mark.parametrize("kind", ["PodMonitor", "ServiceMonitor"])
def test_monitors_validate_against_their_vendored_definitions(kind):
    monitors = of_kind("gpu-monitoring", kind)
    assert monitors
    for monitor in monitors.values():
        jsonschema.validate(monitor, crd_schema(kind))


def test_the_definition_check_catches_a_misspelt_field_and_a_wrong_type():
    monitor = copy.deepcopy(of_kind("gpu-monitoring", "PodMonitor")["tandem-decode"])
    monitor["spec"]["podMetricsEndpoints"][0]["intervall"] = "5s"
    with pytest.raises(jsonschema.ValidationError, match="intervall"):
        jsonschema.validate(monitor, crd_schema("PodMonitor"))
    monitor = copy.deepcopy(of_kind("gpu-monitoring", "ServiceMonitor")["tandem-router"])
    monitor["spec"]["endpoints"][0]["interval"] = "5 seconds"
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(monitor, crd_schema("ServiceMonitor"))


def test_only_the_monitoring_overlay_needs_the_operators_definitions():
    for overlay in OVERLAYS:
        kinds = {o["apiVersion"] for o in objects(overlay)}
        assert (MONITORING in kinds) == (overlay == "gpu-monitoring"), overlay
