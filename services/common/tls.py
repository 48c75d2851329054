"""TLS and mutual TLS on every gRPC hop (prompts and KV cross hosts), from TANDEM_GRPC_TLS_* variables, and the rule
that a server without mTLS stays on loopback unless TANDEM_GRPC_INSECURE=1. One process, one certificate: it serves
with it and, under mTLS, presents it as a client too. Reads files and builds grpc credentials; opens no connection.
"""

import functools
import ipaddress
from dataclasses import dataclass
from pathlib import Path

import grpc

from services.common.settings import SettingsError, env

ENV_PREFIX = "TANDEM_GRPC_TLS_"


@dataclass(frozen=True, slots=True)
class GrpcTls:
    cert: str = ""  # PEM: this process's certificate chain (required to serve over TLS, and under mTLS)
    key: str = ""  # PEM: its private key
    ca: str = ""  # PEM: the CAs that sign peers' certificates (servers' for clients; clients' under mTLS)
    client_auth: bool = False  # mTLS: servers refuse a client without a certificate signed by `ca`
    server_name: str = ""  # the name a client checks on servers' certificates ("": the address's host)
    insecure: bool = False  # TANDEM_GRPC_INSECURE: may serve without client authentication on a non-loopback address
    reflection: bool = False  # TANDEM_GRPC_REFLECTION: serve gRPC reflection (off: it maps the API for a stranger)

    def __post_init__(self) -> None:
        if bool(self.cert) != bool(self.key):
            raise SettingsError(f"{ENV_PREFIX}CERT and {ENV_PREFIX}KEY go together; got only one")
        if self.cert and not self.ca:
            raise SettingsError(f"{ENV_PREFIX}CA is required with TLS: clients check servers against it")
        if self.client_auth and not (self.ca and self.cert):
            raise SettingsError(f"{ENV_PREFIX}CLIENT_AUTH needs {ENV_PREFIX}CA and this process's own CERT/KEY")
        for name in ("cert", "key", "ca"):
            path = getattr(self, name)
            if path and not Path(path).is_file():
                raise SettingsError(f"{ENV_PREFIX}{name.upper()}={path!r} is not a readable file")

    @property
    def is_enabled(self) -> bool:
        return bool(self.ca)

    @property
    def is_mutual(self) -> bool:
        """Clients must present a certificate from `ca`: the only mode that knows (and authorizes) its callers."""
        return self.client_auth and bool(self.cert)

    def check_bind(self, address: str) -> None:
        """Refuse to serve unauthenticated callers beyond this host unless the operator said so."""
        if self.is_mutual or self.insecure or is_loopback(address):
            return
        raise SettingsError(
            f"refusing to serve gRPC on {address} without mutual TLS: set {ENV_PREFIX}CERT, "
            f"{ENV_PREFIX}KEY and {ENV_PREFIX}CA (`tandem certs init`), bind 127.0.0.1, or set "
            f"TANDEM_GRPC_INSECURE=1 to accept any caller"
        )

    def server_credentials(self) -> grpc.ServerCredentials:
        if not self.cert:
            raise SettingsError(f"serving gRPC over TLS needs {ENV_PREFIX}CERT and {ENV_PREFIX}KEY")
        return grpc.ssl_server_credentials(
            [(_read(self.key), _read(self.cert))],
            root_certificates=_read(self.ca),
            require_client_auth=self.client_auth,
        )

    def channel_credentials(self) -> grpc.ChannelCredentials:
        # NOTE: a client offers its certificate whenever it has one; only a client_auth server insists on it
        key, chain = (_read(self.key), _read(self.cert)) if self.cert else (None, None)
        return grpc.ssl_channel_credentials(root_certificates=_read(self.ca), private_key=key, certificate_chain=chain)

    def channel_options(self) -> list[tuple[str, str]]:
        return [("grpc.ssl_target_name_override", self.server_name)] if self.server_name else []


def _read(path: str) -> bytes:
    return Path(path).read_bytes()


def is_loopback(address: str) -> bool:
    host = address.rsplit(":", 1)[0].strip("[]") if ":" in address else address
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:  # a host name, or "" / 0.0.0.0 / [::] (every interface)
        return False


def from_env() -> GrpcTls:
    cert = env(ENV_PREFIX + "CERT", "")
    # NOTE: a process with a certificate demands one from its clients unless told otherwise
    return GrpcTls(
        cert=cert,
        key=env(ENV_PREFIX + "KEY", ""),
        ca=env(ENV_PREFIX + "CA", ""),
        client_auth=env(ENV_PREFIX + "CLIENT_AUTH", bool(cert)),
        server_name=env(ENV_PREFIX + "SERVER_NAME", ""),
        insecure=env("TANDEM_GRPC_INSECURE", False),
        reflection=env("TANDEM_GRPC_REFLECTION", False),
    )


@functools.cache
def process_tls() -> GrpcTls:
    """This process's TLS settings, read once; raises SettingsError for a bad one (services check it at start)."""
    return from_env()
