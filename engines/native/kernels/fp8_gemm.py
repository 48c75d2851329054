"""FP8 weights (E4M3, one fp32 scale per output channel) on a GPU, two ways:

- W8A16 (`fp8_w8a16_matmul`): y = x @ (w * scale).T with the weight converted in registers and bf16
  activations as they are; split over K when the output has few tiles. For a few rows (decode) the
  weight's bytes are the whole cost, and nothing quantizes the activations.
- Activation quantization for the W8A8 tensor-core path (`quantize_fp8_act`): one kernel per row,
  a dynamic per-row scale or a static per-tensor one; `torch._scaled_mm` does the GEMM.
"""

import torch
import triton
import triton.language as tl

from engines.native.kernels.fp8 import store_row
from engines.native.kernels.launch import finish_split_k, num_sms, split_k_for, upcast_dots
from engines.native.kernels.tiles import split_k_tile


@triton.jit
def _w8a16_kernel(
    x_ptr,
    w_ptr,
    ws_ptr,
    out_ptr,
    M,
    N,
    K,
    stride_xm,
    stride_wn,
    stride_os,
    stride_om,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    SPLIT_K: tl.constexpr,
    UPCAST: tl.constexpr,
):
    rm, rn, split, lo, hi = split_k_tile(K, BLOCK_M, BLOCK_N, BLOCK_K, SPLIT_K)
    acc = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
    for k0 in range(lo, hi, BLOCK_K):
        rk = k0 + tl.arange(0, BLOCK_K)
        x = tl.load(
            x_ptr + rm[:, None] * stride_xm + rk[None, :], mask=(rm < M)[:, None] & (rk < hi)[None, :], other=0.0
        )
        w = tl.load(
            w_ptr + rn[:, None] * stride_wn + rk[None, :], mask=(rn < N)[:, None] & (rk < hi)[None, :], other=0.0
        )
        w = w.to(x.dtype)  # NOTE: exact: every E4M3 value is a bf16 / fp16 value
        if UPCAST:
            x, w = x.to(tl.float32), w.to(tl.float32)
        acc += tl.dot(x, tl.trans(w))
    acc = acc * tl.load(ws_ptr + rn, mask=rn < N, other=0.0)[None, :]
    out_mask = (rm < M)[:, None] & (rn < N)[None, :]
    tl.store(
        out_ptr + split * stride_os + rm[:, None] * stride_om + rn[None, :],
        acc.to(out_ptr.dtype.element_ty),
        mask=out_mask,
    )


def fp8_w8a16_matmul(
    x: torch.Tensor,
    weight: torch.Tensor,
    weight_scale: torch.Tensor,
    bias: torch.Tensor | None = None,
    block_m: int = 16,
    block_n: int = 64,
    block_k: int = 128,
    split_k: int | None = None,
    **launch,
) -> torch.Tensor:
    """x: [M, K] bf16/fp16/fp32; weight: [N, K] float8_e4m3fn; weight_scale: [N] fp32. Returns [M, N]
    in x's dtype. split_k None: enough splits to fill the device."""
    x = x.contiguous()
    m, k = x.shape
    n = weight.shape[0]
    grid_mn = (triton.cdiv(m, block_m), triton.cdiv(n, block_n))
    if split_k is None:
        split_k = split_k_for(grid_mn[0] * grid_mn[1], k, block_k, num_sms(x.device))
    direct = split_k == 1 and bias is None  # else fp32 partial sums, finished below
    out = torch.empty(split_k, m, n, dtype=x.dtype if direct else torch.float32, device=x.device)
    _w8a16_kernel[(*grid_mn, split_k)](
        x,
        weight,
        weight_scale,
        out,
        m,
        n,
        k,
        x.stride(0),
        weight.stride(0),
        out.stride(0),
        out.stride(1),
        BLOCK_M=block_m,
        BLOCK_N=block_n,
        BLOCK_K=block_k,
        SPLIT_K=split_k,
        UPCAST=upcast_dots(),
        **launch,
    )
    return out[0] if direct else finish_split_k(out, x.dtype, bias)


@triton.jit
def _quant_kernel(x_ptr, out_ptr, scale_ptr, N, stride_x, stride_o, BLOCK: tl.constexpr, QUANT: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    offs = tl.arange(0, BLOCK)
    mask = offs < N
    x = tl.load(x_ptr + row * stride_x + offs, mask=mask, other=0.0).to(tl.float32)
    store_row(out_ptr + row * stride_o, scale_ptr, row, offs, mask, x, QUANT)


def quantize_fp8_act(x: torch.Tensor, static_scale: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """x: [M, K] -> (float8_e4m3fn [M, K], scale): [M] fp32 per row (dynamic), or static_scale ([])
    when given. Dynamic scales are formats.quantize_fp8_rows's."""
    m, k = x.shape
    out = torch.empty(m, k, dtype=torch.float8_e4m3fn, device=x.device)
    scale = static_scale if static_scale is not None else torch.empty(m, dtype=torch.float32, device=x.device)
    if m:
        block = triton.next_power_of_2(k)
        launch = {"num_warps": min(16, max(1, block // 1024))} if x.is_cuda else {}
        _quant_kernel[(m,)](
            x,
            out,
            scale,
            k,
            x.stride(0),
            out.stride(0),
            BLOCK=block,
            QUANT=1 if static_scale is not None else 2,
            **launch,
        )  # fp8.store_row's modes
    return out, scale
