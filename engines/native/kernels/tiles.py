"""The tile a split-K GEMM program owns, shared by the quantized GEMM kernels."""

import triton
import triton.language as tl


@triton.jit
def split_k_tile(K, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, SPLIT_K: tl.constexpr):
    """Grid (m tiles, n tiles, splits): this program's rows, columns, split index, and its share
    [lo, hi) of K, a whole number of BLOCK_K tiles (the last split may get less, or nothing)."""
    rm = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    split = tl.program_id(2)
    share = tl.cdiv(tl.cdiv(K, SPLIT_K), BLOCK_K) * BLOCK_K
    lo = split * share
    return rm, rn, split, lo, tl.minimum(lo + share, K)
