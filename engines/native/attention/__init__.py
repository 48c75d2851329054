"""Attention backends over the paged KV cache. `get_backend` picks one for a device."""
from engines.native.attention.metadata import AttentionMetadata, FreshSpans, PrefillSpan
from engines.native.attention.torch_paged import TorchPagedAttention


def get_backend(device: str):
    """The plain-PyTorch backend runs everywhere; GPU kernels plug in here by device."""
    return TorchPagedAttention()


__all__ = ["AttentionMetadata", "FreshSpans", "PrefillSpan", "TorchPagedAttention", "get_backend"]
