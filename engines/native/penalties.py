"""Logit shaping before sampling, batched over the step's rows on the device: `logit_bias`, OpenAI's presence and
frequency penalties (over the generated tokens), and vLLM/HF's repetition penalty (over prompt + generated).

Builds a few index tensors per step and touches only the rows that ask; no sampling, no host sync.
"""
from collections.abc import Sequence

import torch

from engines.base.types import SamplingParams


def shape_logits(logits: torch.Tensor, params: list[SamplingParams], histories: list[Sequence[int]],
                 num_prompt_tokens: list[int]) -> torch.Tensor:
    """`logits` [num_rows, vocab_size] float32 (left as it is); the shaped copy, or `logits` when no row asks.
    `histories[i]` is row i's prompt + generated tokens so far, of which the first `num_prompt_tokens[i]` are
    the prompt."""
    biased = [i for i, p in enumerate(params) if p.logit_bias]
    penalized = [i for i, p in enumerate(params) if p.has_penalties]
    if not (biased or penalized):
        return logits
    out = logits.clone()
    if biased:
        _add_bias(out, [(i, params[i].logit_bias) for i in biased])
    if penalized:
        _penalize(out, penalized, [params[i] for i in penalized], [histories[i] for i in penalized],
                  [num_prompt_tokens[i] for i in penalized])
    return out


def _add_bias(logits: torch.Tensor, rows: list[tuple[int, tuple[tuple[int, float], ...]]]) -> None:
    row_ids = [i for i, bias in rows for _ in bias]
    token_ids = [t for _, bias in rows for t, _ in bias]
    values = [b for _, bias in rows for _, b in bias]
    device = logits.device
    index = (torch.tensor(row_ids, device=device), torch.tensor(token_ids, device=device))
    logits.index_put_(index, torch.tensor(values, device=device, dtype=logits.dtype), accumulate=True)


def _penalize(logits: torch.Tensor, rows: list[int], params: list[SamplingParams], histories: list[Sequence[int]],
              num_prompt_tokens: list[int]) -> None:
    """Rows `rows` of `logits`, in place, touching only the (row, token) pairs seen: repetition first (it scales
    the logit), then the subtractions. O(tokens seen), never O(vocab_size), per row."""
    device, vocab_size = logits.device, logits.shape[-1]
    row_ids = torch.tensor(rows, device=device)
    if any(p.repetition_penalty != 1.0 for p in params):
        repetition = torch.tensor([p.repetition_penalty for p in params], device=device)
        local, token_ids = _unique_pairs(*_occurrences(histories, device), vocab_size)
        index = (row_ids[local], token_ids)
        seen = logits[index]
        logits[index] = torch.where(seen > 0, seen / repetition[local], seen * repetition[local])
    local, token_ids = _occurrences([h[n:] for h, n in zip(histories, num_prompt_tokens)], device)
    if not len(token_ids):
        return
    frequency = torch.tensor([p.frequency_penalty for p in params], device=device)
    logits.index_put_((row_ids[local], token_ids), -frequency[local], accumulate=True)  # once per occurrence
    presence = torch.tensor([p.presence_penalty for p in params], device=device)
    local, token_ids = _unique_pairs(local, token_ids, vocab_size)
    logits.index_put_((row_ids[local], token_ids), -presence[local], accumulate=True)  # once per token


def _occurrences(token_lists: list[Sequence[int]], device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """(list index, token id) of every token of every list, flattened: two [num_tokens] long tensors."""
    local = [i for i, tokens in enumerate(token_lists) for _ in range(len(tokens))]
    flat = [t for tokens in token_lists for t in tokens]
    return (torch.tensor(local, dtype=torch.long, device=device),
            torch.tensor(flat, dtype=torch.long, device=device))


def _unique_pairs(local: torch.Tensor, token_ids: torch.Tensor, vocab_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    # NOTE: token ids were checked < vocab_size at admission, so row * vocab_size + id is a unique key
    keys = torch.unique(local * vocab_size + token_ids)
    return keys // vocab_size, keys % vocab_size
