"""Rotary embedding of q and k fused with the paged KV write: one program per token rotates all its
query heads, rotates its key heads and writes them (optionally as FP8) with its value heads into the
cache at its slot. q comes back rotated; k is read from the cache afterwards, never materialised.

Rounds where layers/rotary.py's torch code rounds (cos and sin to the model dtype, each product, the
sum), so both give the same rotated values. A negative slot writes nothing (CUDA-graph padding).
"""

import torch
import triton
import triton.language as tl

from engines.native.kernels.fp8 import to_e4m3


@triton.jit
def _rotate(x_ptr, heads, h_mask, j, j_mask, half, c1, s1, c2, s2):
    """Rotate-half of [HEADS_PAD, HALF_PAD] head rows at x_ptr: returns the two rotated halves."""
    mask = h_mask[:, None] & j_mask[None, :]
    x1 = tl.load(x_ptr + heads + j[None, :], mask=mask, other=0.0)
    x2 = tl.load(x_ptr + heads + half + j[None, :], mask=mask, other=0.0)
    dtype = x1.dtype
    x1, x2 = x1.to(tl.float32), x2.to(tl.float32)
    # NOTE: each product is rounded to the model dtype before the sum, as the torch code does
    o1 = (x1 * c1).to(dtype).to(tl.float32) + (-x2 * s1).to(dtype).to(tl.float32)
    o2 = (x2 * c2).to(dtype).to(tl.float32) + (x1 * s2).to(dtype).to(tl.float32)
    return o1.to(dtype), o2.to(dtype)


@triton.jit
def _rope_kv_kernel(
    q_ptr,
    k_ptr,
    v_ptr,
    q_out_ptr,
    k_cache_ptr,
    v_cache_ptr,
    pos_ptr,
    cos_ptr,
    sin_ptr,
    slot_ptr,
    k_scale,
    v_scale,
    stride_qt,
    stride_qh,
    stride_kt,
    stride_kh,
    stride_vt,
    stride_vh,
    stride_ot,
    stride_oh,
    stride_cos,
    NUM_HEADS: tl.constexpr,
    NUM_KV_HEADS: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    HEADS_PAD: tl.constexpr,
    KV_PAD: tl.constexpr,
    HALF_PAD: tl.constexpr,
    QUANT: tl.constexpr,
):
    token = tl.program_id(0).to(tl.int64)
    half = HEAD_DIM // 2
    j = tl.arange(0, HALF_PAD)
    j_mask = j < half
    pos = tl.load(pos_ptr + token)
    # [1, HALF_PAD] cos/sin of each half, rounded to the model dtype (as the torch path casts them)
    dtype = q_out_ptr.dtype.element_ty
    c1 = tl.load(cos_ptr + pos * stride_cos + j, mask=j_mask, other=0.0).to(dtype).to(tl.float32)[None, :]
    c2 = tl.load(cos_ptr + pos * stride_cos + half + j, mask=j_mask, other=0.0).to(dtype).to(tl.float32)[None, :]
    s1 = tl.load(sin_ptr + pos * stride_cos + j, mask=j_mask, other=0.0).to(dtype).to(tl.float32)[None, :]
    s2 = tl.load(sin_ptr + pos * stride_cos + half + j, mask=j_mask, other=0.0).to(dtype).to(tl.float32)[None, :]
    h = tl.arange(0, HEADS_PAD)
    q1, q2 = _rotate(q_ptr + token * stride_qt, h[:, None] * stride_qh, h < NUM_HEADS, j, j_mask, half, c1, s1, c2, s2)
    q_mask = (h < NUM_HEADS)[:, None] & j_mask[None, :]
    q_out = q_out_ptr + token * stride_ot + h[:, None] * stride_oh + j[None, :]
    tl.store(q_out, q1, mask=q_mask)
    tl.store(q_out + half, q2, mask=q_mask)
    slot = tl.load(slot_ptr + token).to(tl.int64)
    g = tl.arange(0, KV_PAD)
    kv_mask = (g < NUM_KV_HEADS)[:, None] & j_mask[None, :] & ((g * 0 + slot) >= 0)[:, None]
    k1, k2 = _rotate(
        k_ptr + token * stride_kt, g[:, None] * stride_kh, g < NUM_KV_HEADS, j, j_mask, half, c1, s1, c2, s2
    )
    v_row = v_ptr + token * stride_vt + g[:, None] * stride_vh + j[None, :]
    v1 = tl.load(v_row, mask=kv_mask, other=0.0)
    v2 = tl.load(v_row + half, mask=kv_mask, other=0.0)
    if QUANT:
        k1, k2 = to_e4m3(k1, k_scale), to_e4m3(k2, k_scale)
        v1, v2 = to_e4m3(v1, v_scale), to_e4m3(v2, v_scale)
    dst = slot * (NUM_KV_HEADS * HEAD_DIM) + g[:, None] * HEAD_DIM + j[None, :]
    cache_dtype = k_cache_ptr.dtype.element_ty
    tl.store(k_cache_ptr + dst, k1.to(cache_dtype), mask=kv_mask)
    tl.store(k_cache_ptr + dst + half, k2.to(cache_dtype), mask=kv_mask)
    tl.store(v_cache_ptr + dst, v1.to(cache_dtype), mask=kv_mask)
    tl.store(v_cache_ptr + dst + half, v2.to(cache_dtype), mask=kv_mask)


def rope_and_write_kv(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    positions: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
    k_scale: float = 1.0,
    v_scale: float = 1.0,
) -> torch.Tensor:
    """q [num_tokens, num_heads, head_dim], k and v [num_tokens, num_kv_heads, head_dim] (strided views
    of the qkv projection are fine); cos/sin [max_positions, head_dim] float32. Returns rotated q."""
    num_tokens, num_heads, head_dim = q.shape
    num_kv_heads = k.shape[1]
    for x in (q, k, v):
        if x.stride(2) != 1:
            raise ValueError("rope_and_write_kv needs each head's values contiguous")
    q_out = torch.empty(num_tokens, num_heads, head_dim, dtype=q.dtype, device=q.device)
    if num_tokens == 0:
        return q_out
    _rope_kv_kernel[(num_tokens,)](
        q,
        k,
        v,
        q_out,
        k_cache,
        v_cache,
        positions,
        cos,
        sin,
        slot_mapping,
        float(k_scale),
        float(v_scale),
        q.stride(0),
        q.stride(1),
        k.stride(0),
        k.stride(1),
        v.stride(0),
        v.stride(1),
        q_out.stride(0),
        q_out.stride(1),
        cos.stride(0),
        NUM_HEADS=num_heads,
        NUM_KV_HEADS=num_kv_heads,
        HEAD_DIM=head_dim,
        HEADS_PAD=triton.next_power_of_2(num_heads),
        KV_PAD=triton.next_power_of_2(num_kv_heads),
        HALF_PAD=triton.next_power_of_2(head_dim // 2),
        QUANT=k_cache.dtype == torch.float8_e4m3fn,
    )
    return q_out
