"""Checkpoint reading and TensorRT-LLM's LLM(...) arguments: backend, KV cache (block size, reuse, events, its
size from the GPU memory budget, FP8), QuantConfig, the cache transceiver; refusals name their fix."""

import json
from pathlib import Path

import pytest

from engines.base import EngineUnavailableError, ModelNotFoundError
from engines.base.engine_configs import BatchConfig, CacheConfig
from engines.trtllm import build
from engines.trtllm.checkpoint import read_checkpoint
from engines.trtllm.config import TrtllmConfig, TrtllmOptions
from tests.unit.engines.trtllm.fake_trtllm import LLM, CacheTransceiverConfig, KvCacheConfig, QuantAlgo, fake_api

GIB = 1 << 30
HALF = CacheConfig(gpu_memory_utilization=0.5)  # of an 80 GiB card


def engine_dir(root: Path, tokens_per_block=32, quant=None) -> Path:
    """What trtllm-build writes: config.json with pretrained_config and build_config, rank<N>.engine."""
    root.mkdir()
    (root / "config.json").write_text(
        json.dumps(
            {
                "version": "1.2.1",
                "pretrained_config": {
                    "architecture": "LlamaForCausalLM",
                    "num_hidden_layers": 32,
                    "num_attention_heads": 32,
                    "num_key_value_heads": 8,
                    "hidden_size": 4096,
                    "max_position_embeddings": 131072,
                    "vocab_size": 128256,
                    "quantization": quant or {"quant_algo": None, "kv_cache_quant_algo": None},
                },
                "build_config": {
                    "max_seq_len": 8192,
                    "max_batch_size": 256,
                    "plugin_config": {"tokens_per_block": tokens_per_block},
                },
            }
        )
    )
    (root / "rank0.engine").write_bytes(b"\0" * 1000)
    return root


def test_a_hugging_face_checkpoint(tiny_llama):
    ckpt = read_checkpoint(str(tiny_llama))
    assert (ckpt.is_engine, ckpt.num_layers, ckpt.num_kv_heads, ckpt.head_dim, ckpt.max_position) == (
        False,
        2,
        2,
        16,
        512,
    )
    assert ckpt.eos_token_ids == (2, 0)  # config.json's, then generation_config.json's: as the native engine
    assert ckpt.vocab_size == 512
    assert ckpt.quant_algo is None and ckpt.weight_bytes == (tiny_llama / "model.safetensors").stat().st_size


def test_a_prebuilt_engine_directory(tmp_path):
    fp8 = {"quant_algo": "FP8", "kv_cache_quant_algo": "FP8"}
    ckpt = read_checkpoint(str(engine_dir(tmp_path / "e", quant=fp8)))
    assert (ckpt.is_engine, ckpt.num_layers, ckpt.num_kv_heads, ckpt.head_dim, ckpt.max_position) == (
        True,
        32,
        8,
        128,
        8192,
    )
    assert (ckpt.quant_algo, ckpt.kv_cache_quant_algo, ckpt.tokens_per_block, ckpt.weight_bytes) == (
        "FP8",
        "FP8",
        32,
        1000,
    )
    assert ckpt.vocab_size == 128256


def test_a_modelopt_checkpoint_says_how_it_is_quantized(tiny_llama, tmp_path):
    ckpt_dir = tmp_path / "fp8"
    ckpt_dir.mkdir()
    for f in tiny_llama.iterdir():
        (ckpt_dir / f.name).write_bytes(f.read_bytes())
    (ckpt_dir / "hf_quant_config.json").write_text(
        json.dumps(
            {"producer": {"name": "modelopt"}, "quantization": {"quant_algo": "NVFP4", "kv_cache_quant_algo": "FP8"}}
        )
    )
    ckpt = read_checkpoint(str(ckpt_dir))
    assert (ckpt.quant_algo, ckpt.kv_cache_quant_algo) == ("NVFP4", "FP8")
    config = TrtllmConfig(model=str(ckpt_dir), dtype="bfloat16")
    assert build.kv_dtype(config, ckpt) == "float8_e4m3fn"  # the checkpoint's FP8 KV scales are used
    build.check_checkpoint(TrtllmConfig(model=str(ckpt_dir), trtllm=TrtllmOptions(quant="nvfp4")), ckpt, "pytorch")


