"""The worker's settings for engine trtllm: TANDEM_WORKER_TRTLLM_* and --trtllm-* (flags win), the GPU
memory budget, and one clear SettingsError for a bad value."""

import pytest

from services.common.settings import SettingsError
from services.common.worker_settings import parse_worker_settings


@pytest.fixture(autouse=True)
def clean_env(monkeypatch):
    import os

    for name in [k for k in os.environ if k.startswith("TANDEM_")]:
        monkeypatch.delenv(name)


def test_engine_trtllm_and_its_settings_from_env_and_flags(monkeypatch):
    monkeypatch.setenv("TANDEM_WORKER_TRTLLM_KV_CACHE_DTYPE", "fp8")
    monkeypatch.setenv("TANDEM_WORKER_TRTLLM_CACHE_TRANSCEIVER", "NIXL")
    monkeypatch.setenv("TANDEM_WORKER_GPU_MEMORY_UTILIZATION", "0.8")
    s = parse_worker_settings(
        "decode",
        [
            "--model",
            "/m",
            "--engine",
            "trtllm",
            "--device",
            "cuda",
            "--trtllm-quant",
            "nvfp4",
            "--trtllm-backend",
            "tensorrt",
            "--trtllm-tensor-parallel-size",
            "2",
            "--trtllm-options",
            "/o.json",
            "--trtllm-cache-transceiver",
            "UCX",
        ],
    )
    assert (s.engine, s.device, s.trtllm.quant, s.trtllm.backend, s.trtllm.tensor_parallel_size) == (
        "trtllm",
        "cuda",
        "nvfp4",
        "tensorrt",
        2,
    )
    assert (s.trtllm.kv_cache_dtype, s.trtllm.cache_transceiver, s.trtllm.options) == ("fp8", "UCX", "/o.json")
    assert s.cache.gpu_memory_utilization == 0.8


def test_defaults():
    s = parse_worker_settings("prefill", ["--model", "/m"])
    assert (
        s.cache.gpu_memory_utilization,
        s.trtllm.backend,
        s.trtllm.quant,
        s.trtllm.kv_cache_dtype,
        s.trtllm.cache_transceiver,
        s.trtllm.tensor_parallel_size,
        s.trtllm.options,
    ) == (0.9, "auto", "", "auto", "DEFAULT", 1, "")


@pytest.mark.parametrize(
    "flags,message",
    [
        (["--trtllm-quant", "int4"], "trtllm_quant must be one of"),
        (["--trtllm-backend", "onnx"], "trtllm_backend must be one of"),
        (["--trtllm-kv-cache-dtype", "fp4"], "trtllm_kv_cache_dtype must be one of"),
        (["--trtllm-cache-transceiver", "tcp"], "trtllm_cache_transceiver must be one of"),
        (["--trtllm-tensor-parallel-size", "0"], "trtllm_tensor_parallel_size must be >= 1"),
        (["--gpu-memory-utilization", "1.5"], r"gpu_memory_utilization must be in \(0, 1\]"),
        (["--gpu-memory-utilization", "0"], r"gpu_memory_utilization must be in \(0, 1\]"),
    ],
)
def test_a_bad_value_is_one_clear_error(flags, message):
    with pytest.raises(SettingsError, match=message):
        parse_worker_settings("decode", ["--model", "/m", "--engine", "trtllm", *flags])


def test_the_flags_are_in_the_help(capsys):
    with pytest.raises(SystemExit):
        parse_worker_settings("decode", ["--help"])
    out = capsys.readouterr().out
    for flag in (
        "--engine",
        "--gpu-memory-utilization",
        "--trtllm-backend",
        "--trtllm-quant",
        "--trtllm-kv-cache-dtype",
        "--trtllm-cache-transceiver",
        "--trtllm-tensor-parallel-size",
        "--trtllm-options",
    ):
        assert flag in out, flag


def test_the_kv_hash_secret_comes_from_its_shared_variable_and_stays_out_of_repr(monkeypatch):
    from services.common.roles import WorkerRole
    from services.common.worker_settings import parse_worker_settings

    monkeypatch.setenv("TANDEM_KV_HASH_SECRET", "hunter2")
    settings = parse_worker_settings(WorkerRole.DECODE, ["--model", "m"])
    assert settings.kv_hash_secret == "hunter2" and "hunter2" not in repr(settings)
