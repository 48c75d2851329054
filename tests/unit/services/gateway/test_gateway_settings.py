"""Gateway settings from TANDEM_* variables and flags."""

import pytest

from services.common.settings import SettingsError
from services.gateway.server import main
from services.gateway.settings import GatewaySettings, from_env, parse_args


def test_defaults_env_and_flags(monkeypatch):
    monkeypatch.setenv("TANDEM_MODEL", "/models/SmolLM2-135M-Instruct")
    monkeypatch.setenv("TANDEM_API_KEYS", "sk-a, sk-b,")
    monkeypatch.setenv("TANDEM_GATEWAY_MAX_INFLIGHT", "8")
    monkeypatch.setenv("TANDEM_GATEWAY_PORT", "9000")
    settings = parse_args(["--port", "8100"])
    assert settings.model_name == "SmolLM2-135M-Instruct" and settings.router_model == settings.model_dir
    assert settings.api_keys == ("sk-a", "sk-b") and settings.max_inflight == 8
    assert settings.port == 8100  # flags win over the environment
    assert (settings.router_address, settings.max_body_bytes) == ("127.0.0.1:50051", 1 << 20)
    assert parse_args(["--model-dir", "/m/x", "--served-model-name", "chat"]).model_name == "chat"


def test_bad_values_fail_at_start(monkeypatch):
    monkeypatch.delenv("TANDEM_MODEL", raising=False)
    with pytest.raises(SettingsError, match="model"):
        from_env()
    monkeypatch.setenv("TANDEM_GATEWAY_MAX_INFLIGHT", "many")
    with pytest.raises(SettingsError, match="TANDEM_GATEWAY_MAX_INFLIGHT"):
        from_env(model_dir="/m")
    with pytest.raises(SettingsError, match="max_body_bytes"):
        GatewaySettings(model_dir="/m", max_body_bytes=0)
    assert main(["--model", "/no/such/model"]) == 2


def test_gateway_processes(monkeypatch):
    monkeypatch.setenv("TANDEM_GATEWAY_WORKERS", "3")
    assert parse_args(["--model", "/m"]).num_workers == 3
    assert parse_args(["--model", "/m", "--workers", "2"]).num_workers == 2  # the flag wins
    assert GatewaySettings(model_dir="/m").num_workers == 1 and GatewaySettings(model_dir="/m").drain_timeout_s == 30
    for bad in (0, 65):
        with pytest.raises(SettingsError, match="num_workers"):
            GatewaySettings(model_dir="/m", num_workers=bad)
    with pytest.raises(SettingsError, match="drain_timeout_s"):
        GatewaySettings(model_dir="/m", drain_timeout_s=0)
    assert main(["--model", "/no/such/model", "--workers", "2"]) == 2  # checked once, before any process starts


def test_frozen():
    settings = GatewaySettings(model_dir="/m")
    with pytest.raises(AttributeError):
        settings.port = 1  # type: ignore[misc]


def test_api_keys_from_a_file_a_mounted_secret(tmp_path, monkeypatch):
    from services.gateway.settings import from_env as gateway_from_env

    keys = tmp_path / "keys"
    keys.write_text("# the operator's keys\nkey-1\n key-2 ,key-3\n\n")
    monkeypatch.delenv("TANDEM_API_KEYS", raising=False)
    monkeypatch.setenv("TANDEM_API_KEYS_FILE", str(keys))
    assert gateway_from_env(model_dir="/m").api_keys == ("key-1", "key-2", "key-3")
    keys.write_text("\n# none yet\n")
    with pytest.raises(SettingsError, match="names no key"):
        gateway_from_env(model_dir="/m")
    monkeypatch.setenv("TANDEM_API_KEYS_FILE", str(tmp_path / "absent"))
    with pytest.raises(SettingsError, match="TANDEM_API_KEYS_FILE"):
        gateway_from_env(model_dir="/m")
    keys.write_text("key-1\n")
    monkeypatch.setenv("TANDEM_API_KEYS_FILE", str(keys))
    monkeypatch.setenv("TANDEM_API_KEYS", "inline")
    with pytest.raises(SettingsError, match="either inline"):
        gateway_from_env(model_dir="/m")
