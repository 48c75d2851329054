"""Paged decode attention, split over the context (flash-decoding): one query token per sequence
against its keys in the block table.

Grid (sequence, kv head, split): each program serves the whole GQA group of its kv head, so a key is
read from memory once per group, and covers one contiguous share of the context, several cache
blocks per iteration. With more than one split, each program writes its share's normalised output
and log-sum-exp, and a second kernel merges the shares. The number of splits depends only on the
batch shape (never on the lengths), so a CUDA graph captures it. A sequence with no keys (CUDA-graph
padding) gets zeros.
"""

import torch
import triton
import triton.language as tl

from engines.native.kernels.launch import num_sms, upcast_dots
from engines.native.kernels.operands import dot_operand

DEFAULT_BLOCK_N = 64  # keys per iteration: several 16-token cache blocks at once
MAX_SPLITS = 32
_LOG2E = tl.constexpr(1.4426950408889634)


@triton.jit
def _split_kernel(
    q_ptr,
    k_cache_ptr,
    v_cache_ptr,
    out_ptr,
    part_out_ptr,
    part_lse_ptr,
    block_table_ptr,
    seq_lens_ptr,
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
    GROUP_PAD: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    DIM_PAD: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
    BLOCK_N: tl.constexpr,
    NUM_SPLITS: tl.constexpr,
    UPCAST: tl.constexpr,
):
    seq = tl.program_id(0)
    kv_head = tl.program_id(1)
    split = tl.program_id(2)
    seq_len = tl.load(seq_lens_ptr + seq)
    # every split gets a whole number of tiles; trailing splits of a short sequence get nothing
    share = tl.cdiv(tl.cdiv(seq_len, NUM_SPLITS), BLOCK_N) * BLOCK_N
    lo = split * share
    hi = tl.minimum(lo + share, seq_len)
    g = tl.arange(0, GROUP_PAD)
    d = tl.arange(0, DIM_PAD)
    heads = kv_head * GROUP + g
    q_mask = (g < GROUP)[:, None] & (d < HEAD_DIM)[None, :]
    q = tl.load(q_ptr + seq * stride_qt + heads[:, None] * stride_qh + d[None, :], mask=q_mask, other=0.0)
    # k_scale and log2(e) fold into q, v_scale into the output: stored values feed the dots as they are
    dtype = q_ptr.dtype.element_ty
    q = dot_operand(q.to(tl.float32) * (sm_scale * k_scale * _LOG2E), dtype, UPCAST)
    m_i = tl.full([GROUP_PAD], float("-inf"), tl.float32)
    l_i = tl.zeros([GROUP_PAD], tl.float32)
    acc = tl.zeros([GROUP_PAD, DIM_PAD], tl.float32)
    row = NUM_KV_HEADS * HEAD_DIM
    for start in range(lo, hi, BLOCK_N):
        pos = start + tl.arange(0, BLOCK_N)
        valid = pos < hi
        block = tl.load(block_table_ptr + seq * stride_bt + pos // BLOCK_SIZE, mask=valid, other=0)
        slot = block.to(tl.int64) * BLOCK_SIZE + pos % BLOCK_SIZE
        kv_off = slot[:, None] * row + kv_head * HEAD_DIM + d[None, :]
        kv_mask = valid[:, None] & (d < HEAD_DIM)[None, :]
        # NOTE: the cache's FP8 values are exact in bf16/fp16, so the dots run in the model dtype
        k = tl.load(k_cache_ptr + kv_off, mask=kv_mask, other=0.0).to(q.dtype)  # [BLOCK_N, DIM_PAD]
        s = tl.dot(q, tl.trans(k))  # [GROUP_PAD, BLOCK_N], log2 units
        s = tl.where(valid[None, :], s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, axis=1))
        alpha = tl.exp2(m_i - m_new)
        p = tl.exp2(s - m_new[:, None])
        v = tl.load(v_cache_ptr + kv_off, mask=kv_mask, other=0.0).to(q.dtype)
        acc = acc * alpha[:, None] + tl.dot(dot_operand(p, dtype, UPCAST), v)
        l_i = l_i * alpha + tl.sum(p, axis=1)
        m_i = m_new
    out = acc * v_scale / tl.where(l_i > 0, l_i, 1.0)[:, None]
    if NUM_SPLITS == 1:
        tl.store(
            out_ptr + seq * stride_ot + heads[:, None] * stride_oh + d[None, :],
            out.to(out_ptr.dtype.element_ty),
            mask=q_mask,
        )
    else:
        # partials: [num_seqs, num_heads, NUM_SPLITS, DIM_PAD] and [num_seqs, num_heads, NUM_SPLITS], fp32
        base = (seq * NUM_KV_HEADS * GROUP + heads) * NUM_SPLITS + split  # [GROUP_PAD]
        tl.store(part_out_ptr + base[:, None] * DIM_PAD + d[None, :], out, mask=q_mask)
        lse = tl.where(l_i > 0, m_i + tl.log2(tl.where(l_i > 0, l_i, 1.0)), float("-inf"))
        tl.store(part_lse_ptr + base, lse, mask=g < GROUP)


