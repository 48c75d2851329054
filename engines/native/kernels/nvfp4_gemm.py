"""NVFP4 weights (E2M1 codes packed two per byte, an E4M3 scale per 16 inputs, one fp32 tensor scale)
on a GPU, in the form that suits the batch:

- `nvfp4_matmul`: y = x @ dequant(w).T with the weight dequantized in registers (W4A16), so it streams
  from memory at 4.5 bits per value. Few rows (decode): 16-row tiles split over K, so a skinny GEMM
  still fills the device. More rows: bigger tiles, no split.
- `dequantize_nvfp4`: the whole weight to bf16 in one pass, for cuBLAS when the batch is large enough
  that the GEMM's FLOPs, not the weight's bytes, set the time.

Element 2j of a row is the low nibble of byte j, 2j + 1 the high nibble; since a dot product does not
care about order, even and odd inputs are multiplied with the low and high nibbles separately.
"""

import torch
import triton
import triton.language as tl

from engines.native.kernels.launch import finish_split_k, num_sms, split_k_for, upcast_dots
from engines.native.kernels.operands import dot_operand
from engines.native.kernels.tiles import split_k_tile

BLOCK = tl.constexpr(16)  # inputs per E4M3 block scale (constexpr: read inside the kernel)


@triton.jit
def _e2m1(code):
    """4-bit E2M1 codes (int32) -> float32 by building the fp32 bits: sign, 2 exponent bits (bias 1),
    1 mantissa bit; exponent 0 is the subnormal 0 or 0.5."""
    exp = (code >> 1) & 3
    man = code & 1
    bits = tl.where(exp == 0, man * 0x3F000000, ((exp + 126) << 23) | (man << 22))
    bits = bits | ((code & 8) << 28)
    return bits.to(tl.float32, bitcast=True)


