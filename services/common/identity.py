"""Service identities: the SPIFFE-style SAN URI `spiffe://tandem/<role>/<id>` a certificate carries, and reading the
verified peer's identity from a gRPC call's auth context. Pure apart from parsing certificates; it decides nothing
about who may call what (services/common/authz.py does)."""

import functools
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from cryptography import x509

TRUST_DOMAIN = "tandem"
ROLES = ("gateway", "router", "prefill", "decode", "planner", "operator")
WORKER_ROLES = ("prefill", "decode")
ANY_ID = "*"  # a role-wide certificate: replicas whose ids nobody knows in advance (a scaler starts them)
_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")


class IdentityError(ValueError):
    """A role or id a certificate cannot carry."""


@dataclass(frozen=True, slots=True)
class Identity:
    role: str
    id: str

    def __post_init__(self) -> None:
        if self.role not in ROLES:
            raise IdentityError(f"role must be one of {', '.join(ROLES)}, got {self.role!r}")
        if self.id != ANY_ID and not _ID.match(self.id):
            raise IdentityError(f"id {self.id!r} must be 1-128 letters, digits, '.', '_' or '-' (or {ANY_ID!r})")

    @property
    def uri(self) -> str:
        return f"spiffe://{TRUST_DOMAIN}/{self.role}/{self.id}"

    @property
    def is_role_wide(self) -> bool:
        return self.id == ANY_ID

    @property
    def file_name(self) -> str:
        """The directory its files live in (tandem/certs): the id, or `<role>-any` for a role-wide one."""
        return f"{self.role}-any" if self.is_role_wide else self.id

    def may_act_as(self, worker_id: str) -> bool:
        """Whether it may register, heartbeat or deregister `worker_id` (a role-wide one may use any id)."""
        return self.role in WORKER_ROLES and (self.is_role_wide or self.id == worker_id)

    def __str__(self) -> str:
        return self.uri


def parse_uri(uri: str) -> Identity | None:
    """The identity a SAN URI names; None for anything that is not `spiffe://tandem/<role>/<id>`."""
    prefix = f"spiffe://{TRUST_DOMAIN}/"
    if not uri.startswith(prefix):
        return None
    parts = uri[len(prefix) :].split("/")
    if len(parts) != 2:
        return None
    try:
        return Identity(*parts)
    except IdentityError:
        return None


def identity_of_cert(pem: bytes) -> Identity | None:
    """The one tandem identity in a certificate's SAN URIs; None when it has none, or more than one."""
    return _identity_of_cert(bytes(pem))


@functools.lru_cache(maxsize=256)  # NOTE: a peer presents the same certificate on every call of a connection
def _identity_of_cert(pem: bytes) -> Identity | None:
    try:
        cert = x509.load_pem_x509_certificate(pem)
        uris = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value.get_values_for_type(
            x509.UniformResourceIdentifier
        )
    except (ValueError, x509.ExtensionNotFound):
        return None
    found = {ident for ident in map(parse_uri, uris) if ident is not None}
    return found.pop() if len(found) == 1 else None


def identity_of_auth_context(auth_context: Mapping[str, Sequence[bytes]]) -> Identity | None:
    """The verified peer's identity from grpc's `context.auth_context()`; None without a client certificate.
    NOTE: gRPC puts a peer certificate here only after the handshake verified it against the server's CA."""
    pems = auth_context.get("x509_pem_cert") or []
    return identity_of_cert(pems[0]) if pems else None


def describe_peer(identity: Identity | None) -> str:
    return identity.uri if identity is not None else "no tandem certificate"
