"""Paged attention over an FP8 (E4M3) KV cache in plain PyTorch: the reference for the Triton
backend's FP8 path. One instance per layer, holding that layer's k and v scales.

NOTE: every span attends to the dequantized values, fresh ones included, so a prompt sees exactly
the keys a later decode will read back from the cache.
"""

import torch

from engines.native.attention.metadata import AttentionMetadata
from engines.native.attention.torch_paged import TorchPagedAttention

FP8_MAX = 448.0


def quantize_kv(x: torch.Tensor, scale: float) -> torch.Tensor:
    return (x.float() / scale).clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn)


class TorchFp8PagedAttention(TorchPagedAttention):
    def __init__(self, k_scale: float, v_scale: float):
        self.k_scale, self.v_scale = k_scale, v_scale

    def _write(self, k, v, k_cache, v_cache, meta: AttentionMetadata) -> tuple[torch.Tensor, torch.Tensor]:
        kq, vq = quantize_kv(k, self.k_scale), quantize_kv(v, self.v_scale)
        # NOTE: CPU index ops do not take float8 tensors; move the bytes as uint8
        for cache, x in ((k_cache, kq), (v_cache, vq)):
            cache.view(torch.uint8).view(-1, *cache.shape[2:]).index_copy_(0, meta.slot_mapping, x.view(torch.uint8))
        return self._dequant(kq, self.k_scale, k.dtype), self._dequant(vq, self.v_scale, v.dtype)

    @staticmethod
    def _dequant(x: torch.Tensor, scale: float, dtype: torch.dtype) -> torch.Tensor:
        return (x.float() * scale).to(dtype)

    def _gather(self, cache: torch.Tensor, block_ids: torch.Tensor, dtype: torch.dtype, is_value: bool) -> torch.Tensor:
        raw = cache.view(torch.uint8).index_select(0, block_ids).view(torch.float8_e4m3fn)
        return self._dequant(raw, self.v_scale if is_value else self.k_scale, dtype)
