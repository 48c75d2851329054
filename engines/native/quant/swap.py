"""The runtime module swap: replace the linear projections of a built model with the quantized
layers a checkpoint's `tandem_quant.json` names. lm_head and embeddings stay in the model dtype.

`tandem_quant.json`: {"format": "fp8" | "nvfp4" | null (weights as they are), "kv_cache_scales":
[k0, v0, k1, v1, ...], "input_scales": {module name: static FP8 activation scale}}; the scales come
from `tandem model calibrate`."""

import json
from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch import nn

from engines.native.layers.linear import Linear, MergedLinear
from engines.native.quant.gpu_modules import Fp8LinearScaledMm, Nvfp4LinearTriton
from engines.native.quant.modules import Fp8Linear, Nvfp4Linear

QUANT_CONFIG = "tandem_quant.json"
FORMATS = ("fp8", "nvfp4")
# our module names whose Linear is quantized (merged names: the checkpoint's q/k/v and gate/up land here)
QUANTIZED_MODULES = ("qkv_proj", "o_proj", "gate_up_proj", "down_proj")


@dataclass(frozen=True, slots=True)
class QuantConfig:
    format: str | None  # "fp8" | "nvfp4"; None: weights stay in the model dtype (scales only)
    kv_cache_scales: tuple[float, ...] = ()  # per layer (k, v), from calibration; empty: 1.0 everywhere
    input_scales: dict[str, float] = field(default_factory=dict)  # module name -> static FP8 activation scale

    def __post_init__(self) -> None:
        if self.format is not None and self.format not in FORMATS:
            raise ValueError(f"quantization format must be one of {FORMATS} or null, got {self.format!r}")
        if any(not s > 0 for s in (*self.kv_cache_scales, *self.input_scales.values())):
            raise ValueError(f"{QUANT_CONFIG}: every scale must be > 0")

    def to_json(self) -> dict:
        return {
            "format": self.format,
            "kv_cache_scales": list(self.kv_cache_scales),
            "input_scales": dict(self.input_scales),
        }


def read_quant_config(model_dir: str | Path) -> QuantConfig | None:
    path = Path(model_dir) / QUANT_CONFIG
    if not path.is_file():
        return None
    raw = json.loads(path.read_text())
    return QuantConfig(raw.get("format"), tuple(raw.get("kv_cache_scales", ())), dict(raw.get("input_scales", {})))


def write_quant_config(model_dir: str | Path, config: QuantConfig) -> Path:
    path = Path(model_dir) / QUANT_CONFIG
    path.write_text(json.dumps(config.to_json(), indent=2) + "\n")
    return path


def swap_linears(model: nn.Module, fmt: str | None, device: str, input_scales: dict[str, float] | None = None) -> int:
    """Replace each quantizable Linear in place; returns how many were swapped. A static activation
    scale from `input_scales` goes to the layer of that name (used by the FP8 GPU layer)."""
    if fmt is None:
        return 0
    cls = _layer_class(fmt, device)
    input_scales = input_scales or {}
    swapped = 0
    for name, module in list(model.named_modules()):
        if not isinstance(module, Linear) or name.rsplit(".", 1)[-1] not in QUANTIZED_MODULES:
            continue
        shards = (
            {k: size for k, (_, size) in module.offsets.items()}
            if isinstance(module, MergedLinear)
            else {"": module.weight.shape[0]}
        )
        dtype = module.weight.dtype
        with torch.device(device):
            new = cls(module.weight.shape[1], shards, bias=module.bias is not None, dtype=dtype)
            if name in input_scales:
                new.input_scale = torch.tensor(input_scales[name], dtype=torch.float32)
        parent, attr = _parent(model, name)
        setattr(parent, attr, new)
        swapped += 1
    return swapped


def _layer_class(fmt: str, device: str) -> type:
    is_cuda = device.startswith("cuda")
    if fmt == "fp8":
        # NOTE: FP8 tensor cores start at compute capability 8.9 (Ada, Hopper)
        return Fp8LinearScaledMm if is_cuda and torch.cuda.get_device_capability(device) >= (8, 9) else Fp8Linear
    if fmt == "nvfp4":
        return Nvfp4LinearTriton if is_cuda else Nvfp4Linear
    raise ValueError(f"unknown quantization format {fmt!r}")


def _parent(model: nn.Module, name: str) -> tuple[nn.Module, str]:
    parent_name, _, attr = name.rpartition(".")
    return (model.get_submodule(parent_name) if parent_name else model), attr
