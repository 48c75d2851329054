"""Router settings: defaults, TANDEM_ROUTER_* variables, CLI flags over them, clear errors for bad values."""

import pytest

from services.common.settings import SettingsError
from services.router.server import build_parser, main
from services.router.settings import RouterSettings, settings_from


def load(argv: list[str]) -> RouterSettings:
    return settings_from(build_parser().parse_args(argv))


def test_defaults():
    s = load([])
    assert (s.port, s.policy, s.lease_ttl_s, s.heartbeat_interval_s) == (50051, "least_loaded", 10.0, 2.0)
    assert (s.disagg_min_tokens, s.prefill_max_waiting, s.inflight_ttl_s) == (512, 4, 600.0)


def test_env_then_flags(monkeypatch):
    monkeypatch.setenv("TANDEM_ROUTER_DISAGG_MIN_TOKENS", "1")
    monkeypatch.setenv("TANDEM_ROUTER_POLICY", "round_robin")
    monkeypatch.setenv("TANDEM_ROUTER_LEASE_TTL_S", "30")
    s = load(["--policy", "least_loaded", "--port", "6001"])
    assert (s.disagg_min_tokens, s.policy, s.lease_ttl_s, s.port) == (1, "least_loaded", 30.0, 6001)


def test_settings_are_frozen():
    with pytest.raises(AttributeError):
        RouterSettings().port = 1


@pytest.mark.parametrize(
    "kwargs,message",
    [
        ({"policy": "nope"}, "policy must be one of kv, least_loaded, round_robin, got 'nope'"),
        ({"kv_temperature": -1.0}, "need kv_overlap_weight, kv_inflight_weight and kv_temperature >= 0"),
        ({"kv_index_max_entries": 0}, "kv_index_max_entries >= 1"),
        ({"port": 70000}, r"port must be in \[0, 65535\]"),
        ({"lease_ttl_s": 0.0}, "lease_ttl_s must be > 0"),
        ({"heartbeat_interval_s": 10.0}, r"heartbeat_interval_s \(10.0\) must be below lease_ttl_s \(10.0\)"),
        ({"prefill_max_waiting": 0}, "prefill_max_waiting >= 1"),
    ],
)
def test_bad_values_raise_clear_errors(kwargs, message):
    with pytest.raises(SettingsError, match=message):
        RouterSettings(**kwargs)


def test_bad_env_value_names_the_variable(monkeypatch):
    monkeypatch.setenv("TANDEM_ROUTER_PORT", "http")
    with pytest.raises(SettingsError, match="TANDEM_ROUTER_PORT='http'"):
        RouterSettings.from_env()


def test_main_exits_2_on_bad_setting(capsys):
    assert main(["--lease-ttl-s", "1", "--heartbeat-interval-s", "5"]) == 2
    (line,) = capsys.readouterr().err.splitlines()
    assert "must be below lease_ttl_s" in line


def test_kv_settings_from_env_and_flags(monkeypatch):
    monkeypatch.setenv("TANDEM_ROUTER_KV_USE_EVENTS", "false")
    monkeypatch.setenv("TANDEM_ROUTER_KV_OVERLAP_WEIGHT", "2.5")
    s = load(["--policy", "kv", "--kv-temperature", "0.3", "--kv-index-max-entries", "9"])
    assert (s.policy, s.kv_use_events, s.kv_overlap_weight, s.kv_index_max_entries) == ("kv", False, 2.5, 9)
    assert (s.kv_config.temperature, s.kv_config.use_events) == (0.3, False)
    assert load(["--kv-use-events", "yes"]).kv_use_events is True
