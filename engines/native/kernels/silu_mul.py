"""SiLU(gate) * up over a merged gate/up projection, optionally quantized to FP8 for the down
projection that reads it (its epilogue): one read of [gate | up], one write of half that size.

Rounds where the eager torch code rounds (silu's output, the product), so it matches
`silu(gate) * up` in the model dtype. One program per row, the whole row in registers.
"""

import torch
import triton
import triton.language as tl

from engines.native.kernels.fp8 import store_row
from engines.native.kernels.rms_norm import QUANT_DYNAMIC, QUANT_NONE, QUANT_STATIC


@triton.jit
def _silu_mul_kernel(x_ptr, out_ptr, scale_ptr, N, stride_x, stride_o, BLOCK: tl.constexpr, QUANT: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    offs = tl.arange(0, BLOCK)
    mask = offs < N
    gate = tl.load(x_ptr + row * stride_x + offs, mask=mask, other=0.0)
    up = tl.load(x_ptr + row * stride_x + N + offs, mask=mask, other=0.0)
    g32 = gate.to(tl.float32)
    act = (g32 / (1.0 + tl.exp(-g32))).to(gate.dtype)
    y = (act.to(tl.float32) * up.to(tl.float32)).to(gate.dtype)
    store_row(out_ptr + row * stride_o, scale_ptr, row, offs, mask, y, QUANT)


def silu_mul(x: torch.Tensor, quant: int = QUANT_NONE, scale: torch.Tensor | None = None):
    """x: [num_tokens, 2 * n] (gate then up). Returns (out [num_tokens, n], scale or None), as
    rms_norm's quant modes: x's dtype, or FP8 with a given [] scale or one scale per row."""
    num_rows, n = x.shape[0], x.shape[1] // 2
    if x.stride(1) != 1:
        raise ValueError("silu_mul needs each row contiguous")
    out = torch.empty(num_rows, n, dtype=torch.float8_e4m3fn if quant else x.dtype, device=x.device)
    if quant == QUANT_DYNAMIC:
        scale = torch.empty(num_rows, dtype=torch.float32, device=x.device)
    elif quant == QUANT_STATIC and scale is None:
        raise ValueError("static FP8 output needs its scale")
    if num_rows:
        block = triton.next_power_of_2(n)
        launch = {"num_warps": min(16, max(1, block // 1024))} if x.is_cuda else {}
        _silu_mul_kernel[(num_rows,)](
            x,
            out,
            scale if scale is not None else out,
            n,
            x.stride(0),
            out.stride(0),
            BLOCK=block,
            QUANT=quant,
            **launch,
        )
    return out, scale if quant else None


def silu_mul_reference(x: torch.Tensor) -> torch.Tensor:
    gate, up = x.chunk(2, dim=-1)
    return torch.nn.functional.silu(gate) * up
