"""Prefill attention over variable-length spans whose keys (a cached prefix plus the span itself) sit
in the paged cache: one program per (tile of BLOCK_M queries, query head, span), causal.

A span's queries are the last q_len of its ctx_len positions. Keys are read through the block table,
so a fresh span (nothing cached) and a continuing one take the same path. Key tiles wholly before a
query tile's first position need no mask; only the tiles on the diagonal are masked. Tiles run
latest first, so the longest (last) query tiles of a long span start before the short ones.
"""

import torch
import triton
import triton.language as tl

from engines.native.kernels.launch import upcast_dots
from engines.native.kernels.operands import dot_operand

DEFAULT_BLOCK_M = 16
DEFAULT_BLOCK_N = 16
_LOG2E = tl.constexpr(1.4426950408889634)


@triton.jit
def _attend(
    q,
    acc,
    l_i,
    m_i,
    k_cache_ptr,
    v_cache_ptr,
    table_row_ptr,
    q_pos,
    lo,
    hi,
    ctx_len,
    qk_scale,
    kv_head,
    d,
    NUM_KV_HEADS: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
    BLOCK_N: tl.constexpr,
    MASKED: tl.constexpr,
    DTYPE: tl.constexpr,
    UPCAST: tl.constexpr,
):
    """Online softmax over key positions [lo, hi), BLOCK_N at a time; scores in log2 units. P enters
    the second dot rounded to DTYPE (the model's), as on a GPU, under the interpreter too."""
    for start in range(lo, hi, BLOCK_N):
        pos = start + tl.arange(0, BLOCK_N)
        valid = pos < ctx_len
        block = tl.load(table_row_ptr + pos // BLOCK_SIZE, mask=valid, other=0)
        slot = block.to(tl.int64) * BLOCK_SIZE + pos % BLOCK_SIZE
        kv_off = slot[:, None] * (NUM_KV_HEADS * HEAD_DIM) + kv_head * HEAD_DIM + d[None, :]
        kv_mask = valid[:, None] & (d < HEAD_DIM)[None, :]
        k = tl.load(k_cache_ptr + kv_off, mask=kv_mask, other=0.0).to(q.dtype)
        s = tl.dot(q, tl.trans(k)) * qk_scale  # [BLOCK_M, BLOCK_N] fp32
        if MASKED:
            # NOTE: position 0 is in every row's first tile, so m_i is finite after it (no inf - inf)
            s = tl.where((pos[None, :] <= q_pos[:, None]) & valid[None, :], s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, axis=1))
        alpha = tl.exp2(m_i - m_new)
        p = tl.exp2(s - m_new[:, None])
        v = tl.load(v_cache_ptr + kv_off, mask=kv_mask, other=0.0).to(q.dtype)
        acc = acc * alpha[:, None] + tl.dot(dot_operand(p, DTYPE, UPCAST), v)
        l_i = l_i * alpha + tl.sum(p, axis=1)
        m_i = m_new
    return acc, l_i, m_i


