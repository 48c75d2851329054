"""Mutual TLS in compose.yaml: the one-shot `certs` service (docker/compose-certs.sh, run here for real with
`tandem certs init`) fills one volume per role; each gRPC service mounts only its own role's volume, read-only,
and its TLS settings name the files there; the CA's key stays in a volume only `certs` mounts."""

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from cryptography import x509

from tests.unit.deploy.helpers import REPO, check_command, environment, load_compose

SERVICES = load_compose()["services"]
TLS_DIR = "/etc/tandem/tls"
GRPC_SERVICES = {
    name: s["command"][2]
    for name, s in SERVICES.items()
    if s.get("command", [])[:2] == ["tandem", "serve"] and s["command"][2] != "scaler"
}
ROLE_FILES = {
    "gateway": {"tls.crt", "tls.key", "ca.crt", "kv-hash.secret", "redis.password"},
    "router": {"tls.crt", "tls.key", "ca.crt", "kv-hash.secret"},
    "planner": {"tls.crt", "tls.key", "ca.crt"},
    "prefill": {"tls.crt", "tls.key", "ca.crt", "kv-signing.key", "kv-hash.secret"},
    "decode": {"tls.crt", "tls.key", "ca.crt", "kv-signing.key", "kv-hash.secret"},
}
HASHERS = ("gateway", "router", "prefill", "decode")  # whoever hashes tokens or tenants needs the hash secret


def _mounts(service: dict) -> dict[str, str]:
    """volume -> container path (with :ro kept in the path)."""
    return {v.split(":", 1)[0]: v.split(":", 1)[1] for v in service.get("volumes", []) if isinstance(v, str)}


def test_every_grpc_service_mounts_its_own_roles_volume_read_only_and_nothing_else():
    assert len(GRPC_SERVICES) >= 9  # router, gateway, planner and six worker services
    for name, role in GRPC_SERVICES.items():
        tls = {vol: path for vol, path in _mounts(SERVICES[name]).items() if vol.startswith(("tls-", "certs-"))}
        assert tls == {f"tls-{role}": f"{TLS_DIR}:ro"}, name
        assert SERVICES[name]["depends_on"]["certs"]["condition"] == "service_completed_successfully", name
    holders = [n for n, s in SERVICES.items() if "certs-ca" in _mounts(s)]
    assert holders == ["certs"]
    assert _mounts(SERVICES["certs"]) == {
        "certs-ca": "/pki/ca",
        "tls-redis": "/pki/redis",
        **{f"tls-{r}": f"/pki/{r}" for r in ROLE_FILES},
    }
    assert "TANDEM_GRPC_INSECURE" not in str(SERVICES)  # plaintext nowhere


def test_the_image_makes_every_volume_path_the_certs_service_writes_so_the_volume_takes_its_owner():
    # a fresh named volume copies the owner and mode of the image's directory at its mount point; a path the image
    # lacks gives a root-owned volume the certs service (user tandem) cannot write (compose up failed so once)
    dockerfile = (REPO / "docker" / "control-plane.Dockerfile").read_text()
    made = dockerfile.split("useradd", 1)[1].split("mkdir -p", 1)[1].split("&&", 1)[0].split()
    for path in _mounts(SERVICES["certs"]).values():
        assert path in made, path


