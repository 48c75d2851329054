"""`tandem up`'s KV hash secret: made once per stack directory (0600), kept across restarts, the same for every
child, and never chosen over one the operator set."""

import stat

from tandem.launcher import KV_HASH_SECRET_ENV, Stack, StackConfig, kv_hash_secret


def test_the_secret_is_made_once_private_and_reused(tmp_path):
    logs = tmp_path / "logs"
    first = kv_hash_secret(logs)
    path = tmp_path / "kv-hash.secret"
    assert len(first) == 32 and stat.S_IMODE(path.stat().st_mode) == 0o600
    assert kv_hash_secret(logs) == first


def test_every_child_of_a_stack_gets_it_and_an_operators_own_wins(tmp_path, monkeypatch):
    monkeypatch.delenv(KV_HASH_SECRET_ENV, raising=False)
    stack = Stack(StackConfig(model="m", log_dir=tmp_path / "logs"))
    assert stack.cfg.env[KV_HASH_SECRET_ENV] == kv_hash_secret(tmp_path / "logs")
    given = Stack(StackConfig(model="m", log_dir=tmp_path / "logs", env={KV_HASH_SECRET_ENV: "mine"}))
    assert given.cfg.env[KV_HASH_SECRET_ENV] == "mine"
    monkeypatch.setenv(KV_HASH_SECRET_ENV, "from-env")
    assert Stack(StackConfig(model="m", log_dir=tmp_path / "logs")).cfg.env[KV_HASH_SECRET_ENV] == "from-env"
