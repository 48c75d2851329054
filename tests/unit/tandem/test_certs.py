"""`tandem certs`: the files it writes, their modes, the identities in them, and what it refuses."""

import stat
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives.asymmetric import ec

from services.common.identity import Identity, identity_of_cert, parse_uri
from tandem.certs import pki
from tandem.cli import main


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def _cert(path: Path) -> x509.Certificate:
    return x509.load_pem_x509_certificate(path.read_bytes())


def test_init_writes_a_ca_every_identity_and_the_kv_key_owner_only(tmp_path, capsys):
    out = tmp_path / "pki"
    assert main(["certs", "init", str(out), "--decode", "2", "--role-wide", "decode"]) == 0
    names = {Path(line).name for line in capsys.readouterr().out.split()}
    assert names == {
        "gateway",
        "planner",
        "operator",
        "router",
        "prefill-0",
        "decode-0",
        "decode-1",
        "decode-any",
        "kv-signing.key",
        "kv-hash.secret",
    }
    assert _mode(out) == 0o700
    for path in out.rglob("*"):
        assert _mode(path) == (0o700 if path.is_dir() else 0o600), path
    assert len(bytes.fromhex((out / "kv-signing.key").read_text().strip())) == 32
    assert len(bytes.fromhex((out / "kv-hash.secret").read_text().strip())) == 32
    assert (out / "kv-hash.secret").read_text() != (out / "kv-signing.key").read_text()
    assert identity_of_cert((out / "decode-1" / "tls.crt").read_bytes()) == Identity("decode", "decode-1")
    assert identity_of_cert((out / "decode-any" / "tls.crt").read_bytes()) == Identity("decode", "*")


def test_leaf_is_signed_by_the_ca_and_names_its_role_and_id(tmp_path):
    main(["certs", "init", str(tmp_path), "--prefill", "0", "--days", "7"])
    ca, leaf = _cert(tmp_path / "ca.crt"), _cert(tmp_path / "router" / "tls.crt")
    leaf.verify_directly_issued_by(ca)
    assert (tmp_path / "router" / "ca.crt").read_bytes() == (tmp_path / "ca.crt").read_bytes()
    sans = leaf.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert sans.get_values_for_type(x509.UniformResourceIdentifier) == ["spiffe://tandem/router/router"]
    assert {"localhost", "tandem", "router"} <= set(sans.get_values_for_type(x509.DNSName))
    assert (leaf.not_valid_after_utc - leaf.not_valid_before_utc).days == 7
    assert not (tmp_path / "prefill-0").exists()
    assert isinstance(leaf.public_key(), ec.EllipticCurvePublicKey)


def test_issue_adds_one_identity_from_the_existing_ca_and_replaces_only_its_own(tmp_path, capsys):
    main(["certs", "init", str(tmp_path)])
    ca = _cert(tmp_path / "ca.crt")
    assert main(["certs", "issue", str(tmp_path), "decode", "decode-9", "--dns", "decode-9.svc"]) == 0
    leaf = _cert(tmp_path / "decode-9" / "tls.crt")
    leaf.verify_directly_issued_by(ca)
    assert "decode-9.svc" in leaf.extensions.get_extension_for_class(
        x509.SubjectAlternativeName
    ).value.get_values_for_type(x509.DNSName)
    assert main(["certs", "issue", str(tmp_path), "decode", "decode-9"]) == 0  # rotation: same identity
    assert _cert(tmp_path / "decode-9" / "tls.crt").serial_number != leaf.serial_number
    capsys.readouterr()
    assert main(["certs", "issue", str(tmp_path), "prefill", "decode-9"]) == 2
    assert "another identity" in capsys.readouterr().err
    assert main(["certs", "issue", str(tmp_path), "decode", "--role-wide"]) == 0
    assert identity_of_cert((tmp_path / "decode-any" / "tls.crt").read_bytes()).is_role_wide


@pytest.mark.parametrize(
    "argv, message",
    [
        (["decode"], "give an ID"),
        (["decode", "x", "--role-wide"], "give an ID"),
        (["decode", "bad/id"], "must be 1-128"),
        (["decode", "d", "--days", "0"], "at least 1 day"),
    ],
)
def test_issue_refuses_bad_requests(tmp_path, capsys, argv, message):
    main(["certs", "init", str(tmp_path)])
    capsys.readouterr()
    assert main(["certs", "issue", str(tmp_path), *argv]) == 2
    assert message in capsys.readouterr().err


def test_init_will_not_replace_a_ca_unless_forced_and_issue_needs_one(tmp_path, capsys):
    main(["certs", "init", str(tmp_path / "a")])
    first = (tmp_path / "a" / "ca.crt").read_bytes()
    assert main(["certs", "init", str(tmp_path / "a")]) == 2
    assert (tmp_path / "a" / "ca.crt").read_bytes() == first
    assert main(["certs", "init", str(tmp_path / "a"), "--force"]) == 0
    assert (tmp_path / "a" / "ca.crt").read_bytes() != first
    assert main(["certs", "issue", str(tmp_path / "empty"), "decode", "d"]) == 2
    assert "tandem certs init" in capsys.readouterr().err


def test_kv_key_is_new_each_time(tmp_path):
    main(["certs", "kv-key", str(tmp_path)])
    first = (tmp_path / pki.KV_SIGNING_KEY).read_text()
    main(["certs", "kv-key", str(tmp_path)])
    assert (tmp_path / pki.KV_SIGNING_KEY).read_text() != first
    assert _mode(tmp_path / pki.KV_SIGNING_KEY) == 0o600


@pytest.mark.parametrize(
    "uri, expected",
    [
        ("spiffe://tandem/decode/decode-0", Identity("decode", "decode-0")),
        ("spiffe://tandem/decode/*", Identity("decode", "*")),
        ("spiffe://other/decode/decode-0", None),
        ("spiffe://tandem/admin/x", None),
        ("spiffe://tandem/decode/a/b", None),
        ("https://tandem/decode/x", None),
    ],
)
def test_parse_uri(uri, expected):
    assert parse_uri(uri) == expected


def test_worker_id_binding():
    assert Identity("decode", "decode-0").may_act_as("decode-0")
    assert not Identity("decode", "decode-0").may_act_as("decode-1")
    assert Identity("prefill", "*").may_act_as("anything")
    assert not Identity("gateway", "gateway").may_act_as("gateway")
    assert not Identity("operator", "*").may_act_as("decode-0")
