"""A deployment's certificates: one CA, and per identity a directory holding tls.crt, tls.key and ca.crt (the names
a Kubernetes TLS Secret uses), plus the shared KV signing key. Writes files 0600 in 0700 directories; opens no
connection and reads no environment (tandem/certs/cli.py and the launcher decide where and what)."""

import datetime
import ipaddress
import os
import secrets
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from services.common.identity import Identity, IdentityError, identity_of_cert

CA_CERT, CA_KEY, KV_SIGNING_KEY = "ca.crt", "ca.key", "kv-signing.key"
KV_HASH_SECRET = "kv-hash.secret"  # TANDEM_KV_HASH_SECRET_FILE: keys the block hashes (gateway, router, workers)
LEAF_CERT, LEAF_KEY = "tls.crt", "tls.key"
COMMON_DNS = "tandem"  # in every certificate: TANDEM_GRPC_TLS_SERVER_NAME=tandem where addresses are not known
CA_DAYS, LEAF_DAYS = 365, 90
_CLOCK_SKEW = datetime.timedelta(minutes=5)


@dataclass(frozen=True, slots=True)
class Authority:
    cert: x509.Certificate
    key: ec.EllipticCurvePrivateKey

    @property
    def cert_pem(self) -> bytes:
        return self.cert.public_bytes(serialization.Encoding.PEM)


@dataclass(frozen=True, slots=True)
class IdentityFiles:
    """Where one identity's files are: what a service's TANDEM_GRPC_TLS_* point at."""

    identity: Identity
    directory: Path

    @property
    def cert(self) -> Path:
        return self.directory / LEAF_CERT

    @property
    def key(self) -> Path:
        return self.directory / LEAF_KEY

    @property
    def ca(self) -> Path:
        return self.directory / CA_CERT

    def env(self) -> dict[str, str]:
        return {
            "TANDEM_GRPC_TLS_CA": str(self.ca),
            "TANDEM_GRPC_TLS_CERT": str(self.cert),
            "TANDEM_GRPC_TLS_KEY": str(self.key),
            "TANDEM_GRPC_TLS_CLIENT_AUTH": "1",
        }


def new_authority(name: str = "tandem-ca", days: int = CA_DAYS) -> Authority:
    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
    cert = (
        _builder(subject, subject, key.public_key(), days)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=False,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .sign(key, hashes.SHA256())
    )
    return Authority(cert, key)


def issue(
    authority: Authority, identity: Identity, days: int = LEAF_DAYS, dns: tuple[str, ...] = ()
) -> tuple[bytes, bytes]:
    """(certificate PEM, key PEM) for `identity`: its SAN URI, and names a client may dial it by (loopback,
    its role, its id, `tandem`, and `dns`). Usable for serving and as a client."""
    key = ec.generate_private_key(ec.SECP256R1())
    names = dict.fromkeys(
        ["localhost", COMMON_DNS, identity.role, *dns] + ([] if identity.is_role_wide else [identity.id])
    )
    sans = x509.SubjectAlternativeName(
        [
            x509.UniformResourceIdentifier(identity.uri),
            *(x509.DNSName(n) for n in names),
            x509.IPAddress(ipaddress.ip_address("127.0.0.1")),
        ]
    )
    usage = x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH])
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, identity.uri)])
    cert = (
        _builder(subject, authority.cert.subject, key.public_key(), days)
        .add_extension(sans, critical=False)
        .add_extension(usage, critical=False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .sign(authority.key, hashes.SHA256())
    )
    return cert.public_bytes(serialization.Encoding.PEM), _key_pem(key)


def _builder(subject: x509.Name, issuer: x509.Name, public_key, days: int) -> x509.CertificateBuilder:
    if days < 1:
        raise ValueError(f"a certificate must live at least 1 day, got {days}")
    now = datetime.datetime.now(datetime.UTC)
    return (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(issuer)
        .public_key(public_key)
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - _CLOCK_SKEW)
        .not_valid_after(now + datetime.timedelta(days=days))
    )


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )


def write_private(path: Path, data: bytes) -> None:
    """Write `data` readable by its owner only (created 0600, never world-readable for an instant)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(data)
    os.chmod(path, 0o600)  # NOTE: O_CREAT's mode does not apply to a file that already existed


def private_dir(path: Path) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    os.chmod(path, 0o700)
    return path


def save_authority(directory: Path, authority: Authority) -> None:
    private_dir(directory)
    write_private(directory / CA_CERT, authority.cert_pem)
    write_private(directory / CA_KEY, _key_pem(authority.key))


def load_authority(directory: Path) -> Authority:
    try:
        cert = x509.load_pem_x509_certificate((directory / CA_CERT).read_bytes())
        key = serialization.load_pem_private_key((directory / CA_KEY).read_bytes(), password=None)
    except FileNotFoundError as exc:
        raise IdentityError(f"no CA in {directory} ({exc.filename} missing): run `tandem certs init` first") from None
    return Authority(cert, key)


def write_identity(
    directory: Path, authority: Authority, identity: Identity, days: int = LEAF_DAYS, dns: tuple[str, ...] = ()
) -> IdentityFiles:
    """Issue `identity` into DIR/<id> (or DIR/<role>-any); a new certificate replaces one of the same identity,
    never another identity's."""
    files = IdentityFiles(identity, directory / identity.file_name)
    if files.cert.exists() and identity_of_cert(files.cert.read_bytes()) != identity:
        raise IdentityError(f"{files.directory} already holds another identity's certificate")
    cert_pem, key_pem = issue(authority, identity, days, dns)
    private_dir(files.directory)
    write_private(files.key, key_pem)
    write_private(files.cert, cert_pem)
    write_private(files.ca, authority.cert_pem)
    return files


def write_kv_signing_key(directory: Path) -> Path:
    """32 random bytes, hex, 0600: the key prefill workers sign KV handles with and decode workers verify."""
    path = directory / KV_SIGNING_KEY
    write_private(path, (secrets.token_hex(32) + "\n").encode())
    return path


def write_kv_hash_secret(directory: Path) -> Path:
    """32 random bytes, hex, 0600: the per-deployment secret every KV block hash (and tenant id) is keyed with."""
    path = directory / KV_HASH_SECRET
    write_private(path, (secrets.token_hex(32) + "\n").encode())
    return path
