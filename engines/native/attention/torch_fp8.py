"""Paged attention over an FP8 (E4M3) KV cache in plain PyTorch: the reference for the Triton
backend's FP8 path. One instance per layer, holding that layer's k and v scales.

NOTE: every span attends to the dequantized values, fresh ones included, so a prompt sees exactly
the keys a later decode will read back from the cache.
"""
import torch
import torch.nn.functional as F

from engines.native.attention.metadata import AttentionMetadata
from engines.native.attention.torch_paged import TorchPagedAttention

FP8_MAX = 448.0


def quantize_kv(x: torch.Tensor, scale: float) -> torch.Tensor:
    return (x.float() / scale).clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn)


class TorchFp8PagedAttention(TorchPagedAttention):
    def __init__(self, k_scale: float, v_scale: float):
        self.k_scale, self.v_scale = k_scale, v_scale

    def forward(self, q, k, v, k_cache, v_cache, meta: AttentionMetadata, scale: float) -> torch.Tensor:
        kq, vq = quantize_kv(k, self.k_scale), quantize_kv(v, self.v_scale)
        # NOTE: CPU index ops do not take float8 tensors; move the bytes as uint8
        for cache, x in ((k_cache, kq), (v_cache, vq)):
            cache.view(torch.uint8).view(-1, *cache.shape[2:]).index_copy_(0, meta.slot_mapping, x.view(torch.uint8))
        k, v = self._dequant(kq, self.k_scale, q.dtype), self._dequant(vq, self.v_scale, q.dtype)
        out = torch.empty_like(q)
        num_decodes = meta.num_decode_tokens
        if num_decodes:
            out[:num_decodes] = self._decode(q[:num_decodes], k_cache, v_cache, meta, scale)
        if meta.fresh is not None:
            self._fresh(q, k, v, meta.fresh, scale, out)
        for span in meta.prefills:
            sl = slice(span.q_start, span.q_start + span.q_len)
            out[sl] = self._prefill(q[sl], k_cache, v_cache, span, scale)
        return out

    @staticmethod
    def _dequant(x: torch.Tensor, scale: float, dtype: torch.dtype) -> torch.Tensor:
        return (x.float() * scale).to(dtype)

    def _blocks(self, cache: torch.Tensor, block_ids: torch.Tensor, scale: float, dtype) -> torch.Tensor:
        """[len(block_ids), block_size, num_kv_heads, head_dim] dequantized to `dtype`."""
        raw = cache.view(torch.uint8).index_select(0, block_ids).view(torch.float8_e4m3fn)
        return self._dequant(raw, scale, dtype)

    def _decode(self, q, k_cache, v_cache, meta: AttentionMetadata, scale: float) -> torch.Tensor:
        num_decodes, kv_shape = q.shape[0], k_cache.shape[2:]
        tables = meta.decode_block_tables
        # [num_decodes, num_kv_heads, max_blocks * block_size, head_dim]
        keys = self._blocks(k_cache, tables, self.k_scale, q.dtype).view(num_decodes, -1, *kv_shape).transpose(1, 2)
        values = self._blocks(v_cache, tables, self.v_scale, q.dtype).view(num_decodes, -1, *kv_shape).transpose(1, 2)
        out = F.scaled_dot_product_attention(  # GQA group as the query "sequence", as in the base class
            q.view(num_decodes, kv_shape[0], -1, q.shape[-1]), keys, values, attn_mask=meta.decode_mask, scale=scale)
        return out.reshape(q.shape)

    def _prefill(self, q, k_cache, v_cache, span, scale: float) -> torch.Tensor:
        kv_shape = k_cache.shape[2:]
        keys = self._blocks(k_cache, span.block_table, self.k_scale, q.dtype).view(-1, *kv_shape)[: span.ctx_len]
        values = self._blocks(v_cache, span.block_table, self.v_scale, q.dtype).view(-1, *kv_shape)[: span.ctx_len]
        out = F.scaled_dot_product_attention(
            q.transpose(0, 1).unsqueeze(0), keys.transpose(0, 1).unsqueeze(0), values.transpose(0, 1).unsqueeze(0),
            attn_mask=span.mask, scale=scale, enable_gqa=True)
        return out.squeeze(0).transpose(0, 1)
