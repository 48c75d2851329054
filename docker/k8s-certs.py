"""deploy/k8s's `tandem-certs` Job: on its first run, `tandem certs init` (a CA, one certificate per role, role-wide
for the prefill and decode Deployments, the KV signing key, the KV hash secret) and one Secret per role holding only
that role's files; later runs find the CA's Secret and change nothing but a missing hash secret. Talks to the Kubernetes API only to create those Secrets."""
import logging
import os
import subprocess
import sys
import tempfile
from pathlib import Path

log = logging.getLogger("tandem.k8s-certs")
CA_SECRET = "tandem-pki-ca"
# role -> the identity directory `tandem certs init` writes for it
IDENTITIES = {"gateway": "gateway", "router": "router", "planner": "planner", "prefill": "prefill-any",
              "decode": "decode-any"}
WORKERS = ("prefill", "decode")
HASHERS = ("gateway", "router", "prefill", "decode")  # whoever hashes tokens or tenants: the KV hash secret
HASH_SECRET = "kv-hash.secret"


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
        bodies.append(_secret(role_secret_name(role), "kubernetes.io/tls", files, role))
    ca = {name: (pki / name).read_text() for name in ("ca.crt", "ca.key", "kv-signing.key", HASH_SECRET)}
    bodies.append(_secret(CA_SECRET, "Opaque", ca, "certs"))
    return bodies


def _secret(name: str, kind: str, files: dict[str, str], role: str) -> dict:
    labels = {"app.kubernetes.io/part-of": "tandem", "app.kubernetes.io/component": "certs", "tandem.io/role": role}
    return {"apiVersion": "v1", "kind": "Secret", "type": kind, "metadata": {"name": name, "labels": labels},
            "stringData": files}


def init_pki(folder: Path) -> Path:
    pki = folder / "pki"
    subprocess.run(["tandem", "certs", "init", str(pki), "--routers", "1", "--prefill", "0", "--decode", "1",
                    "--role-wide", "prefill", "--role-wide", "decode"], check=True, stdout=subprocess.DEVNULL)
    return pki


def backfill_hash_secret(core, namespace: str, ca) -> int:
    """A deployment made before the KV hash secret existed: one secret, added to the CA's Secret and to every
    hashing role's (pods pick it up at their next restart; until then they hash as before)."""
    if HASH_SECRET in (ca.data or {}):
        return 0
    import base64
    import secrets

    encoded = base64.b64encode((secrets.token_hex(32) + "\n").encode()).decode()
    for name in [role_secret_name(role) for role in HASHERS] + [CA_SECRET]:  # NOTE: the CA's last, as at creation
        secret = core.read_namespaced_secret(name, namespace)
        secret.data = {**(secret.data or {}), HASH_SECRET: encoded}
        core.replace_namespaced_secret(name, namespace, secret)
        log.info("added %s to %s", HASH_SECRET, name)
    return 0


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
