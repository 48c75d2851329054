"""How a TrtllmConfig and a checkpoint become TensorRT-LLM's LLM(...) arguments: which backend, the KV cache
(block size, reuse, events, its size from the worker's GPU memory budget, FP8), quantization through
TensorRT-LLM's own QuantConfig, the cache transceiver that moves KV between workers. Pure: the classes
come in through TrtllmApi and the GPU's memory figures as plain numbers."""

import json
from pathlib import Path
from typing import Any

from engines.base.errors import EngineUnavailableError
from engines.trtllm.api import TrtllmApi
from engines.trtllm.checkpoint import FP8_KV, Checkpoint
from engines.trtllm.config import TrtllmConfig

EVENT_BUFFER = 16384  # KV events TensorRT-LLM keeps until the adapter drains them (every few ms)
FREE_FRACTION_CEILING = 0.9  # TensorRT-LLM's own cap on the free memory (measured after load) its KV may take
_QUANT = {"fp8": "FP8", "nvfp4": "NVFP4"}
_DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}


def choose_backend(cfg: TrtllmConfig, ckpt: Checkpoint) -> str:
    backend = cfg.trtllm.backend if cfg.trtllm.backend != "auto" else ("tensorrt" if ckpt.is_engine else "pytorch")
    if backend == "pytorch" and ckpt.is_engine:
        raise EngineUnavailableError(
            f"{ckpt.path} is a TensorRT engine directory: start the worker with --trtllm-backend tensorrt (or auto)"
        )
    return backend


def check_checkpoint(cfg: TrtllmConfig, ckpt: Checkpoint, backend: str) -> None:
    """Refuse, with the fix, what TensorRT-LLM would not do as asked: a quantization the checkpoint does not
    have (PyTorch backend, engines), a KV block size other than the engine's."""
    wanted = _QUANT.get(cfg.trtllm.quant)
    fixed = ckpt.is_engine or backend == "pytorch"  # only the tensorrt backend quantizes a HF checkpoint
    if wanted and fixed and ckpt.quant_algo != wanted:
        how = (
            "rebuild the engine with that quantization"
            if ckpt.is_engine
            else "use a ModelOpt checkpoint of it (NVIDIA ModelOpt's hf_ptq.py --qformat "
            f"{cfg.trtllm.quant}) or --trtllm-backend tensorrt, which quantizes through QuantConfig at build"
        )
        found = ckpt.quant_algo or "not quantized"
        raise EngineUnavailableError(f"{ckpt.path} is not quantized as {wanted} (it is {found}): {how}")
    if ckpt.is_engine and cfg.trtllm.kv_cache_dtype == "fp8" and ckpt.kv_cache_quant_algo != "FP8":
        raise EngineUnavailableError(f"{ckpt.path} was built without an FP8 KV cache: rebuild it with one")
    if ckpt.tokens_per_block and ckpt.tokens_per_block != cfg.cache.block_size:
        raise EngineUnavailableError(
            f"{ckpt.path} was built with tokens_per_block={ckpt.tokens_per_block}: "
            f"start the worker with --block-size {ckpt.tokens_per_block}"
        )


def kv_dtype(cfg: TrtllmConfig, ckpt: Checkpoint) -> str:
    return FP8_KV if "fp8" in (cfg.trtllm.kv_cache_dtype, (ckpt.kv_cache_quant_algo or "").lower()) else cfg.dtype


def kv_bytes_per_token(cfg: TrtllmConfig, ckpt: Checkpoint) -> int:
    width = 1 if kv_dtype(cfg, ckpt) == FP8_KV else _DTYPE_BYTES.get(cfg.dtype, 2)
    return 2 * ckpt.num_layers * ckpt.num_kv_heads * ckpt.head_dim * width  # K and V


