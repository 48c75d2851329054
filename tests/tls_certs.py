"""Certificates made in the test: a CA, and leaf certificates it signs for 127.0.0.1/localhost (usable as server
and as client), written as PEM files. A second, unrelated CA lets a test present a certificate nobody trusts."""

import datetime
import ipaddress
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID


@dataclass(frozen=True)
class Leaf:
    cert: Path
    key: Path


@dataclass(frozen=True)
class Authority:
    name: str
    cert: Path
    key: ec.EllipticCurvePrivateKey
    directory: Path

    def issue(self, name: str) -> Leaf:
        """A certificate for 127.0.0.1 and localhost, for serving and for client authentication."""
        key = ec.generate_private_key(ec.SECP256R1())
        loopback = x509.IPAddress(ipaddress.ip_address("127.0.0.1"))
        sans = x509.SubjectAlternativeName([x509.DNSName("localhost"), loopback])
        usage = x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH])
        ca_cert = x509.load_pem_x509_certificate(self.cert.read_bytes())
        builder = (
            _builder(name, ca_cert.subject, key)
            .add_extension(sans, critical=False)
            .add_extension(usage, critical=False)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        )
        pem = builder.sign(self.key, hashes.SHA256()).public_bytes(serialization.Encoding.PEM)
        return Leaf(self._write(f"{name}.crt", pem), self._write(f"{name}.key", _key_pem(key)))

    def _write(self, filename: str, data: bytes) -> Path:
        path = self.directory / filename
        path.write_bytes(data)
        return path


def make_authority(directory: Path, name: str = "tandem-test-ca") -> Authority:
    directory.mkdir(parents=True, exist_ok=True)
    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
    cert = _builder(name, subject, key).add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
    path = directory / f"{name}.crt"
    path.write_bytes(cert.sign(key, hashes.SHA256()).public_bytes(serialization.Encoding.PEM))
    return Authority(name, path, key, directory)


def _builder(name: str, issuer: x509.Name, key: ec.EllipticCurvePrivateKey) -> x509.CertificateBuilder:
    now = datetime.datetime.now(datetime.UTC)
    return (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)]))
        .issuer_name(issuer)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
    )


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )


def tls_env(ca: Path, leaf: Leaf, client_auth: bool) -> dict[str, str]:
    """The TANDEM_GRPC_TLS_* variables of a process holding `leaf`."""
    return {
        "TANDEM_GRPC_TLS_CA": str(ca),
        "TANDEM_GRPC_TLS_CERT": str(leaf.cert),
        "TANDEM_GRPC_TLS_KEY": str(leaf.key),
        "TANDEM_GRPC_TLS_CLIENT_AUTH": "1" if client_auth else "0",
    }