@pytest.fixture(scope="module")
def pki(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("pki")
    (root / "ca").mkdir()
    _run_script(root)
    return root


@pytest.mark.parametrize("name", sorted(GRPC_SERVICES))
def test_each_service_runs_mutual_tls_with_the_files_of_its_volume(name, pki, monkeypatch):
    """The service's TLS settings, read by tandem's own code from the files the script made for its role: mutual
    TLS, so it may bind 0.0.0.0 without TANDEM_GRPC_INSECURE."""
    from services.common.tls import from_env

    role, env = GRPC_SERVICES[name], environment(SERVICES[name])
    check_command(SERVICES[name]["command"], env, monkeypatch)  # still parses
    files = {k: v for k, v in env.items() if v.startswith(TLS_DIR + "/")}
    assert {v.rsplit("/", 1)[1] for v in files.values()} == ROLE_FILES[role] - (
        {"kv-signing.key"} if role in ("gateway", "router", "planner") else set()
    ), name
    for k, v in files.items():
        monkeypatch.setenv(k, str(pki / role / v.rsplit("/", 1)[1]))
    tls = from_env()
    assert tls.is_mutual and tls.server_name == "tandem", name
    tls.check_bind("0.0.0.0:50051")  # raises for plaintext or TLS without client authentication
    if role in ("prefill", "decode"):
        assert env["TANDEM_KV_SIGNING_KEY_FILE"] == f"{TLS_DIR}/kv-signing.key"
    if role in HASHERS:  # tandem's own settings read the per-deployment secret from the role's volume
        from services.common.settings import env as setting

        assert env["TANDEM_KV_HASH_SECRET_FILE"] == f"{TLS_DIR}/kv-hash.secret", name
        monkeypatch.delenv("TANDEM_KV_HASH_SECRET", raising=False)
        assert setting("TANDEM_KV_HASH_SECRET", "") == (pki / "ca" / "kv-hash.secret").read_text().strip()


def test_the_certs_service_is_a_one_shot_everyone_waits_for():
    certs = SERVICES["certs"]
    assert certs["restart"] == "no" and certs["command"] == ["sh", "/opt/tandem/docker/compose-certs.sh"]
    assert certs["image"] == SERVICES["router"]["image"]  # tandem's own image: no pulled one
    for name in ("router", "prefill", "decode"):
        assert SERVICES[name]["depends_on"]["certs"]["condition"] == "service_completed_successfully", name


def _run_script(root: Path) -> None:
    env = {**os.environ, "PKI_ROOT": str(root), "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}
    if shutil.which("tandem", path=env["PATH"]) is None:
        pytest.fail("the tandem CLI is not installed beside this Python (make install)")
    done = subprocess.run(
        ["sh", str(REPO / "docker" / "compose-certs.sh")], env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr


def _spiffe(path: Path) -> str:
    cert = x509.load_pem_x509_certificate(path.read_bytes())
    [uri] = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value.get_values_for_type(
        x509.UniformResourceIdentifier
    )
    return uri


def test_the_script_gives_each_role_its_own_identity_and_keeps_the_ca(tmp_path):
    (tmp_path / "ca").mkdir()
    _run_script(tmp_path)
    for role, files in ROLE_FILES.items():
        folder = tmp_path / role
        assert {p.name for p in folder.iterdir()} == files, role  # never the CA's key, never another role's
        assert all((p.stat().st_mode & 0o777) == 0o600 for p in folder.iterdir()), role
        wide = role in ("prefill", "decode")  # any replica `--scale` starts holds the role-wide one
        assert _spiffe(folder / "tls.crt") == f"spiffe://tandem/{role}/{'*' if wide else role}"
        assert (folder / "ca.crt").read_bytes() == (tmp_path / "ca" / "ca.crt").read_bytes()
    assert (tmp_path / "ca" / "ca.key").is_file()
    assert (tmp_path / "prefill" / "kv-signing.key").read_text() == (tmp_path / "decode" / "kv-signing.key").read_text()
    ca, key = (tmp_path / "ca" / "ca.crt").read_bytes(), (tmp_path / "decode" / "kv-signing.key").read_text()
    password = (tmp_path / "ca" / "redis.password").read_text()
    assert len(password.strip()) == 48 and (tmp_path / "gateway" / "redis.password").read_text() == password
    assert {p.name for p in (tmp_path / "redis").iterdir()} == {"redis.password"}  # redis' volume: nothing else
    assert (tmp_path / "redis" / "redis.password").read_text() == password
    secret = (tmp_path / "ca" / "kv-hash.secret").read_text()
    assert len(bytes.fromhex(secret.strip())) == 32
    assert all((tmp_path / role / "kv-hash.secret").read_text() == secret for role in HASHERS)
    _run_script(tmp_path)  # a second `up` keeps the CA and the key: running services' certificates stay valid
    assert (tmp_path / "ca" / "ca.crt").read_bytes() == ca
    assert (tmp_path / "decode" / "kv-signing.key").read_text() == key
    assert (tmp_path / "gateway" / "kv-hash.secret").read_text() == secret  # and the block hashes stay comparable
    assert (tmp_path / "redis" / "redis.password").read_text() == password


def test_a_ca_volume_from_before_the_hash_secret_gets_one(tmp_path):
    (tmp_path / "ca").mkdir()
    _run_script(tmp_path)
    (tmp_path / "ca" / "kv-hash.secret").unlink()
    _run_script(tmp_path)
    password = (tmp_path / "ca" / "redis.password").read_text()
    assert len(password.strip()) == 48 and (tmp_path / "gateway" / "redis.password").read_text() == password
    assert {p.name for p in (tmp_path / "redis").iterdir()} == {"redis.password"}  # redis' volume: nothing else
    assert (tmp_path / "redis" / "redis.password").read_text() == password
    secret = (tmp_path / "ca" / "kv-hash.secret").read_text()
    assert len(bytes.fromhex(secret.strip())) == 32 and (tmp_path / "router" / "kv-hash.secret").read_text() == secret
