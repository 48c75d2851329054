"""Paged attention in plain PyTorch (the CPU path and the reference for GPU kernels).

Whole blocks are gathered from the cache with index_select (4x faster on CPU than indexing
slot by slot), then scaled dot-product attention runs once for all decodes and once per span.
"""
import torch
import torch.nn.functional as F

from engines.native.attention.metadata import AttentionMetadata


class TorchPagedAttention:
    def forward(
        self,
        q: torch.Tensor,  # [num_tokens, num_heads, head_dim]
        k: torch.Tensor,  # [num_tokens, num_kv_heads, head_dim]
        v: torch.Tensor,
        k_cache: torch.Tensor,  # [num_blocks, block_size, num_kv_heads, head_dim]
        v_cache: torch.Tensor,
        meta: AttentionMetadata,
        scale: float,
    ) -> torch.Tensor:
        k_flat = k_cache.view(-1, *k_cache.shape[2:])  # [num_slots, num_kv_heads, head_dim]
        v_flat = v_cache.view(-1, *v_cache.shape[2:])
        # NOTE: every token's k/v is written before any read, so a span may read blocks that
        # another sequence fills in this same step (a prefix-cache hit on a block in flight).
        k_flat.index_copy_(0, meta.slot_mapping, k.to(k_flat.dtype))
        v_flat.index_copy_(0, meta.slot_mapping, v.to(v_flat.dtype))
        out = torch.empty_like(q)
        num_decodes = meta.num_decode_tokens
        if num_decodes:
            out[:num_decodes] = self._decode(q[:num_decodes], k_cache, v_cache, meta, scale)
        if meta.fresh is not None:
            self._fresh(q, k, v, meta.fresh, scale, out)
        for span in meta.prefills:
            sl = slice(span.q_start, span.q_start + span.q_len)
            out[sl] = self._prefill(q[sl], k[sl], v[sl], k_cache, v_cache, span, scale)
        return out

    def _fresh(self, q, k, v, fresh, scale: float, out: torch.Tensor) -> None:
        """All spans with nothing cached in one causal SDPA call over a padded batch."""
        shape = (fresh.num_spans, fresh.max_len)

        def batch(x: torch.Tensor) -> torch.Tensor:  # [num_spans, heads, max_len, head_dim]
            return x.index_select(0, fresh.gather).view(*shape, *x.shape[1:]).transpose(1, 2)

        o = F.scaled_dot_product_attention(batch(q), batch(k), batch(v), is_causal=True, scale=scale,
                                           enable_gqa=True)
        rows = o.transpose(1, 2).reshape(-1, *q.shape[1:])  # [num_spans * max_len, num_heads, head_dim]
        if fresh.src_rows is not None:
            rows = rows.index_select(0, fresh.src_rows)
        out.index_copy_(0, fresh.dst_rows, rows)

    def _decode(self, q, k_cache, v_cache, meta: AttentionMetadata, scale: float) -> torch.Tensor:
        num_decodes, kv_shape = q.shape[0], k_cache.shape[2:]
        # [num_decodes, num_kv_heads, max_blocks * block_size, head_dim]
        keys = k_cache.index_select(0, meta.decode_block_tables).view(num_decodes, -1, *kv_shape).transpose(1, 2)
        values = v_cache.index_select(0, meta.decode_block_tables).view(num_decodes, -1, *kv_shape).transpose(1, 2)
        num_kv_heads = kv_shape[0]
        # NOTE: a decode has one query per head, so a GQA group's queries become the "sequence"
        # of their shared kv head: [num_decodes, num_kv_heads, group, head_dim]. No K/V repeat.
        out = F.scaled_dot_product_attention(
            q.view(num_decodes, num_kv_heads, -1, q.shape[-1]), keys.to(q.dtype), values.to(q.dtype),
            attn_mask=meta.decode_mask, scale=scale,
        )
        return out.reshape(q.shape)

    def _prefill(self, q, k, v, k_cache, v_cache, span, scale: float) -> torch.Tensor:
        """One span that continues a cached prefix: its keys come from the cache."""
        kv_shape = k_cache.shape[2:]
        keys = k_cache.index_select(0, span.block_table).view(-1, *kv_shape)[: span.ctx_len]
        values = v_cache.index_select(0, span.block_table).view(-1, *kv_shape)[: span.ctx_len]
        out = F.scaled_dot_product_attention(
            q.transpose(0, 1).unsqueeze(0),  # [1, num_heads, q_len, head_dim]
            keys.transpose(0, 1).unsqueeze(0).to(q.dtype),
            values.transpose(0, 1).unsqueeze(0).to(q.dtype),
            attn_mask=span.mask, scale=scale, enable_gqa=True,
        )
        return out.squeeze(0).transpose(0, 1)
