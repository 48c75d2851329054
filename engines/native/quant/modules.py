"""Quantized linear layers that replace `Linear`/`MergedLinear` at load time (the runtime half of the
offline transform in transform.py). Each holds the checkpoint's quantized tensors under their names and
places merged shards (q/k/v, gate/up) like MergedLinear. These compute the fp32 reference; their GPU
subclasses (gpu_modules.py) are picked by `swap_linears` for the device and must agree with them.
"""

import torch
from torch import nn

from engines.native.quant import formats
from engines.native.quant.formats import NVFP4_BLOCK


class _QuantLinear(nn.Module):
    def __init__(self, in_features: int, shard_sizes: dict[str, int], bias: bool, dtype: torch.dtype):
        super().__init__()
        self.in_features, self.out_features = in_features, sum(shard_sizes.values())
        self.offsets: dict[str, tuple[int, int]] = {}
        start = 0
        for name, size in shard_sizes.items():
            self.offsets[name] = (start, size)
            start += size
        self.bias = _frozen(torch.empty(self.out_features, dtype=dtype)) if bias else None
        self.act_dtype = dtype  # the model's: what the layer returns

    def input_quant(self, num_rows: int):
        """What this layer wants its input quantized as (quant/act.py): None, it quantizes itself."""
        return None

    def load_shard(self, param_name: str, loaded: torch.Tensor, shard: str) -> None:
        start, size = self.offsets[shard]
        param = getattr(self, param_name)
        if param.dim() == 0:  # a tensor scale every shard shares (transform.py makes it so)
            param.data.copy_(loaded)
            return
        if loaded.shape[0] != size or loaded.shape[1:] != param.shape[1:]:
            raise ValueError(f"{shard}.{param_name}: checkpoint shape {tuple(loaded.shape)} does not fit")
        param.data[start : start + size].copy_(loaded)

    def _finish(self, y: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        return (y if self.bias is None else y + self.bias.float()).to(dtype)


class Fp8Linear(_QuantLinear):
    """W8A8: E4M3 weights with one fp32 scale per output channel; activations quantized per token."""

    def __init__(
        self, in_features: int, shard_sizes: dict[str, int], bias: bool = False, dtype: torch.dtype = torch.bfloat16
    ):
        super().__init__(in_features, shard_sizes, bias, dtype)
        self.weight = _frozen(torch.empty(self.out_features, in_features, dtype=formats.FP8))
        self.weight_scale = _frozen(torch.empty(self.out_features, dtype=torch.float32))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self._finish(formats.fp8_linear_reference(x, self.weight, self.weight_scale), x.dtype)


class Nvfp4Linear(_QuantLinear):
    """W4A16: E2M1 weights packed two per byte, E4M3 scales per 16 inputs, one fp32 tensor scale."""

    def __init__(
        self, in_features: int, shard_sizes: dict[str, int], bias: bool = False, dtype: torch.dtype = torch.bfloat16
    ):
        if in_features % NVFP4_BLOCK:
            raise ValueError(f"NVFP4 needs in_features in multiples of {NVFP4_BLOCK}, got {in_features}")
        super().__init__(in_features, shard_sizes, bias, dtype)
        self.weight = _frozen(torch.empty(self.out_features, in_features // 2, dtype=torch.uint8))
        self.weight_scale = _frozen(torch.empty(self.out_features, in_features // NVFP4_BLOCK, dtype=formats.FP8))
        self.weight_scale_2 = _frozen(torch.empty((), dtype=torch.float32))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        w = formats.dequantize_nvfp4(self.weight, self.weight_scale, self.weight_scale_2)  # [out, in] fp32
        return self._finish(x.float() @ w.t(), x.dtype)


def _frozen(t: torch.Tensor) -> nn.Parameter:
    return nn.Parameter(t, requires_grad=False)
