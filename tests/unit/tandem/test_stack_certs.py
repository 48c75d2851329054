"""`tandem up`'s certificates: each child's identity and environment, one CA per launcher process, and the operator
identity the launcher holds only while a stack runs."""

import os
from pathlib import Path

import pytest

from services.common import tls
from services.common.identity import Identity, identity_of_cert
from tandem import stack_certs
from tandem.stack_certs import StackPki, identity_for, is_insecure


@pytest.mark.parametrize(
    "name, identity",
    [
        ("router", Identity("router", "router")),
        ("router-2", Identity("router", "router-2")),
        ("prefill-0", Identity("prefill", "prefill-0")),
        ("decode-13", Identity("decode", "decode-13")),
        ("gateway", Identity("gateway", "gateway")),
        ("planner", Identity("planner", "planner")),
        ("prometheus", None),
    ],
)
def test_each_child_is_named_by_its_role_and_id(name, identity):
    assert identity_for(name) == identity


def test_child_env_holds_its_own_certificate_and_the_stack_kv_key(tmp_path):
    pki_ = StackPki(tmp_path / "pki")
    env = pki_.child_env("decode-1")
    assert identity_of_cert(Path(env["TANDEM_GRPC_TLS_CERT"]).read_bytes()) == Identity("decode", "decode-1")
    assert env["TANDEM_GRPC_TLS_CLIENT_AUTH"] == "1" and env["TANDEM_KV_SIGNING_KEY_FILE"] == str(pki_.kv_key)
    assert pki_.child_env("decode-1") == env  # a restarted child keeps its files
    assert pki_.child_env("prometheus") == {}
    assert oct(os.stat(pki_.directory).st_mode & 0o777) == "0o700"


def test_stacks_of_one_process_share_a_ca_and_each_starts_afresh(tmp_path):
    first, second = StackPki(tmp_path / "a"), StackPki(tmp_path / "b")
    assert first.authority is second.authority
    (tmp_path / "a" / "stale").write_text("x")
    again = StackPki(tmp_path / "a")
    assert not (tmp_path / "a" / "stale").exists() and again.kv_key.read_text() != second.kv_key.read_text()


def test_the_operator_identity_is_held_while_any_stack_runs_then_restored(tmp_path, monkeypatch):
    monkeypatch.setenv("TANDEM_GRPC_TLS_SERVER_NAME", "before")
    monkeypatch.delenv("TANDEM_GRPC_TLS_CERT", raising=False)
    one, two = StackPki(tmp_path / "one"), StackPki(tmp_path / "two")
    try:
        one.activate()
        two.activate()
        assert tls.process_tls().is_mutual
        assert identity_of_cert(Path(os.environ["TANDEM_GRPC_TLS_CERT"]).read_bytes()) == Identity(
            "operator", "operator"
        )
        one.deactivate()
        assert tls.process_tls().is_mutual  # the other stack still runs
    finally:
        one.deactivate()
        two.deactivate()
    assert "TANDEM_GRPC_TLS_CERT" not in os.environ and os.environ["TANDEM_GRPC_TLS_SERVER_NAME"] == "before"
    assert not tls.process_tls().is_enabled
    assert stack_certs.OPERATOR._count == 0


def test_insecure_comes_from_the_stack_env_or_the_process(monkeypatch):
    monkeypatch.delenv("TANDEM_GRPC_INSECURE", raising=False)
    assert not is_insecure({}) and is_insecure({"TANDEM_GRPC_INSECURE": "1"})
    monkeypatch.setenv("TANDEM_GRPC_INSECURE", "true")
    assert is_insecure({}) and not is_insecure({"TANDEM_GRPC_INSECURE": "0"})
