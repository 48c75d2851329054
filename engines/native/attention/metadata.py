"""Per-step attention metadata, built once by the model runner and shared by every layer.

Token order in a step: all decode tokens (one per sequence) first, then each prefill span.
"""
from dataclasses import dataclass, field

import torch


@dataclass(frozen=True, slots=True)
class PrefillSpan:
    q_start: int  # offset of the span's first query token in the step's token order
    q_len: int
    ctx_len: int  # keys visible to the span's last token (cached prefix + this span)
    # [num_ctx_blocks] the span's block table; None when ctx_len == q_len (nothing cached before)
    block_table: torch.Tensor | None = None
    # [q_len, ctx_len] bool, True = may attend; None with block_table None (plain causal)
    mask: torch.Tensor | None = None


@dataclass(frozen=True, slots=True)
class AttentionMetadata:
    slot_mapping: torch.Tensor  # [num_tokens] int64: where each token's k/v is written
    num_decode_tokens: int = 0
    # [num_decodes * max_blocks] int64: each decode's block table, padded, flattened
    decode_block_tables: torch.Tensor | None = None
    decode_mask: torch.Tensor | None = None  # [num_decodes, 1, 1, max_blocks * block_size] bool, True = valid key
    prefills: list[PrefillSpan] = field(default_factory=list)
