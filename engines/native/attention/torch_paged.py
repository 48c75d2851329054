"""Paged attention in plain PyTorch (the CPU path and the reference for GPU kernels).

Whole blocks are gathered from the cache with index_select (4x faster on CPU than indexing
slot by slot), then scaled dot-product attention runs once for all decodes and once per span.
"""

import torch
import torch.nn.functional as F

from engines.native.attention.metadata import AttentionMetadata
from engines.native.layers.ops import TORCH_OPS


class TorchPagedAttention:
    ops = TORCH_OPS  # the model's small ops that go with this backend: plain PyTorch

    def forward(
        self,
        q: torch.Tensor,  # [num_tokens, num_heads, head_dim]
        k: torch.Tensor,  # [num_tokens, num_kv_heads, head_dim]
        v: torch.Tensor,
        k_cache: torch.Tensor,  # [num_blocks, block_size, num_kv_heads, head_dim]
        v_cache: torch.Tensor,
        meta: AttentionMetadata,
        scale: float,
        positions: torch.Tensor | None = None,  # [num_tokens]: with rotary, q and k are rotated here
        rotary=None,
    ) -> torch.Tensor:
        if rotary is not None:
            q, k = rotary(positions, q, k)
        # NOTE: every token's k/v is written before any read, so a span may read blocks that
        # another sequence fills in this same step (a prefix-cache hit on a block in flight).
        k, v = self._write(k, v, k_cache, v_cache, meta)
        num_decodes = meta.num_decode_tokens
        if num_decodes == q.shape[0]:  # a decode-only step: nothing to assemble
            return self._decode(q, k_cache, v_cache, meta, scale)
        out = torch.empty_like(q)
        if num_decodes:
            out[:num_decodes] = self._decode(q[:num_decodes], k_cache, v_cache, meta, scale)
        if meta.fresh is not None:
            self._fresh(q, k, v, meta.fresh, scale, out)
        for span in meta.prefills:
            sl = slice(span.q_start, span.q_start + span.q_len)
            out[sl] = self._prefill(q[sl], k_cache, v_cache, span, scale)
        return out

    # -- the cache's storage: what an FP8 cache (torch_fp8.py) does differently ------------------
    def _write(self, k, v, k_cache, v_cache, meta: AttentionMetadata) -> tuple[torch.Tensor, torch.Tensor]:
        """Store this step's k/v at their slots; returns the k/v that fresh spans attend to."""
        for cache, x in ((k_cache, k), (v_cache, v)):
            flat = cache.view(-1, *cache.shape[2:])  # [num_slots, num_kv_heads, head_dim]
            flat.index_copy_(0, meta.slot_mapping, x.to(flat.dtype))
        return k, v

    def _gather(self, cache: torch.Tensor, block_ids: torch.Tensor, dtype: torch.dtype, is_value: bool) -> torch.Tensor:
        """Whole blocks [len(block_ids), block_size, num_kv_heads, head_dim], as `dtype`."""
        blocks = cache.index_select(0, block_ids)
        return blocks if blocks.dtype == dtype else blocks.to(dtype)

    def _fresh(self, q, k, v, fresh, scale: float, out: torch.Tensor) -> None:
        """All spans with nothing cached in one causal SDPA call over a padded batch."""
        shape = (fresh.num_spans, fresh.max_len)

        def batch(x: torch.Tensor) -> torch.Tensor:  # [num_spans, heads, max_len, head_dim]
            return x.index_select(0, fresh.gather).view(*shape, *x.shape[1:]).transpose(1, 2)

        o = F.scaled_dot_product_attention(batch(q), batch(k), batch(v), is_causal=True, scale=scale, enable_gqa=True)
        rows = o.transpose(1, 2).reshape(-1, *q.shape[1:])  # [num_spans * max_len, num_heads, head_dim]
        if fresh.src_rows is not None:
            rows = rows.index_select(0, fresh.src_rows)
        out.index_copy_(0, fresh.dst_rows, rows)

    def _decode(self, q, k_cache, v_cache, meta: AttentionMetadata, scale: float) -> torch.Tensor:
        num_decodes, kv_shape = q.shape[0], k_cache.shape[2:]
        # [num_decodes, num_kv_heads, max_blocks * block_size, head_dim]
        tables = meta.decode_block_tables
        keys = self._gather(k_cache, tables, q.dtype, False).view(num_decodes, -1, *kv_shape).transpose(1, 2)
        values = self._gather(v_cache, tables, q.dtype, True).view(num_decodes, -1, *kv_shape).transpose(1, 2)
        num_kv_heads = kv_shape[0]
        # NOTE: a decode has one query per head, so a GQA group's queries become the "sequence"
        # of their shared kv head: [num_decodes, num_kv_heads, group, head_dim]. No K/V repeat.
        out = F.scaled_dot_product_attention(
            q.view(num_decodes, num_kv_heads, -1, q.shape[-1]),
            keys,
            values,
            attn_mask=meta.decode_mask,
            scale=scale,
        )
        return out.reshape(q.shape)

    def _prefill(self, q, k_cache, v_cache, span, scale: float) -> torch.Tensor:
        """One span that continues a cached prefix: its keys come from the cache."""
        kv_shape = k_cache.shape[2:]
        keys = self._gather(k_cache, span.block_table, q.dtype, False).view(-1, *kv_shape)[: span.ctx_len]
        values = self._gather(v_cache, span.block_table, q.dtype, True).view(-1, *kv_shape)[: span.ctx_len]
        out = F.scaled_dot_product_attention(
            q.transpose(0, 1).unsqueeze(0),  # [1, num_heads, q_len, head_dim]
            keys.transpose(0, 1).unsqueeze(0),
            values.transpose(0, 1).unsqueeze(0),
            attn_mask=span.mask,
            scale=scale,
            enable_gqa=True,
        )
        return out.squeeze(0).transpose(0, 1)
