"""The model's small ops as fused Triton kernels (layers/ops.py's TorchOps is the reference): the
residual add inside RMSNorm, SiLU-mul in one pass, and either one writing FP8 for an FP8 layer."""

import torch

from engines.native.kernels.rms_norm import QUANT_DYNAMIC, QUANT_NONE, QUANT_STATIC, rms_norm
from engines.native.kernels.silu_mul import silu_mul
from engines.native.layers.ops import TorchOps
from engines.native.quant.act import ActQuant, Fp8Act


class TritonOps(TorchOps):
    def add_rms_norm(self, x: torch.Tensor, residual: torch.Tensor | None, norm, quant: ActQuant | None = None):
        mode, scale = _mode(quant)
        out, new_residual, out_scale = rms_norm(x, norm.weight, norm.eps, residual, mode, scale)
        return _wrap(out, out_scale, quant), (x if residual is None else new_residual)

    def silu_mul(self, gate_up: torch.Tensor, quant: ActQuant | None = None):
        mode, scale = _mode(quant)
        out, out_scale = silu_mul(gate_up, mode, scale)
        return _wrap(out, out_scale, quant)


def _mode(quant: ActQuant | None) -> tuple[int, torch.Tensor | None]:
    if quant is None:
        return QUANT_NONE, None
    return (QUANT_DYNAMIC, None) if quant.static_scale is None else (QUANT_STATIC, quant.static_scale)


def _wrap(out: torch.Tensor, scale: torch.Tensor | None, quant: ActQuant | None):
    return out if quant is None else Fp8Act(out, scale)


TRITON_OPS = TritonOps()
