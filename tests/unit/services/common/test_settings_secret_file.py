"""A secret setting may come as a file (TANDEM_KV_HASH_SECRET_FILE, what compose's volumes and Kubernetes' Secrets
hand over); the value in the environment wins; an unreadable file stops the service with its name; other settings
never read a _FILE twin."""

import pytest

from services.common.settings import SettingsError, env


def test_the_hash_secret_comes_from_its_file(tmp_path, monkeypatch):
    path = tmp_path / "kv-hash.secret"
    path.write_text("ab" * 32 + "\n")
    monkeypatch.delenv("TANDEM_KV_HASH_SECRET", raising=False)
    monkeypatch.setenv("TANDEM_KV_HASH_SECRET_FILE", str(path))
    assert env("TANDEM_KV_HASH_SECRET", "") == "ab" * 32
    monkeypatch.setenv("TANDEM_KV_HASH_SECRET", "given")
    assert env("TANDEM_KV_HASH_SECRET", "") == "given"


def test_a_missing_secret_file_is_a_clear_start_up_error(tmp_path, monkeypatch):
    monkeypatch.delenv("TANDEM_KV_HASH_SECRET", raising=False)
    monkeypatch.setenv("TANDEM_KV_HASH_SECRET_FILE", str(tmp_path / "absent"))
    with pytest.raises(SettingsError, match="TANDEM_KV_HASH_SECRET_FILE=.*absent"):
        env("TANDEM_KV_HASH_SECRET", "")


def test_only_listed_secrets_read_a_file(tmp_path, monkeypatch):
    path = tmp_path / "keys"
    path.write_text("sk-1")
    monkeypatch.delenv("TANDEM_API_KEYS", raising=False)
    monkeypatch.setenv("TANDEM_API_KEYS_FILE", str(path))  # the gateway reads this one itself, its own way
    assert env("TANDEM_API_KEYS", "") == ""