def kv_cache_size(cfg: TrtllmConfig, ckpt: Checkpoint, total_bytes: int) -> dict[str, Any]:
    """KvCacheConfig sizing. num_blocks wins; else the KV gets gpu_memory_utilization of the card less this
    rank's weights (vLLM's meaning, activations aside), and TensorRT-LLM's free-memory fraction stays a
    ceiling, so the cache never takes memory the load left in use."""
    cache = cfg.cache
    if cache.num_blocks:
        return {"max_tokens": cache.num_blocks * cache.block_size}
    tp = cfg.trtllm.tensor_parallel_size
    budget = cache.gpu_memory_utilization * total_bytes - ckpt.weight_bytes / tp
    block_bytes = kv_bytes_per_token(cfg, ckpt) / tp * cache.block_size
    if budget < block_bytes:
        raise EngineUnavailableError(
            f"gpu_memory_utilization={cache.gpu_memory_utilization} of {total_bytes / 2**30:.1f} GiB leaves no room "
            f"for KV after {ckpt.weight_bytes / tp / 2**30:.1f} GiB of weights: raise it or use more GPUs"
        )
    return {
        "max_tokens": int(budget // block_bytes) * cache.block_size,
        "free_gpu_memory_fraction": FREE_FRACTION_CEILING,
    }


def llm_arguments(
    cfg: TrtllmConfig, ckpt: Checkpoint, backend: str, api: TrtllmApi, total_bytes: int
) -> tuple[Any, dict[str, Any]]:
    """(the LLM class, its keyword arguments)."""
    kv = {
        "enable_block_reuse": cfg.batch.enable_prefix_caching,
        "tokens_per_block": cfg.cache.block_size,
        "event_buffer_max_size": EVENT_BUFFER if cfg.batch.enable_prefix_caching else 0,
        **kv_cache_size(cfg, ckpt, total_bytes),
    }
    kwargs: dict[str, Any] = {"model": str(ckpt.path), "tensor_parallel_size": cfg.trtllm.tensor_parallel_size}
    if not ckpt.is_engine:  # an engine's dtype and limits were fixed when it was built
        kwargs.update(
            dtype=cfg.dtype,
            max_batch_size=cfg.batch.max_num_seqs,
            max_num_tokens=cfg.batch.max_num_batched_tokens,
            max_seq_len=max_model_len(cfg, ckpt),
        )
    if cfg.disaggregation:
        kwargs["cache_transceiver_config"] = api.CacheTransceiverConfig(backend=cfg.trtllm.cache_transceiver)
    if backend == "pytorch":
        kv["dtype"] = "fp8" if cfg.trtllm.kv_cache_dtype == "fp8" else "auto"  # auto: the checkpoint's
        kwargs["enable_iter_perf_stats"] = True  # the stats tandem's gauges read
        kwargs["guided_decoding_backend"] = "llguidance"  # structured requests: the grammars tandem's gateway checks
    elif not ckpt.is_engine and (quant := quant_config(cfg, api)) is not None:
        kwargs["quant_config"] = quant
    kwargs["kv_cache_config"] = api.KvCacheConfig(**kv)
    kwargs.update(extra_options(cfg.trtllm.options))
    return (api.LLM if backend == "pytorch" else api.TrtLLM), kwargs


def quant_config(cfg: TrtllmConfig, api: TrtllmApi) -> Any:
    algo = getattr(api.QuantAlgo, _QUANT[cfg.trtllm.quant]) if cfg.trtllm.quant else None
    kv_algo = api.QuantAlgo.FP8 if cfg.trtllm.kv_cache_dtype == "fp8" else None
    if algo is None and kv_algo is None:
        return None
    return api.QuantConfig(quant_algo=algo, kv_cache_quant_algo=kv_algo)


def max_model_len(cfg: TrtllmConfig, ckpt: Checkpoint) -> int:
    asked = cfg.batch.max_model_len
    if ckpt.is_engine and asked > ckpt.max_position:
        raise EngineUnavailableError(f"{ckpt.path} was built for {ckpt.max_position} tokens, not {asked}")
    return asked or ckpt.max_position


def extra_options(path: str) -> dict[str, Any]:
    if not path:
        return {}
    try:
        options = json.loads(Path(path).read_text())
    except (OSError, ValueError) as exc:
        raise EngineUnavailableError(f"--trtllm-options {path}: {exc}") from None
    if not isinstance(options, dict):
        raise EngineUnavailableError(f"--trtllm-options {path}: expected a JSON object of LLM(...) arguments")
    return options
