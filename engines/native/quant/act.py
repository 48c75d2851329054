"""Activations that reach an FP8 linear layer already quantized, and how a layer asks for them.

A layer that multiplies in FP8 declares `input_quant(num_rows)`: None (give me the activations as
they are), or an ActQuant (static: the calibrated per-tensor scale; dynamic: one scale per row). The
op that produces its input (RMSNorm, SiLU-mul) then writes FP8 directly, as its epilogue.
"""

from dataclasses import dataclass

import torch

from engines.native.quant import formats


@dataclass(frozen=True, slots=True)
class ActQuant:
    static_scale: torch.Tensor | None = None  # [] float32 from calibration; None: one scale per row


@dataclass(frozen=True, slots=True)
class Fp8Act:
    data: torch.Tensor  # [num_rows, features] float8_e4m3fn
    scale: torch.Tensor  # [num_rows] float32 per row, or [] per tensor

    @property
    def shape(self) -> torch.Size:
        return self.data.shape

    def row_scales(self) -> torch.Tensor:
        """[num_rows, 1] float32, as torch._scaled_mm's row-wise scale_a wants it."""
        if self.scale.dim():
            return self.scale[:, None]
        return self.scale.reshape(1, 1).expand(self.data.shape[0], 1).contiguous()

    def dequantize(self) -> torch.Tensor:
        return self.data.float() * self.row_scales()


def quantize_act_reference(x: torch.Tensor, quant: ActQuant) -> Fp8Act:
    """The plain-PyTorch quantization the kernels' FP8 epilogues are checked against."""
    if quant.static_scale is not None:
        return Fp8Act(formats.to_fp8(x, quant.static_scale), quant.static_scale)
    return Fp8Act(*formats.quantize_fp8_rows(x))
