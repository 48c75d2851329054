"""Prefill attention over variable-length spans whose keys (a cached prefix plus the span itself) sit
in the paged cache: one program per (span, query head, tile of BLOCK_M queries), causal.

A span's queries are the last q_len of its ctx_len positions. Keys are read through the block table,
so a fresh span (nothing cached) and a continuing one take the same path.
"""
import torch
import triton
import triton.language as tl

DEFAULT_BLOCK_M = 16
DEFAULT_BLOCK_N = 16


@triton.jit
def _prefill_kernel(q_ptr, k_cache_ptr, v_cache_ptr, out_ptr, block_table_ptr, q_starts_ptr, q_lens_ptr,
                    ctx_lens_ptr, sm_scale, k_scale, v_scale, stride_qt, stride_qh, stride_ot, stride_oh, stride_bt,
                    NUM_KV_HEADS: tl.constexpr, GROUP: tl.constexpr, HEAD_DIM: tl.constexpr,
                    DIM_PAD: tl.constexpr, BLOCK_SIZE: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    span = tl.program_id(0)
    head = tl.program_id(1)
    tile = tl.program_id(2)
    q_start = tl.load(q_starts_ptr + span)
    q_len = tl.load(q_lens_ptr + span)
    ctx_len = tl.load(ctx_lens_ptr + span)
    kv_head = head // GROUP
    rows = tile * BLOCK_M + tl.arange(0, BLOCK_M)
    d = tl.arange(0, DIM_PAD)
    row_mask = (rows < q_len)[:, None] & (d < HEAD_DIM)[None, :]
    q_pos = ctx_len - q_len + rows  # each query's absolute position
    q = tl.load(q_ptr + (q_start + rows)[:, None] * stride_qt + head * stride_qh + d[None, :], mask=row_mask, other=0.0)
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, DIM_PAD], tl.float32)
    # causal: this tile's last query sees keys up to its own position; tiles past the span do nothing
    hi = tl.minimum(ctx_len, ctx_len - q_len + (tile + 1) * BLOCK_M)
    hi = tl.where(tile * BLOCK_M < q_len, hi, 0)
    for start in range(0, hi, BLOCK_N):
        pos = start + tl.arange(0, BLOCK_N)
        valid = pos < ctx_len
        block = tl.load(block_table_ptr + span * stride_bt + pos // BLOCK_SIZE, mask=valid, other=0)
        slot = block.to(tl.int64) * BLOCK_SIZE + pos % BLOCK_SIZE
        kv_off = slot[:, None] * (NUM_KV_HEADS * HEAD_DIM) + kv_head * HEAD_DIM + d[None, :]
        kv_mask = valid[:, None] & (d < HEAD_DIM)[None, :]
        k = (tl.load(k_cache_ptr + kv_off, mask=kv_mask, other=0.0).to(tl.float32) * k_scale).to(q.dtype)
        s = tl.dot(q, tl.trans(k)) * sm_scale  # [BLOCK_M, BLOCK_N] fp32
        # NOTE: position 0 is in every row's first tile, so m_i is finite after it (no inf - inf)
        s = tl.where((pos[None, :] <= q_pos[:, None]) & valid[None, :], s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, axis=1))
        alpha = tl.exp(m_i - m_new)
        p = tl.exp(s - m_new[:, None])
        v = (tl.load(v_cache_ptr + kv_off, mask=kv_mask, other=0.0).to(tl.float32) * v_scale).to(q.dtype)
        acc = acc * alpha[:, None] + tl.dot(p.to(q.dtype), v)
        l_i = l_i * alpha + tl.sum(p, axis=1)
        m_i = m_new
    out = acc / tl.where(l_i > 0, l_i, 1.0)[:, None]
    tl.store(out_ptr + (q_start + rows)[:, None] * stride_ot + head * stride_oh + d[None, :],
             out.to(out_ptr.dtype.element_ty), mask=row_mask)


def paged_prefill(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, block_table: torch.Tensor,
                  q_starts: torch.Tensor, q_lens: torch.Tensor, ctx_lens: torch.Tensor, max_q_len: int,
                  scale: float, k_scale: float = 1.0, v_scale: float = 1.0, out: torch.Tensor | None = None,
                  block_m: int = DEFAULT_BLOCK_M, block_n: int = DEFAULT_BLOCK_N) -> torch.Tensor:
    """q: [num_tokens, num_heads, head_dim] (spans at q_starts); block_table: [num_spans, max_blocks];
    q_starts, q_lens, ctx_lens: [num_spans] int. Writes only the spans' rows of `out`."""
    _, num_heads, head_dim = q.shape
    _, block_size, num_kv_heads, _ = k_cache.shape
    out = torch.empty_like(q) if out is None else out
    num_spans = q_lens.shape[0]
    if num_spans == 0:
        return out
    grid = (num_spans, num_heads, triton.cdiv(max_q_len, block_m))
    _prefill_kernel[grid](
        q, k_cache, v_cache, out, block_table, q_starts, q_lens, ctx_lens, float(scale), float(k_scale),
        float(v_scale), q.stride(0), q.stride(1), out.stride(0), out.stride(1), block_table.stride(0),
        NUM_KV_HEADS=num_kv_heads, GROUP=num_heads // num_kv_heads, HEAD_DIM=head_dim,
        DIM_PAD=max(16, triton.next_power_of_2(head_dim)), BLOCK_SIZE=block_size, BLOCK_M=block_m, BLOCK_N=block_n)
    return out