def test_a_missing_model_directory(tmp_path):
    with pytest.raises(ModelNotFoundError, match="no config.json"):
        read_checkpoint(str(tmp_path / "nope"))


def test_the_backend_follows_the_directory(tiny_llama, tmp_path):
    hf, eng = read_checkpoint(str(tiny_llama)), read_checkpoint(str(engine_dir(tmp_path / "e", 16)))
    assert build.choose_backend(TrtllmConfig(model="m"), hf) == "pytorch"
    assert build.choose_backend(TrtllmConfig(model="m"), eng) == "tensorrt"
    assert build.choose_backend(TrtllmConfig(model="m", trtllm=TrtllmOptions(backend="tensorrt")), hf) == "tensorrt"
    with pytest.raises(EngineUnavailableError, match="--trtllm-backend tensorrt"):
        build.choose_backend(TrtllmConfig(model="m", trtllm=TrtllmOptions(backend="pytorch")), eng)


@pytest.mark.parametrize(
    "config,backend,message",
    [
        (dict(quant="fp8"), "pytorch", "not quantized as FP8 .*ModelOpt.*--qformat fp8"),
        (dict(quant="nvfp4"), "pytorch", "not quantized as NVFP4"),
    ],
)
def test_the_pytorch_backend_needs_a_checkpoint_quantized_as_asked(tiny_llama, config, backend, message):
    ckpt = read_checkpoint(str(tiny_llama))
    with pytest.raises(EngineUnavailableError, match=message):
        build.check_checkpoint(TrtllmConfig(model="m", trtllm=TrtllmOptions(**config)), ckpt, backend)
    build.check_checkpoint(
        TrtllmConfig(model="m", trtllm=TrtllmOptions(**config)), ckpt, "tensorrt"
    )  # it quantizes at build


def test_an_engine_must_match_the_block_size_and_quantization_it_was_built_with(tmp_path):
    ckpt = read_checkpoint(str(engine_dir(tmp_path / "e", 64)))
    with pytest.raises(EngineUnavailableError, match="--block-size 64"):
        build.check_checkpoint(TrtllmConfig(model="m", cache=CacheConfig(block_size=16)), ckpt, "tensorrt")
    with pytest.raises(EngineUnavailableError, match="rebuild the engine"):
        build.check_checkpoint(
            TrtllmConfig(model="m", cache=CacheConfig(block_size=64), trtllm=TrtllmOptions(quant="fp8")),
            ckpt,
            "tensorrt",
        )
    with pytest.raises(EngineUnavailableError, match="without an FP8 KV cache"):
        build.check_checkpoint(
            TrtllmConfig(model="m", cache=CacheConfig(block_size=64), trtllm=TrtllmOptions(kv_cache_dtype="fp8")),
            ckpt,
            "tensorrt",
        )
    with pytest.raises(EngineUnavailableError, match="built for 8192 tokens, not 9000"):
        build.max_model_len(TrtllmConfig(model="m", batch=BatchConfig(max_model_len=9000)), ckpt)


