"""The offline half of quantization: read a Hugging Face checkpoint, write a copy whose linear
projections are FP8 or NVFP4, plus `tandem_quant.json`. Loading it swaps in the quantized layers.

NOTE: NVFP4 shards that the model merges (q/k/v, gate/up) share one tensor scale, so the merged
layer needs one scale; FP8's per-channel scales concatenate as they are.
"""

import shutil
from collections.abc import Iterator
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import save_file

from engines.native.models import LlamaForCausalLM
from engines.native.quant import formats
from engines.native.quant.swap import FORMATS, QuantConfig, read_quant_config, write_quant_config

# checkpoint projection names -> the merged module they load into (ours for o/down are themselves)
_CHECKPOINT_PROJECTIONS = {frag: merged for frag, (merged, _) in LlamaForCausalLM.packed_modules.items()}
_CHECKPOINT_PROJECTIONS.update({"o_proj": "o_proj", "down_proj": "down_proj"})
_COPIED_SUFFIXES = (".json", ".txt", ".model", ".jinja")


def quantize_checkpoint(
    src: str | Path, dst: str | Path, fmt: str, device: str = "cpu", kv_cache_scales: tuple[float, ...] = ()
) -> Path:
    """Write the quantized copy of `src` into `dst`; returns `dst`. Scales calibrated for `src` (its
    tandem_quant.json) carry over; `kv_cache_scales` replaces its KV scales when given."""
    if fmt not in FORMATS:
        raise ValueError(f"quantization format must be one of {FORMATS}, got {fmt!r}")
    src, dst = Path(src), Path(dst)
    calibrated = read_quant_config(src) or QuantConfig(None)
    dst.mkdir(parents=True, exist_ok=True)
    for path in src.iterdir():
        if path.is_file() and path.suffix in _COPIED_SUFFIXES and path.name != "model.safetensors.index.json":
            shutil.copy2(path, dst / path.name)
    files = sorted(src.glob("*.safetensors"))
    group_scales = _nvfp4_group_scales(files, device) if fmt == "nvfp4" else {}
    out = dict(quantize_tensors(_read(files, device), fmt, group_scales))
    save_file({k: v.cpu().clone() for k, v in out.items()}, str(dst / "model.safetensors"))
    write_quant_config(
        dst, QuantConfig(fmt, tuple(kv_cache_scales) or calibrated.kv_cache_scales, calibrated.input_scales)
    )
    return dst


def quantize_tensors(tensors, fmt: str, group_scales: dict[str, torch.Tensor]) -> Iterator[tuple[str, torch.Tensor]]:
    """(name, tensor) pairs of a checkpoint -> the quantized checkpoint's pairs."""
    for name, tensor in tensors:
        if not is_quantized_weight(name):
            yield name, tensor
            continue
        stem = name.removesuffix(".weight")
        if fmt == "fp8":
            q, scale = formats.quantize_fp8_rows(tensor)
            yield from ((f"{stem}.weight", q), (f"{stem}.weight_scale", scale))
        else:
            q, block_scale, global_scale = formats.quantize_nvfp4(tensor, group_scales.get(group_of(name)))
            yield from (
                (f"{stem}.weight", q),
                (f"{stem}.weight_scale", block_scale),
                (f"{stem}.weight_scale_2", global_scale),
            )


def is_quantized_weight(name: str) -> bool:
    parts = name.split(".")
    return len(parts) >= 2 and parts[-1] == "weight" and parts[-2] in _CHECKPOINT_PROJECTIONS


def group_of(name: str) -> str:
    """The merged module a checkpoint weight loads into, e.g. '...self_attn.qkv_proj'."""
    stem, proj = name.removesuffix(".weight").rsplit(".", 1)
    return f"{stem}.{_CHECKPOINT_PROJECTIONS[proj]}"


def _nvfp4_group_scales(files: list[Path], device: str) -> dict[str, torch.Tensor]:
    amax: dict[str, torch.Tensor] = {}
    for name, tensor in _read(files, device):
        if is_quantized_weight(name):
            group, value = group_of(name), tensor.float().abs().amax()
            amax[group] = torch.maximum(amax[group], value) if group in amax else value
    return {group: formats.nvfp4_global_scale(value) for group, value in amax.items()}


def _read(files: list[Path], device: str) -> Iterator[tuple[str, torch.Tensor]]:
    for path in files:
        with safe_open(str(path), framework="pt", device="cpu") as f:
            for name in f.keys():
                yield name, f.get_tensor(name).to(device)
