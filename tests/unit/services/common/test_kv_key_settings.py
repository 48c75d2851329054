"""The KV signing key in a worker's settings: read from TANDEM_KV_SIGNING_KEY_FILE, checked at start; a worker that
listens beyond loopback without one refuses to start unless plaintext mode is explicit; the disk tier gets it."""

import pytest

from engines.base.engine_configs import CacheConfig
from services.common.engine_factory import engine_spec
from services.common.roles import WorkerRole
from services.common.settings import SettingsError
from services.common.worker_settings import WorkerSettings, parse_worker_settings

KEY = bytes(range(32))


@pytest.fixture
def key_file(tmp_path):
    path = tmp_path / "kv-signing.key"
    path.write_text(KEY.hex() + "\n")
    return str(path)


def test_the_key_file_comes_from_the_environment_and_is_read(monkeypatch, key_file):
    monkeypatch.setenv("TANDEM_KV_SIGNING_KEY_FILE", key_file)
    settings = parse_worker_settings(WorkerRole.PREFILL, ["--model", "m", "--host", "0.0.0.0"])
    assert settings.kv_signing_key() == KEY
    assert KEY.hex() not in repr(settings)  # the settings name the file, never the key


def test_no_key_off_loopback_is_refused_with_what_to_do(monkeypatch):
    monkeypatch.delenv("TANDEM_GRPC_INSECURE", raising=False)
    with pytest.raises(SettingsError, match="TANDEM_KV_SIGNING_KEY_FILE.*TANDEM_GRPC_INSECURE=1"):
        WorkerSettings(role="decode", model="m", host="0.0.0.0")


@pytest.mark.parametrize("host", ["127.0.0.1", "localhost", "::1", "127.0.0.2"])
def test_no_key_on_loopback_means_unsigned_handles(monkeypatch, host):
    monkeypatch.delenv("TANDEM_GRPC_INSECURE", raising=False)
    assert WorkerSettings(role="decode", model="m", host=host).kv_signing_key() is None


def test_plaintext_mode_allows_no_key_anywhere(monkeypatch):
    monkeypatch.setenv("TANDEM_GRPC_INSECURE", "1")
    assert WorkerSettings(role="prefill", model="m", host="0.0.0.0").kv_signing_key() is None


@pytest.mark.parametrize("text,error", [("nothex", "hex digits"), ("ab" * 16, "at least 32 bytes")])
def test_a_bad_key_file_stops_the_worker(tmp_path, text, error):
    path = tmp_path / "k"
    path.write_text(text)
    with pytest.raises(SettingsError, match=error):
        WorkerSettings(role="decode", model="m", kv_signing_key_file=str(path))
    with pytest.raises(SettingsError, match="No such file"):
        WorkerSettings(role="decode", model="m", kv_signing_key_file=str(tmp_path / "missing"))


def test_the_native_engines_disk_tier_gets_the_key(key_file, tmp_path):
    settings = WorkerSettings(
        role="decode",
        model="m",
        kv_signing_key_file=key_file,
        cache=CacheConfig(kv_host_gb=0.1, kv_disk_dir=str(tmp_path / "kv"), kv_disk_gb=0.1),
    )
    config = engine_spec(settings).config
    assert config.kv_disk_key == KEY and "kv_disk_key" not in repr(config)
