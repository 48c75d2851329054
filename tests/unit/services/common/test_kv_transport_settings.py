"""The KV transport a worker's engine moves KV with: TANDEM_KV_TRANSPORT reaches the native and sim engines
(auto: NIXL when it imports), and a bad NIXL setting stops the worker at start with a clear message."""

import pytest

from engines.base.engine_configs import TransferConfig
from engines.transfer.nixl_link import is_available
from services.common.engine_factory import engine_spec
from services.common.roles import WorkerRole
from services.common.settings import SettingsError
from services.common.worker_settings import WorkerSettings, parse_worker_settings


@pytest.mark.parametrize(
    "setting, expected",
    [("grpc", "grpc"), ("nixl", "nixl"), ("bytes", "bytes"), ("auto", "nixl" if is_available() else "grpc")],
)
def test_the_native_engine_gets_the_transport(setting, expected):
    assert (
        engine_spec(
            WorkerSettings(role="prefill", model="m", transfer=TransferConfig(setting))
        ).config.transfer.kv_transport
        == expected
    )


def test_the_environment_sets_the_transport(monkeypatch):
    monkeypatch.setenv("TANDEM_KV_TRANSPORT", "grpc")
    assert parse_worker_settings(WorkerRole.DECODE, ["--model", "m"]).transfer.kv_transport == "grpc"


def test_a_bad_transport_or_nixl_setting_is_refused(monkeypatch):
    with pytest.raises(SettingsError, match="kv_transport must be one of"):
        parse_worker_settings(WorkerRole.DECODE, ["--model", "m", "--kv-transport", "rdma"])
    monkeypatch.setenv("TANDEM_NIXL_PROGRESS_THREAD", "yes")
    with pytest.raises(SettingsError, match="TANDEM_NIXL_PROGRESS_THREAD must be 0 or 1"):
        WorkerSettings(role="decode", model="m")
