"""Build a model on the meta device and fill it once from safetensors shards (memory-mapped)."""

import json
from pathlib import Path

import torch
from safetensors import safe_open

from engines.base.errors import ModelNotFoundError
from engines.native.config import ModelConfig
from engines.native.models import LlamaForCausalLM
from engines.native.quant.swap import read_quant_config, swap_linears

# NOTE: rotary inverse frequencies are recomputed, never loaded.
_SKIPPED_SUFFIXES = ("rotary_emb.inv_freq",)


def load_model(model_dir: str | Path, cfg: ModelConfig, backend, dtype: torch.dtype, device: str):
    files = _weight_files(Path(model_dir))
    with torch.device("meta"):
        model = LlamaForCausalLM(cfg, backend)
    model = model.to_empty(device=device).to(dtype)
    if cfg.tie_word_embeddings:  # to_empty unties shared parameters; tie them again
        model.lm_head.weight = model.model.embed_tokens.weight
    quant = read_quant_config(model_dir)
    if quant is not None:  # NOTE: after .to(dtype), which would cast FP8 weights too
        swap_linears(model, quant.format, device, quant.input_scales)
    params = dict(model.named_parameters())
    loaded: set[str] = set()
    for path in files:
        with safe_open(str(path), framework="pt", device="cpu") as f:
            for name in f.keys():
                if name.endswith(_SKIPPED_SUFFIXES) or (cfg.tie_word_embeddings and name == "lm_head.weight"):
                    continue
                loaded.add(_load_one(model, params, name, f.get_tensor(name)))
    missing = set(params) - loaded - ({"lm_head.weight"} if cfg.tie_word_embeddings else set())
    if missing:
        raise ModelNotFoundError(f"checkpoint in {str(model_dir)!r} lacks weights: {sorted(missing)[:5]}")
    return model.eval()


def _load_one(model, params: dict, name: str, tensor: torch.Tensor) -> str:
    """Copy one checkpoint tensor into its parameter; returns the parameter's name."""
    for fragment, (merged, shard) in model.packed_modules.items():
        if f".{fragment}." in name:
            target = name.replace(fragment, merged)
            module_name, param_name = target.rsplit(".", 1)
            model.get_submodule(module_name).load_shard(param_name, tensor, shard)
            return target
    param = params.get(name)
    if param is None:
        raise ModelNotFoundError(f"unexpected checkpoint tensor {name!r}")
    if param.shape != tensor.shape:
        raise ModelNotFoundError(f"{name}: shape {tuple(tensor.shape)}, expected {tuple(param.shape)}")
    param.data.copy_(tensor)
    return name


def _weight_files(model_dir: Path) -> list[Path]:
    if not model_dir.is_dir():
        raise ModelNotFoundError(f"model directory {str(model_dir)!r} does not exist")
    index = model_dir / "model.safetensors.index.json"
    if index.is_file():
        names = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        return [model_dir / n for n in names]
    files = sorted(model_dir.glob("*.safetensors"))
    if not files:
        raise ModelNotFoundError(f"no *.safetensors weights in {str(model_dir)!r}")
    return files
