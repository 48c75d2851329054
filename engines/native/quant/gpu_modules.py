"""The quantized linear layers' GPU forms (modules.py holds the CPU references they must agree with).
Each runs the GEMM that is fastest for the batch (quant/dispatch.py):

- FP8: a W8A16 Triton GEMM reading the E4M3 weight with bf16 activations as they are (decode-sized
  batches: nothing to quantize), or W8A8 through torch._scaled_mm with the activations quantized by
  one kernel, or already by the op before (RMSNorm / SiLU-mul writing FP8, see quant/act.py), with a
  calibrated static scale when the checkpoint has one, else one per row.
- NVFP4: the weight dequantized in registers inside a Triton GEMM (split over K for few rows), or
  dequantized to bf16 in one pass and multiplied by cuBLAS (large batches, FLOP-bound).
"""

import torch
from torch import nn

from engines.native.quant import dispatch
from engines.native.quant.act import ActQuant, Fp8Act
from engines.native.quant.modules import Fp8Linear, Nvfp4Linear

W8A16, SCALED_MM, IN_REGISTERS, DEQUANT_CUBLAS = "w8a16", "scaled_mm", "in_registers", "dequant_cublas"
GEMV_MAX_ROWS = 16  # up to here a W8A16 GEMV is assumed best until timed


class Fp8LinearScaledMm(Fp8Linear):
    input_scale: torch.Tensor | None = None  # [] float32 static activation scale (calibration), if any

    def input_quant(self, num_rows: int) -> ActQuant | None:
        if dispatch.known(self._key(num_rows)) != SCALED_MM:
            return None
        return ActQuant(self.input_scale)

    def forward(self, x) -> torch.Tensor:
        if isinstance(x, Fp8Act):
            return self._scaled_mm(x)
        fallback = W8A16 if x.shape[0] <= GEMV_MAX_ROWS else SCALED_MM
        path = dispatch.choose(
            self._key(x.shape[0]),
            {W8A16: lambda: self._w8a16(x), SCALED_MM: lambda: self._scaled_mm(self._quantize(x))},
            fallback,
        )
        return self._w8a16(x) if path == W8A16 else self._scaled_mm(self._quantize(x))

    def _key(self, num_rows: int) -> tuple:
        return ("fp8", self.out_features, self.in_features, dispatch.m_bucket(num_rows))

    def _w8a16(self, x: torch.Tensor) -> torch.Tensor:
        from engines.native.kernels.fp8_gemm import fp8_w8a16_matmul  # lazy: triton only when used

        tiles = {} if x.shape[0] <= GEMV_MAX_ROWS else {"block_m": 64, "split_k": 1}
        return fp8_w8a16_matmul(x, self.weight, self.weight_scale, self.bias, **tiles)

    def _quantize(self, x: torch.Tensor) -> Fp8Act:
        from engines.native.kernels.fp8_gemm import quantize_fp8_act

        return Fp8Act(*quantize_fp8_act(x, self.input_scale))

    def _scaled_mm(self, x: Fp8Act) -> torch.Tensor:
        num_rows = x.shape[0]
        data, scale_a = x.data, x.row_scales()
        pad = -num_rows % 16  # NOTE: FP8 GEMMs want every dimension a multiple of 16
        if pad:
            data = nn.functional.pad(data.view(torch.uint8), (0, 0, 0, pad)).view(data.dtype)
            scale_a = nn.functional.pad(scale_a, (0, 0, 0, pad), value=1.0)
        y = torch._scaled_mm(
            data,
            self.weight.t(),
            scale_a=scale_a,
            scale_b=self.weight_scale[None, :],
            bias=self.bias,
            out_dtype=self.act_dtype,
        )
        return y[:num_rows]


class Nvfp4LinearTriton(Nvfp4Linear):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        fallback = IN_REGISTERS if x.shape[0] <= 256 else DEQUANT_CUBLAS
        key = ("nvfp4", self.out_features, self.in_features, dispatch.m_bucket(x.shape[0]))
        path = dispatch.choose(
            key,
            {IN_REGISTERS: lambda: self._in_registers(x), DEQUANT_CUBLAS: lambda: self._dequant_cublas(x)},
            fallback,
        )
        return self._in_registers(x) if path == IN_REGISTERS else self._dequant_cublas(x)

    def _in_registers(self, x: torch.Tensor) -> torch.Tensor:
        from engines.native.kernels.nvfp4_gemm import nvfp4_matmul  # lazy: triton only when used

        return nvfp4_matmul(x, self.weight, self.weight_scale, self.weight_scale_2, self.bias)

    def _dequant_cublas(self, x: torch.Tensor) -> torch.Tensor:
        from engines.native.kernels.nvfp4_gemm import dequantize_nvfp4

        w = dequantize_nvfp4(self.weight, self.weight_scale, self.weight_scale_2, x.dtype)  # [out, in]
        return nn.functional.linear(x, w, self.bias)
