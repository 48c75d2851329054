"""The KV tier settings reach every engine's spec, and `tandem up` gives each worker its own disk directory."""

from pathlib import Path

import pytest

from engines.base.engine_configs import CacheConfig
from services.common.engine_factory import engine_spec
from services.common.roles import WorkerRole
from services.common.worker_settings import WorkerSettings, parse_worker_settings
from tandem.launcher import Stack, StackConfig

TIERS = dict(kv_host_gb=2.0, kv_disk_dir="/var/kv", kv_disk_gb=8.0)


@pytest.mark.parametrize("engine, disk_dir", [("native", "/var/kv"), ("zero", None), ("sim", None)])
def test_every_engine_spec_carries_the_tier_sizes(engine, disk_dir):
    config = engine_spec(WorkerSettings(role="decode", engine=engine, model="m", cache=CacheConfig(**TIERS))).config
    config = getattr(config, "cache", config)  # a backend that takes the shared CacheConfig whole
    assert (config.kv_host_gb, config.kv_disk_gb) == (2.0, 8.0)
    if disk_dir is not None:
        assert config.kv_disk_dir == disk_dir


def test_the_flags_and_the_environment_set_the_tiers(monkeypatch):
    monkeypatch.setenv("TANDEM_WORKER_KV_HOST_GB", "3")
    s = parse_worker_settings(WorkerRole.DECODE, ["--model", "m", "--kv-disk-dir", "/d", "--kv-disk-gb", "6"])
    assert (s.cache.kv_host_gb, s.cache.kv_disk_dir, s.cache.kv_disk_gb) == (3.0, "/d", 6.0)


def test_each_worker_of_a_stack_gets_its_own_disk_directory(tmp_path):
    stack = Stack(StackConfig(model="m", num_prefill=1, num_decode=2, kv_disk_dir=str(tmp_path)))
    dirs = {}
    for name in ("prefill-0", "decode-0", "decode-1"):
        args = stack._worker_args(name)
        dirs[name] = args[args.index("--kv-disk-dir") + 1]
    assert dirs == {name: str(Path(tmp_path) / name) for name in dirs}
    assert "--kv-disk-dir" not in Stack(StackConfig(model="m"))._worker_args("decode-0")
