"""deploy/k8s/components/redis on top of the cpu overlay: it renders and validates, the gateways then use the shared
store at tandem-redis, the Redis pod is as hardened as the rest, and only the gateways reach it."""

import kubernetes_validate
import pytest

from deploy.k8s import render
from tests.unit.deploy.helpers import check_command
from tests.unit.deploy.kube import command, container_env, main_container, of_kind
from tests.unit.deploy.test_k8s_render import K8S_VERSIONS
from tests.unit.deploy.test_k8s_security import NAMESPACE, STRANGER, Pod, reaches, tandem_pods


@pytest.fixture(scope="module")
def overlay(tmp_path_factory):
    folder = tmp_path_factory.mktemp("with-redis")
    (folder / "tandem").symlink_to(render.REPO)
    mine = folder / "mine"
    mine.mkdir()
    (mine / "kustomization.yaml").write_text(
        "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\n"
        "resources:\n  - ../tandem/deploy/k8s/overlays/cpu\ncomponents:\n  - ../tandem/deploy/k8s/components/redis\n"
    )
    return mine


def test_it_renders_and_validates(overlay):
    for obj in [*of_kind(overlay, "Deployment").values(), *of_kind(overlay, "NetworkPolicy").values()]:
        for version in K8S_VERSIONS:
            kubernetes_validate.validate(obj, version, strict=True)
    assert "tandem-redis" in of_kind(overlay, "Service")


def test_the_gateways_share_the_store_at_tandem_redis(overlay, monkeypatch):
    container = main_container(overlay, "gateway")
    env = container_env(overlay, container)
    settings = check_command(command(container, env), env, monkeypatch)
    assert settings.response_store == "redis" and settings.redis_url == "redis://tandem-redis:6379/0"
    # the gateway's own Secret (tandem-tls-gateway, mounted at /etc/tandem/tls), here a stand-in file
    assert env["TANDEM_REDIS_PASSWORD_FILE"].endswith("/redis.password")
    assert settings.redis_password, "the gateway read no Redis password"
    [port] = of_kind(overlay, "Service")["tandem-redis"]["spec"]["ports"]
    assert port["port"] == 6379


def test_the_redis_pod_is_hardened(overlay):
    spec = of_kind(overlay, "Deployment")["tandem-redis"]["spec"]["template"]["spec"]
    (container,) = spec["containers"]
    sc = container["securityContext"]
    assert sc["runAsNonRoot"] and sc["runAsUser"] != 0 and sc["readOnlyRootFilesystem"]
    assert sc["capabilities"] == {"drop": ["ALL"]} and not sc["allowPrivilegeEscalation"]
    assert spec["securityContext"]["seccompProfile"]["type"] == "RuntimeDefault"
    assert spec["automountServiceAccountToken"] is False
    assert {m["mountPath"] for m in container["volumeMounts"]} == {"/data", "/tmp", "/etc/tandem/redis"}
    auth = {v["name"]: v for v in spec["volumes"]}["auth"]["secret"]
    assert auth["secretName"] == "tandem-redis-auth" and auth["defaultMode"] == 0o440
    assert "--requirepass" in " ".join(container["command"]) and "redis.password" in " ".join(container["command"])
    assert "REDISCLI_AUTH" in " ".join(container["readinessProbe"]["exec"]["command"])
    assert container["image"] == "tandem/redis:0.1.0"


def test_only_the_gateways_reach_redis(overlay):
    policies = list(of_kind(overlay, "NetworkPolicy").values())
    spec = of_kind(overlay, "Deployment")["tandem-redis"]["spec"]["template"]
    redis = Pod(spec["metadata"]["labels"], NAMESPACE, {"redis": 6379})
    pods = tandem_pods(overlay)
    for role, pod in pods.items():
        assert reaches(policies, pod, redis, "redis") == (role == "gateway"), role
        for name in pod.ports:  # and Redis reaches nobody
            assert not reaches(policies, redis, pod, name), (role, name)
    assert not reaches(policies, Pod(*STRANGER), redis, "redis")
