"""`tandem up` and the KV signing key: without TANDEM_KV_SIGNING_KEY_FILE each stack has its own (0600, in the
stack's private certificate directory under the cache directory) and hands it to every child; a key the caller
names is used as is."""

import json
import os
import stat
import sys

from services.common.kv_signing import parse_key
from tandem.launcher import Stack, StackConfig
from tandem.stack_certs import KV_KEY_ENV, StackPki


def _child_env(stack: Stack, tmp_path) -> dict:
    """The environment a child gets: one that prints it."""
    proc = stack._popen(
        "decode-0",
        [sys.executable, "-c", "import json, os; print(json.dumps(dict(os.environ)))"],
        tmp_path / "env.log",
        "w",
    )
    proc.wait(30)
    return json.loads((tmp_path / "env.log").read_text())


def _stack(tmp_path) -> Stack:
    stack = Stack(StackConfig(model="m", log_dir=tmp_path / "logs"))
    stack.cfg.log_dir.mkdir(parents=True)
    stack.pki = StackPki(tmp_path / "pki")
    return stack


def test_a_stack_without_a_key_makes_a_private_one_for_its_children(tmp_path, monkeypatch):
    monkeypatch.delenv(KV_KEY_ENV, raising=False)
    stack = _stack(tmp_path)
    path = str(stack.pki.kv_key)
    assert os.path.dirname(path) == str(tmp_path / "pki")
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    assert stat.S_IMODE(os.stat(tmp_path / "pki").st_mode) == 0o700
    assert len(parse_key(open(path).read())) == 32
    assert _child_env(stack, tmp_path)[KV_KEY_ENV] == path


def test_a_key_the_caller_names_is_passed_through_untouched(tmp_path, monkeypatch):
    monkeypatch.setenv(KV_KEY_ENV, "/etc/tandem/kv-signing.key")
    assert _child_env(_stack(tmp_path), tmp_path)[KV_KEY_ENV] == "/etc/tandem/kv-signing.key"


def test_an_empty_key_in_the_stack_config_means_unsigned_handles(tmp_path, monkeypatch):
    """What `tandem bench overhead --security-rounds` compares against: no key, so prefill workers sign nothing."""
    monkeypatch.delenv(KV_KEY_ENV, raising=False)
    stack = Stack(StackConfig(model="m", log_dir=tmp_path / "logs", env={KV_KEY_ENV: ""}))
    stack.cfg.log_dir.mkdir(parents=True)
    stack.pki = StackPki(tmp_path / "pki")
    assert _child_env(stack, tmp_path)[KV_KEY_ENV] == ""