@triton.jit
def _prefill_kernel(
    q_ptr,
    k_cache_ptr,
    v_cache_ptr,
    out_ptr,
    block_table_ptr,
    q_starts_ptr,
    q_lens_ptr,
    ctx_lens_ptr,
    sm_scale,
    k_scale,
    v_scale,
    stride_qt,
    stride_qh,
    stride_ot,
    stride_oh,
    stride_bt,
    NUM_KV_HEADS: tl.constexpr,
    GROUP: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    DIM_PAD: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    UPCAST: tl.constexpr,
):
    tile = tl.num_programs(0) - 1 - tl.program_id(0)
    head = tl.program_id(1)
    span = tl.program_id(2)
    q_len = tl.load(q_lens_ptr + span)
    if tile * BLOCK_M < q_len:  # tiles past this span's queries do nothing
        q_start = tl.load(q_starts_ptr + span)
        ctx_len = tl.load(ctx_lens_ptr + span)
        kv_head = head // GROUP
        rows = tile * BLOCK_M + tl.arange(0, BLOCK_M)
        d = tl.arange(0, DIM_PAD)
        row_mask = (rows < q_len)[:, None] & (d < HEAD_DIM)[None, :]
        q_pos = ctx_len - q_len + rows  # each query's absolute position
        q = tl.load(
            q_ptr + (q_start + rows)[:, None] * stride_qt + head * stride_qh + d[None, :], mask=row_mask, other=0.0
        )
        dtype = q_ptr.dtype.element_ty
        if UPCAST:
            q = q.to(tl.float32)
        qk_scale = sm_scale * k_scale * _LOG2E
        m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
        l_i = tl.zeros([BLOCK_M], tl.float32)
        acc = tl.zeros([BLOCK_M, DIM_PAD], tl.float32)
        table_row = block_table_ptr + span * stride_bt
        # keys before the tile's first query are visible to every row: whole tiles of them, unmasked
        first = ctx_len - q_len + tile * BLOCK_M
        full = (first // BLOCK_N) * BLOCK_N
        acc, l_i, m_i = _attend(
            q,
            acc,
            l_i,
            m_i,
            k_cache_ptr,
            v_cache_ptr,
            table_row,
            q_pos,
            0,
            full,
            ctx_len,
            qk_scale,
            kv_head,
            d,
            NUM_KV_HEADS,
            HEAD_DIM,
            BLOCK_SIZE,
            BLOCK_N,
            False,
            dtype,
            UPCAST,
        )
        hi = tl.minimum(ctx_len, first + BLOCK_M)  # the tile's last query sees keys up to its own position
        acc, l_i, m_i = _attend(
            q,
            acc,
            l_i,
            m_i,
            k_cache_ptr,
            v_cache_ptr,
            table_row,
            q_pos,
            full,
            hi,
            ctx_len,
            qk_scale,
            kv_head,
            d,
            NUM_KV_HEADS,
            HEAD_DIM,
            BLOCK_SIZE,
            BLOCK_N,
            True,
            dtype,
            UPCAST,
        )
        out = acc * v_scale / tl.where(l_i > 0, l_i, 1.0)[:, None]
        tl.store(
            out_ptr + (q_start + rows)[:, None] * stride_ot + head * stride_oh + d[None, :],
            out.to(out_ptr.dtype.element_ty),
            mask=row_mask,
        )


def tiles_for(head_dim: int, is_cuda: bool) -> dict:
    """Tile sizes, warps and stages per head dim on a GPU; small tiles for the CPU interpreter."""
    if not is_cuda:
        return {"block_m": DEFAULT_BLOCK_M, "block_n": DEFAULT_BLOCK_N}
    if head_dim <= 64:
        return {"block_m": 128, "block_n": 64, "num_warps": 4, "num_stages": 3}
    if head_dim <= 128:
        return {"block_m": 128, "block_n": 64, "num_warps": 8, "num_stages": 3}
    return {"block_m": 64, "block_n": 32, "num_warps": 8, "num_stages": 2}


def paged_prefill(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_table: torch.Tensor,
    q_starts: torch.Tensor,
    q_lens: torch.Tensor,
    ctx_lens: torch.Tensor,
    max_q_len: int,
    scale: float,
    k_scale: float = 1.0,
    v_scale: float = 1.0,
    out: torch.Tensor | None = None,
    block_m: int = DEFAULT_BLOCK_M,
    block_n: int = DEFAULT_BLOCK_N,
    **launch,
) -> torch.Tensor:
    """q: [num_tokens, num_heads, head_dim] (spans at q_starts); block_table: [num_spans, max_blocks];
    q_starts, q_lens, ctx_lens: [num_spans] int. Writes only the spans' rows of `out`.
    launch: num_warps / num_stages for a GPU (see tiles_for)."""
    _, num_heads, head_dim = q.shape
    _, block_size, num_kv_heads, _ = k_cache.shape
    out = torch.empty_like(q) if out is None else out
    num_spans = q_lens.shape[0]
    if num_spans == 0:
        return out
    grid = (triton.cdiv(max_q_len, block_m), num_heads, num_spans)
    _prefill_kernel[grid](
        q,
        k_cache,
        v_cache,
        out,
        block_table,
        q_starts,
        q_lens,
        ctx_lens,
        float(scale),
        float(k_scale),
        float(v_scale),
        q.stride(0),
        q.stride(1),
        out.stride(0),
        out.stride(1),
        block_table.stride(0),
        NUM_KV_HEADS=num_kv_heads,
        GROUP=num_heads // num_kv_heads,
        HEAD_DIM=head_dim,
        DIM_PAD=max(16, triton.next_power_of_2(head_dim)),
        BLOCK_SIZE=block_size,
        BLOCK_M=block_m,
        BLOCK_N=block_n,
        UPCAST=upcast_dots(),
        **launch,
    )
    return out
