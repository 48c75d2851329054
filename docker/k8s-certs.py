"""deploy/k8s's `tandem-certs` Job: on its first run, `tandem certs init` (a CA, one certificate per role, role-wide
for the prefill and decode Deployments, the KV signing key, the KV hash secret) and one Secret per role holding only
that role's files, and the Redis password's Secret; later runs find the CA's Secret and add only what an older run did
not make. Talks to the Kubernetes API only about those Secrets."""

import logging
import os
import subprocess
import sys
import tempfile
from pathlib import Path

log = logging.getLogger("tandem.k8s-certs")
CA_SECRET = "tandem-pki-ca"
# role -> the identity directory `tandem certs init` writes for it
IDENTITIES = {
    "gateway": "gateway",
    "router": "router",
    "planner": "planner",
    "prefill": "prefill-any",
    "decode": "decode-any",
}
WORKERS = ("prefill", "decode")
HASHERS = ("gateway", "router", "prefill", "decode")  # whoever hashes tokens or tenants: the KV hash secret
HASH_SECRET = "kv-hash.secret"
REDIS_SECRET, REDIS_PASSWORD = "tandem-redis-auth", "redis.password"  # components/redis' requirepass, and the gateway's


def role_secret_name(role: str) -> str:
    return f"tandem-tls-{role}"


def secret_bodies(pki: Path) -> list[dict]:
    """Every Secret to create, the role ones first and the CA's last (its presence means: all done)."""
    bodies = []
    for role, identity in IDENTITIES.items():
        files = {name: (pki / identity / name).read_text() for name in ("tls.crt", "tls.key", "ca.crt")}
        if role in WORKERS:
            files["kv-signing.key"] = (pki / "kv-signing.key").read_text()
        if role in HASHERS:
            files[HASH_SECRET] = (pki / HASH_SECRET).read_text()
        if role == "gateway":
            files[REDIS_PASSWORD] = (pki / REDIS_PASSWORD).read_text()
        bodies.append(_secret(role_secret_name(role), "kubernetes.io/tls", files, role))
    bodies.append(_secret(REDIS_SECRET, "Opaque", {REDIS_PASSWORD: (pki / REDIS_PASSWORD).read_text()}, "redis"))
    ca = {
        name: (pki / name).read_text() for name in ("ca.crt", "ca.key", "kv-signing.key", HASH_SECRET, REDIS_PASSWORD)
    }
    bodies.append(_secret(CA_SECRET, "Opaque", ca, "certs"))
    return bodies


def _secret(name: str, kind: str, files: dict[str, str], role: str) -> dict:
    labels = {"app.kubernetes.io/part-of": "tandem", "app.kubernetes.io/component": "certs", "tandem.io/role": role}
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "type": kind,
        "metadata": {"name": name, "labels": labels},
        "stringData": files,
    }


def init_pki(folder: Path) -> Path:
    pki = folder / "pki"
    subprocess.run(
        [
            "tandem",
            "certs",
            "init",
            str(pki),
            "--routers",
            "1",
            "--prefill",
            "0",
            "--decode",
            "1",
            "--role-wide",
            "prefill",
            "--role-wide",
            "decode",
        ],
        check=True,
        stdout=subprocess.DEVNULL,
    )
    _write_private(pki / REDIS_PASSWORD, _new_secret(24))
    return pki


def _new_secret(num_bytes: int) -> str:
    import secrets

    return secrets.token_hex(num_bytes) + "\n"


def _write_private(path: Path, text: str) -> None:
    path.touch(mode=0o600)
    path.write_text(text)


def backfill_hash_secret(core, namespace: str, ca) -> int:
    """A deployment made before the KV hash secret (or the Redis password) existed: one new secret, added to the
    Secrets that hold it and to the CA's last (pods pick it up at their next restart; until then they run as before)."""
    import base64

    has = set(ca.data or {})
    for key, num_bytes, holders in (
        (HASH_SECRET, 32, [role_secret_name(role) for role in HASHERS]),
        (REDIS_PASSWORD, 24, [role_secret_name("gateway"), REDIS_SECRET]),
    ):
        if key in has:
            continue
        encoded = base64.b64encode(_new_secret(num_bytes).encode()).decode()
        for name in [*holders, CA_SECRET]:
            _add_key(core, namespace, name, key, encoded)
    return 0


def _add_key(core, namespace: str, name: str, key: str, encoded: str) -> None:
    from kubernetes.client import V1ObjectMeta, V1Secret
    from kubernetes.client.exceptions import ApiException

    try:
        secret = core.read_namespaced_secret(name, namespace)
    except ApiException as exc:
        if exc.status != 404:
            raise
        body = V1Secret(
            metadata=V1ObjectMeta(name=name, labels={"app.kubernetes.io/part-of": "tandem"}),
            type="Opaque",
            data={key: encoded},
        )
        core.create_namespaced_secret(namespace, body)
        log.info("created %s", name)
        return
    secret.data = {**(secret.data or {}), key: encoded}
    core.replace_namespaced_secret(name, namespace, secret)
    log.info("added %s to %s", key, name)


def main() -> int:
    from kubernetes import client, config
    from kubernetes.client.exceptions import ApiException

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    namespace = os.environ["POD_NAMESPACE"]
    config.load_incluster_config()
    core = client.CoreV1Api()
    try:
        ca = core.read_namespaced_secret(CA_SECRET, namespace)
        log.info("%s exists: the certificates are made", CA_SECRET)
        return backfill_hash_secret(core, namespace, ca)
    except ApiException as exc:
        if exc.status != 404:
            raise
    with tempfile.TemporaryDirectory(dir=os.environ.get("TMPDIR")) as folder:
        for body in secret_bodies(init_pki(Path(folder))):
            name = body["metadata"]["name"]
            try:
                core.create_namespaced_secret(namespace, body)
            except ApiException as exc:
                if exc.status != 409:
                    raise
                core.replace_namespaced_secret(name, namespace, body)  # a run that died half-way
            log.info("created %s", name)
    return 0


if __name__ == "__main__":
    sys.exit(main())
