"""The model's small elementwise ops, in two implementations a model picks once: plain PyTorch (CPU,
and the reference) and fused Triton kernels (layers/triton_ops.py). An attention backend names the
one that goes with it (`backend.ops`), so the torch backend runs no Triton at all.
"""

import torch
from torch import nn

from engines.native.quant.act import ActQuant, Fp8Act, quantize_act_reference


class TorchOps:
    def add_rms_norm(self, x: torch.Tensor, residual: torch.Tensor | None, norm, quant: ActQuant | None = None):
        """(norm(x + residual), x + residual); with no residual, (norm(x), x). The first comes back as
        an Fp8Act when `quant` asks for one (for the FP8 layer that reads it)."""
        if residual is not None:
            x = x + residual
        return self._maybe_quant(norm(x), quant), x

    def silu_mul(self, gate_up: torch.Tensor, quant: ActQuant | None = None):
        """SiLU(gate) * up over [num_tokens, 2 * n]; an Fp8Act when `quant` asks for one."""
        gate, up = gate_up.chunk(2, dim=-1)
        return self._maybe_quant(nn.functional.silu(gate) * up, quant)

    @staticmethod
    def _maybe_quant(x: torch.Tensor, quant: ActQuant | None):
        return x if quant is None else quantize_act_reference(x, quant)


TORCH_OPS = TorchOps()
__all__ = ["TORCH_OPS", "Fp8Act", "TorchOps"]
