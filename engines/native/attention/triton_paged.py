"""Paged attention through Triton kernels (the default on CUDA): RoPE fused with the KV write through
the slot mapping, split-KV paged decode over the block tables, varlen prefill over cached prefixes.
Reads VarlenMetadata. The model's small ops go with it as Triton kernels too (`ops`).

One instance serves every layer of an unquantized cache; an FP8 cache gets one per layer (its scales).
Checked against TorchPagedAttention / TorchFp8PagedAttention (tests/unit/kernels).
"""

import torch

from engines.native.attention.varlen import VarlenMetadata
from engines.native.kernels.kv_write import write_kv
from engines.native.kernels.paged_decode import paged_decode
from engines.native.kernels.paged_prefill import paged_prefill, tiles_for
from engines.native.kernels.rope_kv import rope_and_write_kv
from engines.native.layers.triton_ops import TRITON_OPS


class TritonPagedAttention:
    ops = TRITON_OPS

    def __init__(self, k_scale: float | None = None, v_scale: float | None = None):
        self.k_scale = 1.0 if k_scale is None else k_scale
        self.v_scale = 1.0 if v_scale is None else v_scale

    def forward(
        self,
        q: torch.Tensor,  # [num_tokens, num_heads, head_dim]
        k: torch.Tensor,  # [num_tokens, num_kv_heads, head_dim]
        v: torch.Tensor,
        k_cache: torch.Tensor,  # [num_blocks, block_size, num_kv_heads, head_dim]
        v_cache: torch.Tensor,
        meta: VarlenMetadata,
        scale: float,
        positions: torch.Tensor | None = None,  # [num_tokens]: with rotary, q and k are rotated here
        rotary=None,
    ) -> torch.Tensor:
        # NOTE: every token's k/v is written before any read, as in the torch backend
        if rotary is None:
            write_kv(k, v, k_cache, v_cache, meta.slot_mapping, self.k_scale, self.v_scale)
        else:
            q = rope_and_write_kv(
                q,
                k,
                v,
                positions,
                rotary.cos,
                rotary.sin,
                k_cache,
                v_cache,
                meta.slot_mapping,
                self.k_scale,
                self.v_scale,
            )
        out = torch.empty_like(q)
        num_decodes = meta.num_decode_tokens
        if num_decodes:
            paged_decode(
                q[:num_decodes],
                k_cache,
                v_cache,
                meta.decode_block_table,
                meta.decode_seq_lens,
                scale,
                self.k_scale,
                self.v_scale,
                out=out[:num_decodes],
                max_seq_len=meta.max_decode_seq_len,
            )
        if meta.max_prefill_q_len:
            tiles = tiles_for(q.shape[-1], q.is_cuda)
            paged_prefill(
                q,
                k_cache,
                v_cache,
                meta.prefill_block_table,
                meta.prefill_q_starts,
                meta.prefill_q_lens,
                meta.prefill_ctx_lens,
                meta.max_prefill_q_len,
                scale,
                self.k_scale,
                self.v_scale,
                out=out,
                **tiles,
            )
        return out
