"""What the adapter reads from a model directory before TensorRT-LLM loads it: the KV layout, the context
length, the EOS ids, how it is quantized and how many bytes of weights it holds. Pure file reading: no
tensorrt_llm, no torch."""

import json
from dataclasses import dataclass
from pathlib import Path

from engines.base.errors import ModelNotFoundError

FP8_KV = "float8_e4m3fn"


@dataclass(frozen=True, slots=True)
class Checkpoint:
    path: Path
    is_engine: bool  # a prebuilt TensorRT engine directory (trtllm-build), not a Hugging Face checkpoint
    num_layers: int
    num_kv_heads: int
    head_dim: int
    max_position: int  # the longest sequence it was built or trained for
    vocab_size: int = 0
    eos_token_ids: tuple[int, ...] = ()
    quant_algo: str | None = None  # ModelOpt / TensorRT-LLM names: "FP8", "NVFP4", ...
    kv_cache_quant_algo: str | None = None
    tokens_per_block: int | None = None  # engines only: fixed at build
    weight_bytes: int = 0


def read_checkpoint(model: str) -> Checkpoint:
    path = Path(model)
    config_path = path / "config.json"
    if not config_path.is_file():
        raise ModelNotFoundError(
            f"{model}: no config.json (need a Hugging Face checkpoint or a TensorRT engine directory)"
        )
    config = json.loads(config_path.read_text())
    if "pretrained_config" in config and "build_config" in config:
        return _engine_dir(path, config)
    return _hf_dir(path, config)


def _hf_dir(path: Path, config: dict) -> Checkpoint:
    heads = config["num_attention_heads"]
    quant = _modelopt_quant(path, config)
    return Checkpoint(
        path=path,
        is_engine=False,
        num_layers=config["num_hidden_layers"],
        num_kv_heads=config.get("num_key_value_heads") or heads,
        head_dim=config.get("head_dim") or config["hidden_size"] // heads,
        max_position=config.get("max_position_embeddings", 0),
        vocab_size=config.get("vocab_size", 0),
        eos_token_ids=_eos_ids(path, config),
        quant_algo=quant.get("quant_algo"),
        kv_cache_quant_algo=quant.get("kv_cache_quant_algo"),
        weight_bytes=_file_bytes(path, ("*.safetensors", "*.bin")),
    )


def _engine_dir(path: Path, config: dict) -> Checkpoint:
    pretrained, build = config["pretrained_config"], config["build_config"]
    heads = pretrained["num_attention_heads"]
    quant = pretrained.get("quantization") or {}
    return Checkpoint(
        path=path,
        is_engine=True,
        num_layers=pretrained["num_hidden_layers"],
        num_kv_heads=pretrained.get("num_key_value_heads") or heads,
        head_dim=pretrained.get("head_size") or pretrained["hidden_size"] // heads,
        max_position=build.get("max_seq_len") or pretrained.get("max_position_embeddings", 0),
        vocab_size=pretrained.get("vocab_size", 0),
        eos_token_ids=_eos_ids(path, {}),
        quant_algo=quant.get("quant_algo"),
        kv_cache_quant_algo=quant.get("kv_cache_quant_algo"),
        tokens_per_block=(build.get("plugin_config") or {}).get("tokens_per_block"),
        weight_bytes=_file_bytes(path, ("rank*.engine",)),
    )


def _modelopt_quant(path: Path, config: dict) -> dict:
    """ModelOpt writes hf_quant_config.json; newer exports put the same into config.json's quantization_config."""
    hf_quant = path / "hf_quant_config.json"
    if hf_quant.is_file():
        return json.loads(hf_quant.read_text()).get("quantization", {})
    quant = config.get("quantization_config") or {}
    return quant if quant.get("quant_method") == "modelopt" else {}


def _eos_ids(path: Path, config: dict) -> tuple[int, ...]:
    """config.json's eos_token_id, then generation_config.json's (ints or lists), in order, once each: the
    ids the native engine stops on, so both engines end a request on the same tokens."""
    sources = [config]
    gen = path / "generation_config.json"
    if gen.is_file():
        sources.append(json.loads(gen.read_text()))
    ids: dict[int, None] = {}  # ordered, once each
    for source in sources:
        value = source.get("eos_token_id")
        ids.update((t, None) for t in (value if isinstance(value, list) else [value]) if isinstance(t, int))
    return tuple(ids)


def _file_bytes(path: Path, patterns: tuple[str, ...]) -> int:
    return sum(f.stat().st_size for pattern in patterns for f in path.glob(pattern))
