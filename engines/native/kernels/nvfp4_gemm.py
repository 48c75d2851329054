"""y = x @ dequant(w).T with NVFP4 weights dequantized in registers (W4A16): the weight streams from
memory at 4.5 bits per value, which is what batch-1 decode is bound by.

Element 2j of a row is the low nibble of byte j, 2j + 1 the high nibble; since a dot product does not
care about order, even and odd inputs are multiplied with the low and high nibbles separately.
"""
import torch
import triton
import triton.language as tl

BLOCK = tl.constexpr(16)  # inputs per E4M3 block scale (constexpr: read inside the kernel)


@triton.jit
def _e2m1(code):
    """4-bit E2M1 codes (int32) -> float32: sign, 2 exponent bits (bias 1), 1 mantissa bit."""
    exp = (code >> 1) & 3
    man = (code & 1).to(tl.float32)
    value = tl.where(exp == 0, man * 0.5, (1.0 + man * 0.5) * tl.exp2((exp - 1).to(tl.float32)))
    return tl.where((code & 8) != 0, -value, value)


@triton.jit
def _nvfp4_kernel(x_ptr, w_ptr, s_ptr, g_ptr, out_ptr, M, N, K, stride_xm, stride_wn, stride_sn, stride_om,
                  BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    jj = tl.arange(0, BLOCK_K // 2)  # packed byte within the K tile
    acc = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
    for k0 in range(0, K, BLOCK_K):
        byte = k0 // 2 + jj
        w_mask = (rn < N)[:, None] & (byte < K // 2)[None, :]
        packed = tl.load(w_ptr + rn[:, None] * stride_wn + byte[None, :], mask=w_mask, other=0).to(tl.int32)
        scale = tl.load(s_ptr + rn[:, None] * stride_sn + (byte // (BLOCK // 2))[None, :], mask=w_mask, other=0.0)
        scale = scale.to(tl.float32)
        x_mask = (rm < M)[:, None] & (byte < K // 2)[None, :]
        x_even = tl.load(x_ptr + rm[:, None] * stride_xm + (2 * byte)[None, :], mask=x_mask, other=0.0)
        x_odd = tl.load(x_ptr + rm[:, None] * stride_xm + (2 * byte + 1)[None, :], mask=x_mask, other=0.0)
        w_lo = (_e2m1(packed & 15) * scale).to(x_even.dtype)  # [BLOCK_N, BLOCK_K // 2]
        w_hi = (_e2m1(packed >> 4) * scale).to(x_even.dtype)
        acc += tl.dot(x_even, tl.trans(w_lo))
        acc += tl.dot(x_odd, tl.trans(w_hi))
    acc = acc * tl.load(g_ptr)
    out_mask = (rm < M)[:, None] & (rn < N)[None, :]
    tl.store(out_ptr + rm[:, None] * stride_om + rn[None, :], acc.to(out_ptr.dtype.element_ty), mask=out_mask)


def nvfp4_matmul(x: torch.Tensor, weight: torch.Tensor, weight_scale: torch.Tensor, weight_scale_2: torch.Tensor,
                 block_m: int | None = None, block_n: int = 64, block_k: int = 64) -> torch.Tensor:
    """x: [M, K]; weight: [N, K // 2] uint8; weight_scale: [N, K // 16] float8_e4m3fn; weight_scale_2: []
    float32. Returns [M, N] in x's dtype."""
    x = x.contiguous()
    m, k = x.shape
    n = weight.shape[0]
    block_m = block_m or (16 if m <= 16 else 64)
    out = torch.empty(m, n, dtype=x.dtype, device=x.device)
    grid = (triton.cdiv(m, block_m), triton.cdiv(n, block_n))
    _nvfp4_kernel[grid](x, weight, weight_scale, weight_scale_2, out, m, n, k, x.stride(0), weight.stride(0),
                        weight_scale.stride(0), out.stride(0), BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=block_k)
    return out