@triton.jit
def _merge_kernel(
    part_out_ptr,
    part_lse_ptr,
    out_ptr,
    stride_ot,
    stride_oh,
    NUM_HEADS: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    DIM_PAD: tl.constexpr,
    NUM_SPLITS: tl.constexpr,
):
    seq = tl.program_id(0)
    head = tl.program_id(1)
    s = tl.arange(0, NUM_SPLITS)
    d = tl.arange(0, DIM_PAD)
    base = (seq * NUM_HEADS + head) * NUM_SPLITS
    lse = tl.load(part_lse_ptr + base + s)  # [NUM_SPLITS], -inf where a split saw no key
    top = tl.max(lse, axis=0)
    top = tl.where(top == float("-inf"), 0.0, top)  # no key anywhere: every weight is 0, out is 0
    w = tl.exp2(lse - top)
    parts = tl.load(part_out_ptr + (base + s)[:, None] * DIM_PAD + d[None, :])
    total = tl.sum(w, axis=0)
    out = tl.sum(parts * w[:, None], axis=0) / tl.where(total > 0, total, 1.0)
    tl.store(out_ptr + seq * stride_ot + head * stride_oh + d, out.to(out_ptr.dtype.element_ty), mask=d < HEAD_DIM)


def num_splits_for(
    num_seqs: int, num_kv_heads: int, num_sms: int, max_seq_len: int | None = None, block_n: int = DEFAULT_BLOCK_N
) -> int:
    """Enough programs to cover the SMs about twice, a power of 2, at most MAX_SPLITS, and no more
    splits than tiles when the longest context is known."""
    want = -(-2 * num_sms // max(1, num_seqs * num_kv_heads))
    if max_seq_len is not None:
        want = min(want, -(-max_seq_len // block_n))
    return min(MAX_SPLITS, triton.next_power_of_2(max(1, want)))


def launch_config(head_dim: int, is_cuda: bool) -> dict:
    """Warps and pipeline stages per head dim (ignored by the interpreter)."""
    if not is_cuda:
        return {}
    return {"num_warps": 4 if head_dim <= 128 else 8, "num_stages": 2 if head_dim <= 128 else 1}


def paged_decode(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_table: torch.Tensor,
    seq_lens: torch.Tensor,
    scale: float,
    k_scale: float = 1.0,
    v_scale: float = 1.0,
    out: torch.Tensor | None = None,
    block_n: int = DEFAULT_BLOCK_N,
    num_splits: int | None = None,
    max_seq_len: int | None = None,
) -> torch.Tensor:
    """q: [num_seqs, num_heads, head_dim]; caches: [num_blocks, block_size, num_kv_heads, head_dim];
    block_table: [num_seqs, max_blocks] int; seq_lens: [num_seqs] int (keys per sequence, own token included).
    num_splits: None picks by batch shape (and max_seq_len, when the caller knows it)."""
    num_seqs, num_heads, head_dim = q.shape
    _, block_size, num_kv_heads, _ = k_cache.shape
    group = num_heads // num_kv_heads
    out = torch.empty_like(q) if out is None else out
    if num_seqs == 0:
        return out
    if num_splits is None:
        num_splits = num_splits_for(num_seqs, num_kv_heads, num_sms(q.device), max_seq_len, block_n)
    if num_splits & (num_splits - 1) or not 1 <= num_splits <= MAX_SPLITS:
        raise ValueError(f"num_splits must be a power of 2 in 1..{MAX_SPLITS}, got {num_splits}")
    dim_pad = max(16, triton.next_power_of_2(head_dim))
    part_out = part_lse = out  # NOTE: unused with one split (a valid pointer keeps the signature fixed)
    if num_splits > 1:
        part_out = torch.empty(num_seqs, num_heads, num_splits, dim_pad, dtype=torch.float32, device=q.device)
        part_lse = torch.empty(num_seqs, num_heads, num_splits, dtype=torch.float32, device=q.device)
    config = launch_config(head_dim, q.is_cuda)
    _split_kernel[(num_seqs, num_kv_heads, num_splits)](
        q,
        k_cache,
        v_cache,
        out,
        part_out,
        part_lse,
        block_table,
        seq_lens,
        float(scale),
        float(k_scale),
        float(v_scale),
        q.stride(0),
        q.stride(1),
        out.stride(0),
        out.stride(1),
        block_table.stride(0),
        NUM_KV_HEADS=num_kv_heads,
        GROUP=group,
        GROUP_PAD=max(16, triton.next_power_of_2(group)),
        HEAD_DIM=head_dim,
        DIM_PAD=dim_pad,
        BLOCK_SIZE=block_size,
        BLOCK_N=block_n,
        NUM_SPLITS=num_splits,
        UPCAST=upcast_dots(),
        **config,
    )
    if num_splits > 1:
        _merge_kernel[(num_seqs, num_heads)](
            part_out,
            part_lse,
            out,
            out.stride(0),
            out.stride(1),
            NUM_HEADS=num_heads,
            HEAD_DIM=head_dim,
            DIM_PAD=dim_pad,
            NUM_SPLITS=num_splits,
        )
    return out
