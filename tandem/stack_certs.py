"""`tandem up`'s mutual TLS: an ephemeral CA (one per launcher process, made at its first stack), one certificate
per child named by its role and id, a KV signing key per stack, and the operator identity the launcher itself dials
with. Files only; the launcher decides what to start (TANDEM_GRPC_INSECURE=1: none of this, plaintext)."""

import os
import shutil
import threading
from pathlib import Path

from services.common import tls
from services.common.identity import Identity
from tandem.certs import pki

INSECURE_ENV = "TANDEM_GRPC_INSECURE"
KV_KEY_ENV = "TANDEM_KV_SIGNING_KEY_FILE"
TLS_ENV = (
    "TANDEM_GRPC_TLS_CA",
    "TANDEM_GRPC_TLS_CERT",
    "TANDEM_GRPC_TLS_KEY",
    "TANDEM_GRPC_TLS_CLIENT_AUTH",
    "TANDEM_GRPC_TLS_SERVER_NAME",
)
_ROLES = {"router": "router", "prefill": "prefill", "decode": "decode", "gateway": "gateway", "planner": "planner"}
_LEAF_DAYS = 7  # NOTE: a new CA every start; a week covers any stack's life


def is_insecure(extra_env: dict[str, str]) -> bool:
    raw = extra_env.get(INSECURE_ENV, os.environ.get(INSECURE_ENV, ""))
    return raw.lower() in ("1", "true", "yes", "on")


def identity_for(child_name: str) -> Identity | None:
    """The identity of a child of `tandem up` ("decode-3" is decode/decode-3); None for one that is not a tandem
    service (Prometheus)."""
    role = _ROLES.get(child_name.split("-")[0])
    return Identity(role, child_name) if role else None


class _Operator:
    """The launcher process dials its stacks as `operator` (readiness probes, tests, `tandem worker drain` it
    runs): TANDEM_GRPC_TLS_* in its own environment while at least one stack runs, restored after the last."""

    def __init__(self):
        self._lock = threading.Lock()
        self._count = 0
        self._saved: dict[str, str | None] = {}
        self.authority: pki.Authority | None = None

    def authority_for_process(self) -> pki.Authority:
        with self._lock:
            if self.authority is None:
                self.authority = pki.new_authority("tandem-up-ephemeral-ca", days=_LEAF_DAYS)
            return self.authority

    def acquire(self, files: pki.IdentityFiles) -> None:
        with self._lock:
            self._count += 1
            if self._count == 1:
                self._saved = {name: os.environ.get(name) for name in TLS_ENV}
                for name in TLS_ENV:
                    os.environ.pop(name, None)
                os.environ.update(files.env())
                tls.process_tls.cache_clear()

    def release(self) -> None:
        with self._lock:
            self._count -= 1
            if self._count == 0:
                for name, value in self._saved.items():
                    if value is None:
                        os.environ.pop(name, None)
                    else:
                        os.environ[name] = value
                tls.process_tls.cache_clear()


OPERATOR = _Operator()


class StackPki:
    """One stack's certificate directory (made afresh), its children's environments and its operator."""

    def __init__(self, directory: Path):
        shutil.rmtree(directory, ignore_errors=True)
        self.directory = pki.private_dir(directory)
        self.authority = OPERATOR.authority_for_process()
        pki.write_private(directory / pki.CA_CERT, self.authority.cert_pem)
        self.kv_key = pki.write_kv_signing_key(directory)
        self.operator = self.issue(Identity("operator", "operator"))
        self._active = False

    def issue(self, identity: Identity) -> pki.IdentityFiles:
        return pki.write_identity(self.directory, self.authority, identity, _LEAF_DAYS)

    def child_env(self, child_name: str) -> dict[str, str]:
        """TANDEM_GRPC_TLS_* of the child's own identity (issued on first use) and the stack's KV signing key."""
        identity = identity_for(child_name)
        if identity is None:
            return {}
        files = pki.IdentityFiles(identity, self.directory / identity.file_name)
        if not files.cert.exists():
            files = self.issue(identity)
        return {**files.env(), "TANDEM_GRPC_TLS_SERVER_NAME": "", KV_KEY_ENV: str(self.kv_key)}

    def tls_of(self, identity: Identity) -> tls.GrpcTls:
        """Client settings holding `identity` (issued now unless a child already holds it)."""
        files = pki.IdentityFiles(identity, self.directory / identity.file_name)
        if not files.cert.exists():
            files = self.issue(identity)
        return _client_tls(files)

    def activate(self) -> None:
        if not self._active:
            self._active = True
            OPERATOR.acquire(self.operator)

    def deactivate(self) -> None:
        if self._active:
            self._active = False
            OPERATOR.release()


def operator_tls(pki_dir: Path) -> tls.GrpcTls:
    """The operator identity of a `tandem up` running elsewhere (another process): its PKI directory's."""
    return _client_tls(pki.IdentityFiles(Identity("operator", "operator"), pki_dir / "operator"))


def _client_tls(files: pki.IdentityFiles) -> tls.GrpcTls:
    return tls.GrpcTls(cert=str(files.cert), key=str(files.key), ca=str(files.ca), client_auth=True)