def test_the_kv_cache_takes_the_memory_budget_less_the_weights(tmp_path):
    ckpt = read_checkpoint(str(engine_dir(tmp_path / "e", 16)))  # 32 layers, 8 kv heads of 128: 128 KiB a token
    config = TrtllmConfig(model="m", cache=CacheConfig(gpu_memory_utilization=0.5), dtype="bfloat16")
    assert build.kv_bytes_per_token(config, ckpt) == 2 * 32 * 8 * 128 * 2
    size = build.kv_cache_size(config, ckpt, total_bytes=80 * GIB)
    want_blocks = int((0.5 * 80 * GIB - 1000) // (2 * 32 * 8 * 128 * 2 * 16))
    assert size == {"max_tokens": want_blocks * 16, "free_gpu_memory_fraction": 0.9}
    fp8 = build.kv_cache_size(
        TrtllmConfig(model="m", cache=HALF, trtllm=TrtllmOptions(kv_cache_dtype="fp8")), ckpt, 80 * GIB
    )
    assert fp8["max_tokens"] == pytest.approx(2 * size["max_tokens"], abs=16)  # one byte a value, not two
    tp2 = build.kv_cache_size(
        TrtllmConfig(model="m", cache=HALF, trtllm=TrtllmOptions(tensor_parallel_size=2)), ckpt, 80 * GIB
    )
    assert tp2["max_tokens"] == pytest.approx(2 * size["max_tokens"], abs=16)  # each rank holds half the heads
    assert build.kv_cache_size(TrtllmConfig(model="m", cache=CacheConfig(num_blocks=100)), ckpt, 80 * GIB) == {
        "max_tokens": 1600
    }
    with pytest.raises(EngineUnavailableError, match="leaves no room for KV"):
        build.kv_cache_size(config, ckpt, total_bytes=1000)


def test_llm_arguments_for_a_hugging_face_checkpoint(tiny_llama, tmp_path):
    ckpt = read_checkpoint(str(tiny_llama))
    config = TrtllmConfig(
        model=str(tiny_llama),
        dtype="bfloat16",
        batch=BatchConfig(8, 1024),
        cache=CacheConfig(num_blocks=64),
        trtllm=TrtllmOptions(kv_cache_dtype="fp8", cache_transceiver="UCX"),
    )
    cls, kwargs = build.llm_arguments(config, ckpt, "pytorch", fake_api(), 80 * GIB)
    assert cls is LLM
    assert kwargs == {
        "model": str(tiny_llama),
        "tensor_parallel_size": 1,
        "dtype": "bfloat16",
        "max_batch_size": 8,
        "max_num_tokens": 1024,
        "max_seq_len": 512,
        "cache_transceiver_config": CacheTransceiverConfig(backend="UCX"),
        "enable_iter_perf_stats": True,
        "guided_decoding_backend": "llguidance",
        "kv_cache_config": KvCacheConfig(
            enable_block_reuse=True, tokens_per_block=16, event_buffer_max_size=16384, max_tokens=1024, dtype="fp8"
        ),
    }
    options = tmp_path / "extra.json"
    options.write_text(json.dumps({"cuda_graph_config": {"max_batch_size": 8}, "max_batch_size": 4}))
    no_reuse = TrtllmConfig(
        model="m",
        batch=BatchConfig(enable_prefix_caching=False),
        cache=CacheConfig(num_blocks=8),
        trtllm=TrtllmOptions(cache_transceiver="off", options=str(options)),
    )
    _, kwargs = build.llm_arguments(no_reuse, ckpt, "pytorch", fake_api(), 80 * GIB)
    assert "cache_transceiver_config" not in kwargs and kwargs["max_batch_size"] == 4  # the file wins
    assert kwargs["cuda_graph_config"] == {"max_batch_size": 8}
    kv = kwargs["kv_cache_config"]
    assert kv.enable_block_reuse is False and kv.event_buffer_max_size == 0


def test_llm_arguments_quantize_through_quant_config_on_the_tensorrt_backend(tiny_llama, tmp_path):
    ckpt = read_checkpoint(str(tiny_llama))
    config = TrtllmConfig(
        model="m", cache=CacheConfig(num_blocks=8), trtllm=TrtllmOptions(quant="nvfp4", kv_cache_dtype="fp8")
    )
    cls, kwargs = build.llm_arguments(config, ckpt, "tensorrt", fake_api(), 80 * GIB)
    assert cls is fake_api().TrtLLM and "enable_iter_perf_stats" not in kwargs
    assert (kwargs["quant_config"].quant_algo, kwargs["quant_config"].kv_cache_quant_algo) == (
        QuantAlgo.NVFP4,
        QuantAlgo.FP8,
    )
    eng = read_checkpoint(str(engine_dir(tmp_path / "e", 16)))
    _, kwargs = build.llm_arguments(
        TrtllmConfig(model="m", cache=CacheConfig(num_blocks=8)), eng, "tensorrt", fake_api(), 80 * GIB
    )
    assert set(kwargs) == {"model", "tensor_parallel_size", "cache_transceiver_config", "kv_cache_config"}


@pytest.mark.parametrize("text,message", [("{not json", "Expecting"), ("[1, 2]", "expected a JSON object")])
def test_a_bad_options_file_is_a_start_up_error(tmp_path, text, message):
    (tmp_path / "o.json").write_text(text)
    with pytest.raises(EngineUnavailableError, match=message):
        build.extra_options(str(tmp_path / "o.json"))
    with pytest.raises(EngineUnavailableError, match="No such file"):
        build.extra_options(str(tmp_path / "missing.json"))
