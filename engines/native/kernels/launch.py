"""What every kernel wrapper decides the same way: whether Triton runs in its CPU interpreter, and
how many SMs a grid should cover. Imports no triton."""

import os

import torch


def interpreting() -> bool:
    """TRITON_INTERPRET=1: kernels run on CPU tensors through numpy (CI)."""
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


def upcast_dots() -> bool:
    """NOTE: the interpreter's tl.dot gives wrong results on bf16 operands; kernels take this as a
    constexpr and dot in fp32 there, on operands rounded as the GPU rounds them (operands.dot_operand).
    Its other fp32 -> bf16 casts (stores) truncate where a GPU rounds to nearest: checks allow one step."""
    return interpreting()


def num_sms(device: torch.device) -> int:
    if device.type != "cuda":
        return 4  # the interpreter: a few programs per dimension, so CPU tests cover splits and merges
    return torch.cuda.get_device_properties(device).multi_processor_count


def split_k_for(num_tiles: int, k: int, block_k: int, sms: int, max_split: int = 16) -> int:
    """K splits so that the grid covers the SMs about twice (a skinny GEMM has few output tiles),
    without a split shorter than two K tiles."""
    want = -(-2 * sms // max(1, num_tiles))
    return max(1, min(want, max_split, k // (2 * block_k)))


def finish_split_k(partial: torch.Tensor, dtype: torch.dtype, bias: torch.Tensor | None) -> torch.Tensor:
    """[splits, m, n] fp32 partial sums -> [m, n] in `dtype` (deterministic: no atomics)."""
    out = partial.sum(0) if partial.shape[0] > 1 else partial[0]
    if bias is not None:
        out = out + bias.float()
    return out.to(dtype)
