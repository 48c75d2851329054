"""The shared engine sub-configs: each validates its own fields, and a worker's settings compose them."""

import pytest

from engines.base.engine_configs import BatchConfig, CacheConfig, TransferConfig
from services.common.engine_factory import HELD_KV_GRACE_S, engine_spec
from services.common.settings import SettingsError
from services.common.worker_settings import parse_worker_settings


@pytest.mark.parametrize(
    "make",
    [
        lambda: BatchConfig(max_num_seqs=0),
        lambda: BatchConfig(max_model_len=-1),
        lambda: CacheConfig(block_size=0),
        lambda: CacheConfig(num_blocks=-1),
        lambda: CacheConfig(kv_disk_dir="/d", kv_disk_gb=1.0),
        lambda: CacheConfig(gpu_memory_utilization=1.5),
        lambda: TransferConfig(kv_transport="rdma"),
        lambda: TransferConfig(held_kv_ttl_s=0),
    ],
)
def test_bad_values_are_refused(make):
    with pytest.raises(ValueError):
        make()


def test_worker_settings_compose_the_sub_configs(tmp_path):
    s = parse_worker_settings(
        "decode",
        [
            "--model",
            str(tmp_path),
            "--engine",
            "zero",
            "--max-num-seqs",
            "7",
            "--block-size",
            "8",
            "--num-blocks",
            "32",
            "--max-model-len",
            "100",
            "--no-prefix-caching",
            "--kv-lease-s",
            "5",
            "--kv-transport",
            "grpc",
        ],
    )
    assert s.batch == BatchConfig(7, 2048, 100, enable_prefix_caching=False)
    assert s.cache == CacheConfig(block_size=8, num_blocks=32)
    assert s.transfer_config(HELD_KV_GRACE_S) == TransferConfig("grpc", 5 + HELD_KV_GRACE_S)
    spec = engine_spec(s).config  # the zero runner takes them whole
    assert (spec.batch, spec.cache) == (s.batch, s.cache)


@pytest.mark.parametrize(
    "flags, message",
    [
        (["--block-size", "0"], "block_size must be >= 1"),
        (["--max-num-seqs", "0"], "max_num_seqs and max_num_batched_tokens must be >= 1"),
        (["--kv-disk-dir", "/d", "--kv-disk-gb", "1"], "set kv_host_gb too"),
        (["--gpu-memory-utilization", "0"], r"gpu_memory_utilization must be in \(0, 1\]"),
    ],
)
def test_a_bad_sub_config_value_stops_the_worker_with_a_settings_error(tmp_path, flags, message):
    with pytest.raises(SettingsError, match=message):
        parse_worker_settings("decode", ["--model", str(tmp_path), *flags])
