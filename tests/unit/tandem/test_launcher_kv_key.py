"""`tandem up` and the KV signing key: without TANDEM_KV_SIGNING_KEY_FILE it makes one per stack (0600, under the
cache directory), hands it to every child and removes it at stop; a key the caller names is used as is."""
import json
import os
import stat
import sys

from services.common.kv_signing import parse_key
from tandem.launcher import KV_KEY_ENV, Stack, StackConfig


def _child_env(stack: Stack, tmp_path) -> dict:
    """The environment a child gets: one that prints it."""
    proc = stack._popen([sys.executable, "-c", "import json, os; print(json.dumps(dict(os.environ)))"],
                        tmp_path / "env.log", "w")
    proc.wait(30)
    return json.loads((tmp_path / "env.log").read_text())


def test_a_stack_without_a_key_makes_a_private_one_and_removes_it(tmp_path, monkeypatch):
    monkeypatch.delenv(KV_KEY_ENV, raising=False)
    stack = Stack(StackConfig(model="m", log_dir=tmp_path / "logs"))
    stack.cfg.log_dir.mkdir(parents=True)
    stack._maybe_make_kv_key()
    path = stack._kv_key_path
    assert os.path.dirname(path) == str(tmp_path)  # beside the logs, under the cache directory
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    assert len(parse_key(open(path).read())) == 32
    assert _child_env(stack, tmp_path)[KV_KEY_ENV] == path
    stack.stop()
    assert not os.path.exists(path)


def test_a_key_the_caller_names_is_passed_through_untouched(tmp_path, monkeypatch):
    monkeypatch.setenv(KV_KEY_ENV, "/etc/tandem/kv-signing.key")
    stack = Stack(StackConfig(model="m", log_dir=tmp_path / "logs"))
    stack.cfg.log_dir.mkdir(parents=True)
    stack._maybe_make_kv_key()
    assert stack._kv_key_path == "" and list(tmp_path.glob("kv-signing-*")) == []
    assert _child_env(stack, tmp_path)[KV_KEY_ENV] == "/etc/tandem/kv-signing.key"
