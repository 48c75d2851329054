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
    """Rows `rows` of `logits`, in place: repetition first (it scales the logit), then the subtractions."""
    device, vocab_size = logits.device, logits.shape[-1]
    sub = logits[rows]  # [num_penalized, vocab_size] (a copy)
    outputs = [h[n:] for h, n in zip(histories, num_prompt_tokens)]
    counts = _token_counts(outputs, vocab_size, device)  # [num_penalized, vocab_size] generated-token counts
    repetition = torch.tensor([p.repetition_penalty for p in params], device=device).unsqueeze(1)
    if any(p.repetition_penalty != 1.0 for p in params):
        seen = _token_counts(histories, vocab_size, device) > 0
        scaled = torch.where(sub > 0, sub / repetition, sub * repetition)
        sub = torch.where(seen, scaled, sub)
    frequency = torch.tensor([p.frequency_penalty for p in params], device=device).unsqueeze(1)
    presence = torch.tensor([p.presence_penalty for p in params], device=device).unsqueeze(1)
    sub = sub - frequency * counts - presence * (counts > 0).float()
    logits[rows] = sub


def _token_counts(token_lists: list[Sequence[int]], vocab_size: int, device: torch.device) -> torch.Tensor:
    """[len(token_lists), vocab_size] float32: how many times each token occurs in each list."""
    row_ids = [i for i, tokens in enumerate(token_lists) for _ in range(len(tokens))]
    flat = [t for tokens in token_lists for t in tokens]
    counts = torch.zeros(len(token_lists), vocab_size, device=device)
    if flat:
        ids = torch.tensor(flat, device=device).clamp_(max=vocab_size - 1)  # NOTE: ids were checked < vocab_size
        counts.index_put_((torch.tensor(row_ids, device=device), ids), torch.ones(len(flat), device=device),
                          accumulate=True)
    return counts
