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
    # [num_ctx_blocks] the blocks holding the span's cached prefix and itself
    block_table: torch.Tensor | None = None
    # [q_len, ctx_len] bool, True = may attend
    mask: torch.Tensor | None = None


@dataclass(frozen=True, slots=True)
class AttentionMetadata:
    slot_mapping: torch.Tensor  # [num_tokens] int64: where each token's k/v is written
    num_decode_tokens: int = 0
    # [num_decodes * max_blocks] int64: each decode's block table, padded, flattened
    decode_block_tables: torch.Tensor | None = None
    decode_mask: torch.Tensor | None = None  # [num_decodes, 1, 1, max_blocks * block_size] bool, True = valid key
    prefills: list[PrefillSpan] = field(default_factory=list)  # spans with a cached prefix
    fresh: "FreshSpans | None" = None  # spans with nothing cached, batched into one call


@dataclass(frozen=True, slots=True)
class FreshSpans:
    """Prefill spans that start at position 0, right-padded to one [num_spans, max_len] batch.

    NOTE: right padding is safe under a causal mask: a real query never sees a later pad key.
    """

    gather: torch.Tensor  # [num_spans * max_len] step-token index per padded slot (pads repeat a real one)
    num_spans: int
    max_len: int
    src_rows: torch.Tensor | None  # [num_real] padded rows holding real tokens; None when no padding
    dst_rows: torch.Tensor  # [num_real] where those rows go in the step's token order
