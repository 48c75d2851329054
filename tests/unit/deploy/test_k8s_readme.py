"""deploy/k8s/README.md's own overlay (registry, model, replica bounds, SLOs) renders as it says: the images renamed,
the settings merged, and every pod still valid and runnable by tandem's parsers."""

import re

import kubernetes_validate
import yaml

from deploy.k8s import render
from tests.unit.deploy.helpers import check_command
from tests.unit.deploy.kube import ROLES, all_containers, command, container_env, main_container, of_kind, pod_spec
from tests.unit.deploy.test_k8s_render import K8S_VERSIONS

REGISTRY = "registry.example.com/tandem/"


def readme_overlay(tmp_path):
    text = (render.K8S / "README.md").read_text()
    block = re.search(r"`my-tandem/kustomization\.yaml`:\n\n```yaml\n(.*?)```", text, re.S).group(1)
    assert yaml.safe_load(block)["resources"] == ["../tandem/deploy/k8s/overlays/gpu"]
    (tmp_path / "tandem").symlink_to(render.REPO)  # the checkout beside the operator's overlay, as the README has it
    folder = tmp_path / "my-tandem"
    folder.mkdir()
    (folder / "kustomization.yaml").write_text(block)
    return folder


def test_the_readmes_overlay_renames_the_images_and_merges_the_settings(tmp_path, monkeypatch):
    overlay = readme_overlay(tmp_path)
    for role in ROLES:
        for container in all_containers(pod_spec(overlay, role)):
            assert container["image"].startswith(REGISTRY), (role, container["image"])
    models = {}
    for role in ROLES:
        container = main_container(overlay, role)
        env = container_env(overlay, container)
        models[role] = env["TANDEM_MODEL_ID"]
        settings = check_command(command(container, env), env, monkeypatch)
        if role == "planner":
            assert (settings.min_decode, settings.max_decode, settings.max_prefill, settings.k8s_gpu_budget) == (
                2,
                6,
                2,
                8,
            )
            assert settings.max_prefill + settings.max_decode <= settings.k8s_gpu_budget
    assert set(models.values()) == {"meta-llama/Llama-3.1-8B-Instruct"}
    for obj in of_kind(overlay, "Deployment").values():
        kubernetes_validate.validate(obj, K8S_VERSIONS[-1], strict=True)
