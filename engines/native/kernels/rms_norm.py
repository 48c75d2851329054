"""RMSNorm in one pass over each row, optionally adding the residual first and quantizing the output
to FP8 for the linear layer that reads it (its epilogue): one read of x (and the residual), one write.

Rounds where Hugging Face's eager code rounds (the residual sum, the normalised row, the product with
the weight, each to the model dtype), so its output equals layers/norm.py's torch path up to fp32
summation order. One program per row, the whole row in registers.
"""

import torch
import triton
import triton.language as tl

from engines.native.kernels.fp8 import store_row

QUANT_NONE, QUANT_STATIC, QUANT_DYNAMIC = 0, 1, 2  # FP8 output: none, one given scale, one scale per row


@triton.jit
def _rms_norm_kernel(
    x_ptr,
    res_ptr,
    w_ptr,
    out_ptr,
    res_out_ptr,
    scale_ptr,
    eps,
    N,
    stride_x,
    stride_r,
    stride_o,
    stride_ro,
    BLOCK: tl.constexpr,
    HAS_RESIDUAL: tl.constexpr,
    QUANT: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    offs = tl.arange(0, BLOCK)
    mask = offs < N
    x = tl.load(x_ptr + row * stride_x + offs, mask=mask, other=0.0)
    dtype = x.dtype
    if HAS_RESIDUAL:
        x = x.to(tl.float32) + tl.load(res_ptr + row * stride_r + offs, mask=mask, other=0.0).to(tl.float32)
        x = x.to(dtype)
        tl.store(res_out_ptr + row * stride_ro + offs, x, mask=mask)
    x32 = x.to(tl.float32)
    rstd = 1.0 / tl.sqrt(tl.sum(x32 * x32, axis=0) / N + eps)
    w = tl.load(w_ptr + offs, mask=mask, other=0.0)
    y = (w.to(tl.float32) * (x32 * rstd).to(dtype).to(tl.float32)).to(w.dtype)
    store_row(out_ptr + row * stride_o, scale_ptr, row, offs, mask, y, QUANT)


def rms_norm(
    x: torch.Tensor,
    weight: torch.Tensor,
    eps: float,
    residual: torch.Tensor | None = None,
    quant: int = QUANT_NONE,
    scale: torch.Tensor | None = None,
):
    """x, residual: [num_tokens, hidden]. Returns (out, new residual or None, scale or None):
    out is weight * norm(x + residual) in weight's dtype, or FP8 with `scale` (QUANT_STATIC: the given
    [] scale; QUANT_DYNAMIC: one per row, returned [num_tokens] float32)."""
    num_rows, n = x.shape
    out_dtype = torch.float8_e4m3fn if quant else weight.dtype
    out = torch.empty(num_rows, n, dtype=out_dtype, device=x.device)
    res_out = torch.empty_like(x) if residual is not None else None
    if quant == QUANT_DYNAMIC:
        scale = torch.empty(num_rows, dtype=torch.float32, device=x.device)
    elif quant == QUANT_STATIC and scale is None:
        raise ValueError("static FP8 output needs its scale")
    if num_rows:
        _rms_norm_kernel[(num_rows,)](
            x,
            residual if residual is not None else x,
            weight,
            out,
            res_out if res_out is not None else x,
            scale if scale is not None else out,
            float(eps),
            n,
            x.stride(0),
            residual.stride(0) if residual is not None else 0,
            out.stride(0),
            res_out.stride(0) if res_out is not None else 0,
            BLOCK=triton.next_power_of_2(n),
            HAS_RESIDUAL=residual is not None,
            QUANT=quant,
            **_warps(n, x.is_cuda),
        )
    return out, res_out, scale if quant else None


def rms_norm_reference(x, weight, eps: float, residual=None):
    """layers/norm.py's arithmetic: (out, new residual or None)."""
    if residual is not None:
        x = x + residual
    x32 = x.float()
    out = weight * (x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype)
    return out, (x if residual is not None else None)


def _warps(n: int, is_cuda: bool) -> dict:
    return {"num_warps": min(16, max(1, triton.next_power_of_2(n) // 512))} if is_cuda else {}