@triton.jit
def _block_scales(s_ptr, rn, rn_mask, first_byte, end_byte, stride_sn, NUM_BYTES: tl.constexpr):
    """[len(rn), NUM_BYTES] fp32: each packed byte's E4M3 block scale, loaded once per 16-input block
    (8 bytes) and repeated in registers instead of loaded again for every byte; 0 from end_byte on."""
    blocks = first_byte // (BLOCK // 2) + tl.arange(0, NUM_BYTES // (BLOCK // 2))
    mask = rn_mask[:, None] & (blocks < end_byte // (BLOCK // 2))[None, :]
    scale = tl.load(s_ptr + rn[:, None] * stride_sn + blocks[None, :], mask=mask, other=0.0)
    scale = tl.broadcast_to(scale.to(tl.float32)[:, :, None], (rn.shape[0], NUM_BYTES // (BLOCK // 2), BLOCK // 2))
    return tl.reshape(scale, (rn.shape[0], NUM_BYTES))


@triton.jit
def _nvfp4_kernel(
    x_ptr,
    w_ptr,
    s_ptr,
    g_ptr,
    out_ptr,
    M,
    N,
    K,
    stride_xm,
    stride_wn,
    stride_sn,
    stride_os,
    stride_om,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    SPLIT_K: tl.constexpr,
    UPCAST: tl.constexpr,
):
    rm, rn, split, lo, hi = split_k_tile(K, BLOCK_M, BLOCK_N, BLOCK_K, SPLIT_K)
    jj = tl.arange(0, BLOCK_K // 2)  # packed byte within the K tile
    acc = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
    for k0 in range(lo, hi, BLOCK_K):
        byte = k0 // 2 + jj
        in_k = byte < hi // 2
        w_mask = (rn < N)[:, None] & in_k[None, :]
        packed = tl.load(w_ptr + rn[:, None] * stride_wn + byte[None, :], mask=w_mask, other=0).to(tl.int32)
        scale = _block_scales(s_ptr, rn, rn < N, k0 // 2, hi // 2, stride_sn, BLOCK_K // 2)
        x_mask = (rm < M)[:, None] & in_k[None, :]
        x_even = tl.load(x_ptr + rm[:, None] * stride_xm + (2 * byte)[None, :], mask=x_mask, other=0.0)
        x_odd = tl.load(x_ptr + rm[:, None] * stride_xm + (2 * byte + 1)[None, :], mask=x_mask, other=0.0)
        # [BLOCK_N, BLOCK_K // 2] each, rounded once to the activations' dtype, as on a GPU
        w_lo = dot_operand(_e2m1(packed & 15) * scale, x_ptr.dtype.element_ty, UPCAST)
        w_hi = dot_operand(_e2m1(packed >> 4) * scale, x_ptr.dtype.element_ty, UPCAST)
        if UPCAST:
            x_even, x_odd = x_even.to(tl.float32), x_odd.to(tl.float32)
        acc += tl.dot(x_even, tl.trans(w_lo))
        acc += tl.dot(x_odd, tl.trans(w_hi))
    acc = acc * tl.load(g_ptr)
    out_mask = (rm < M)[:, None] & (rn < N)[None, :]
    tl.store(
        out_ptr + split * stride_os + rm[:, None] * stride_om + rn[None, :],
        acc.to(out_ptr.dtype.element_ty),
        mask=out_mask,
    )


def nvfp4_matmul(
    x: torch.Tensor,
    weight: torch.Tensor,
    weight_scale: torch.Tensor,
    weight_scale_2: torch.Tensor,
    bias: torch.Tensor | None = None,
    block_m: int | None = None,
    block_n: int = 64,
    block_k: int = 128,
    split_k: int | None = None,
    **launch,
) -> torch.Tensor:
    """x: [M, K]; weight: [N, K // 2] uint8; weight_scale: [N, K // 16] float8_e4m3fn; weight_scale_2: []
    float32. Returns [M, N] in x's dtype. split_k None: split only when the output has too few tiles."""
    x = x.contiguous()
    m, k = x.shape
    n = weight.shape[0]
    block_m = block_m or (16 if m <= 16 else 64)
    grid_mn = (triton.cdiv(m, block_m), triton.cdiv(n, block_n))
    if split_k is None:
        split_k = split_k_for(grid_mn[0] * grid_mn[1], k, block_k, num_sms(x.device))
    direct = split_k == 1 and bias is None  # else fp32 partial sums, finished below
    out = torch.empty(split_k, m, n, dtype=x.dtype if direct else torch.float32, device=x.device)
    _nvfp4_kernel[(*grid_mn, split_k)](
        x,
        weight,
        weight_scale,
        weight_scale_2,
        out,
        m,
        n,
        k,
        x.stride(0),
        weight.stride(0),
        weight_scale.stride(0),
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
def _dequant_kernel(
    w_ptr, s_ptr, g_ptr, out_ptr, N, KB, stride_wn, stride_sn, stride_on, BLOCK_N: tl.constexpr, BLOCK_B: tl.constexpr
):
    """One [BLOCK_N, 2 * BLOCK_B] tile of the dequantized weight; KB = K // 2 bytes per row."""
    rn = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    byte = tl.program_id(1) * BLOCK_B + tl.arange(0, BLOCK_B)
    mask = (rn < N)[:, None] & (byte < KB)[None, :]
    packed = tl.load(w_ptr + rn[:, None] * stride_wn + byte[None, :], mask=mask, other=0).to(tl.int32)
    scale = tl.load(s_ptr + rn[:, None] * stride_sn + (byte // (BLOCK // 2))[None, :], mask=mask, other=0.0)
    scale = scale.to(tl.float32) * tl.load(g_ptr)
    dst = out_ptr + rn[:, None] * stride_on + 2 * byte[None, :]
    tl.store(dst, (_e2m1(packed & 15) * scale).to(out_ptr.dtype.element_ty), mask=mask)
    tl.store(dst + 1, (_e2m1(packed >> 4) * scale).to(out_ptr.dtype.element_ty), mask=mask)


def dequantize_nvfp4(
    weight: torch.Tensor,
    weight_scale: torch.Tensor,
    weight_scale_2: torch.Tensor,
    dtype: torch.dtype,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """The whole weight [N, K] in `dtype` (values rounded once from the fp32 product of code and scales)."""
    n, kb = weight.shape
    out = torch.empty(n, 2 * kb, dtype=dtype, device=weight.device) if out is None else out
    block_n, block_b = 32, 64
    _dequant_kernel[(triton.cdiv(n, block_n), triton.cdiv(kb, block_b))](
        weight,
        weight_scale,
        weight_scale_2,
        out,
        n,
        kb,
        weight.stride(0),
        weight_scale.stride(0),
        out.stride(0),
        BLOCK_N=block_n,
        BLOCK_B=block_b,
    )
    return out
