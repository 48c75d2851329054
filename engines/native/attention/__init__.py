"""Attention backends over the paged KV cache. `get_backend` picks one for a device.

The Triton backend is imported only when picked, so the CPU path never loads triton."""

from engines.native.attention.metadata import AttentionMetadata, FreshSpans, PrefillSpan
from engines.native.attention.torch_fp8 import TorchFp8PagedAttention
from engines.native.attention.torch_paged import TorchPagedAttention


def get_backend(device: str, name: str = "auto", kv_scales: tuple[float, float] | None = None):
    """The plain-PyTorch backend runs everywhere and is the reference; Triton kernels are the default
    on CUDA. `kv_scales` (k, v) asks for one layer's backend over an FP8 cache."""
    if resolve_backend(device, name) == "triton":
        from engines.native.attention.triton_paged import TritonPagedAttention  # lazy: imports triton

        return TritonPagedAttention(*(kv_scales or (None, None)))
    return TorchPagedAttention() if kv_scales is None else TorchFp8PagedAttention(*kv_scales)


def resolve_backend(device: str, name: str = "auto") -> str:
    if name == "auto":
        return "triton" if device.startswith("cuda") else "torch"
    return name


__all__ = [
    "AttentionMetadata",
    "FreshSpans",
    "PrefillSpan",
    "TorchFp8PagedAttention",
    "TorchPagedAttention",
    "get_backend",
    "resolve_backend",
]
