"""Metadata for the kernel backend: int32 block tables and lengths instead of masks and padded
batches. Built once per step by the model runner; imports no triton."""

from dataclasses import dataclass

import torch

from engines.native.attention.metadata import AttentionMetadata


@dataclass(frozen=True, slots=True)
class VarlenMetadata(AttentionMetadata):
    decode_seq_lens: torch.Tensor | None = None  # [num_decodes] int32: keys per decode, its own included
    decode_block_table: torch.Tensor | None = None  # [num_decodes, max_blocks] int32, padded with 0
    max_decode_seq_len: int | None = None  # None under CUDA graphs: a captured grid cannot depend on it
    # every prefill span (fresh or continuing a cached prefix), in step order after the decodes
    prefill_q_starts: torch.Tensor | None = None  # [num_spans] int32
    prefill_q_lens: torch.Tensor | None = None  # [num_spans] int32
    prefill_ctx_lens: torch.Tensor | None = None  # [num_spans] int32: cached prefix + the span
    prefill_block_table: torch.Tensor | None = None  # [num_spans, max_blocks] int32
    max_prefill_q_len: int = 0


def build_varlen_metadata(
    slot_mapping: torch.Tensor,
    decodes: list[tuple[list[int], int]],
    spans: list[tuple[int, int, int, list[int]]],
    device,
) -> VarlenMetadata:
    """decodes: (block_table, seq_len) each; spans: (q_start, q_len, ctx_len, block_table) each."""
    fields: dict = {}
    if decodes:
        fields["decode_seq_lens"] = _ints([n for _, n in decodes], device)
        fields["max_decode_seq_len"] = max(n for _, n in decodes)
        fields["decode_block_table"] = _table([t for t, _ in decodes], device)
    if spans:
        fields.update(
            prefill_q_starts=_ints([s[0] for s in spans], device),
            prefill_q_lens=_ints([s[1] for s in spans], device),
            prefill_ctx_lens=_ints([s[2] for s in spans], device),
            prefill_block_table=_table([s[3] for s in spans], device),
            max_prefill_q_len=max(s[1] for s in spans),
        )
    return VarlenMetadata(slot_mapping=slot_mapping, num_decode_tokens=len(decodes), **fields)


def _ints(values: list[int], device) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.int32, device=device)


def _table(tables: list[list[int]], device) -> torch.Tensor:
    width = max(len(t) for t in tables)
    return _ints([b for t in tables for b in t + [0] * (width - len(t))], device).view(len(tables), width)
