"""Write each token's k and v into the paged cache at its slot (optionally quantizing to FP8).

A negative slot skips the token: CUDA-graph padding rows write nowhere."""

import torch
import triton
import triton.language as tl

from engines.native.kernels.fp8 import FP8_MAX, to_e4m3


@triton.jit
def _kv_write_kernel(
    k_ptr,
    v_ptr,
    k_cache_ptr,
    v_cache_ptr,
    slot_ptr,
    k_scale,
    v_scale,
    stride_k,
    stride_v,
    ROW: tl.constexpr,
    ROW_PAD: tl.constexpr,
    QUANT: tl.constexpr,
):
    token = tl.program_id(0)
    slot = tl.load(slot_ptr + token).to(tl.int64)
    offs = tl.arange(0, ROW_PAD)
    mask = (offs < ROW) & ((offs * 0 + slot) >= 0)  # NOTE: a vector mask (the interpreter rejects a scalar)
    k = tl.load(k_ptr + token * stride_k + offs, mask=mask, other=0.0)
    v = tl.load(v_ptr + token * stride_v + offs, mask=mask, other=0.0)
    if QUANT:
        k = to_e4m3(k, k_scale)
        v = to_e4m3(v, v_scale)
    dst = slot * ROW + offs
    tl.store(k_cache_ptr + dst, k.to(k_cache_ptr.dtype.element_ty), mask=mask)
    tl.store(v_cache_ptr + dst, v.to(v_cache_ptr.dtype.element_ty), mask=mask)


def write_kv(
    k: torch.Tensor,
    v: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
    k_scale: float = 1.0,
    v_scale: float = 1.0,
) -> None:
    """k, v: [num_tokens, num_kv_heads, head_dim] (rows may be strided); caches: [num_blocks,
    block_size, num_kv_heads, head_dim]; an FP8 cache stores k / k_scale and v / v_scale."""
    num_tokens, num_kv_heads, head_dim = k.shape
    if num_tokens == 0:
        return
    _check_rows(k)
    _check_rows(v)
    row = num_kv_heads * head_dim
    quant = k_cache.dtype == torch.float8_e4m3fn
    _kv_write_kernel[(num_tokens,)](
        k,
        v,
        k_cache,
        v_cache,
        slot_mapping,
        float(k_scale),
        float(v_scale),
        k.stride(0),
        v.stride(0),
        ROW=row,
        ROW_PAD=triton.next_power_of_2(row),
        QUANT=quant,
    )


def write_kv_reference(k, v, k_cache, v_cache, slot_mapping, k_scale: float = 1.0, v_scale: float = 1.0) -> None:
    keep = slot_mapping >= 0
    for cache, x, scale in ((k_cache, k, k_scale), (v_cache, v, v_scale)):
        flat = (
            cache.view(torch.uint8).view(-1, *cache.shape[2:])
            if cache.dtype == torch.float8_e4m3fn
            else cache.view(-1, *cache.shape[2:])
        )
        if cache.dtype == torch.float8_e4m3fn:
            x = (x.float() / scale).clamp(-FP8_MAX, FP8_MAX).to(cache.dtype).view(torch.uint8)
        flat.index_copy_(0, slot_mapping[keep], x[keep].to(flat.dtype))


def _check_rows(x: torch.Tensor) -> None:
    if x.stride(2) != 1 or x.stride(1) != x.shape[2]:
        raise ValueError("each token's [num_kv_heads, head_dim] must be contiguous")
