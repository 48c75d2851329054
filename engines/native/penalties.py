"""Logit shaping before sampling, batched over the step's rows on the device: `logit_bias`, OpenAI's presence and
frequency penalties (over the generated tokens), and vLLM/HF's repetition penalty (over prompt + generated).

Builds a few index tensors per step and touches only the rows that ask; no sampling, no host sync.
"""

from collections.abc import Sequence
from itertools import chain

import torch

from engines.base.types import SamplingParams


def shape_logits(
    logits: torch.Tensor,
    params: list[SamplingParams],
    histories: list[Sequence[int]],
    num_prompt_tokens: list[int],
    in_place: bool = False,
) -> torch.Tensor:
    """`logits` [num_rows, vocab_size] float32, shaped in place when `in_place` (else a shaped copy); `logits` as it
    is when no row asks. `histories[i]` is row i's prompt + generated tokens so far, of which the first
    `num_prompt_tokens[i]` are the prompt."""
    biased = [i for i, p in enumerate(params) if p.logit_bias]
    penalized = [i for i, p in enumerate(params) if p.has_penalties]
    if not (biased or penalized):
        return logits
    out = logits if in_place else logits.clone()  # NOTE: a fresh [rows, vocab] copy costs more than the shaping
    if biased:
        _add_bias(out, [(i, params[i].logit_bias) for i in biased])
    if penalized:
        _penalize(
            out,
            penalized,
            [params[i] for i in penalized],
            [histories[i] for i in penalized],
            [num_prompt_tokens[i] for i in penalized],
        )
    return out


def _add_bias(logits: torch.Tensor, rows: list[tuple[int, tuple[tuple[int, float], ...]]]) -> None:
    row_ids = [i for i, bias in rows for _ in bias]
    token_ids = [t for _, bias in rows for t, _ in bias]
    values = [b for _, bias in rows for _, b in bias]
    device = logits.device
    index = (torch.tensor(row_ids, device=device), torch.tensor(token_ids, device=device))
    logits.index_put_(index, torch.tensor(values, device=device, dtype=logits.dtype), accumulate=True)


def _penalize(
    logits: torch.Tensor,
    rows: list[int],
    params: list[SamplingParams],
    histories: list[Sequence[int]],
    num_prompt_tokens: list[int],
) -> None:
    """Rows `rows` of `logits`, in place, touching only the (row, token) pairs seen: repetition first (it scales
    the logit), then the subtractions. O(tokens seen), never O(vocab_size), per row."""
    device, vocab_size = logits.device, logits.shape[-1]
    row_ids = torch.tensor(rows, device=device)
    local, token_ids, is_output = _occurrences(histories, num_prompt_tokens, device)
    if any(p.repetition_penalty != 1.0 for p in params):
        repetition = torch.tensor([p.repetition_penalty for p in params], device=device)
        seen_local, seen_ids = _unique_pairs(local, token_ids, vocab_size)
        index = (row_ids[seen_local], seen_ids)
        seen = logits[index]
        logits[index] = torch.where(seen > 0, seen / repetition[seen_local], seen * repetition[seen_local])
    local, token_ids = local[is_output], token_ids[is_output]
    if not len(token_ids):
        return
    frequency = torch.tensor([p.frequency_penalty for p in params], device=device)
    logits.index_put_((row_ids[local], token_ids), -frequency[local], accumulate=True)  # once per occurrence
    presence = torch.tensor([p.presence_penalty for p in params], device=device)
    local, token_ids = _unique_pairs(local, token_ids, vocab_size)
    logits.index_put_((row_ids[local], token_ids), -presence[local], accumulate=True)  # once per token


def _occurrences(histories: list[Sequence[int]], num_prompt_tokens: list[int], device: torch.device):
    """Every token of every history, flattened: (history index, token id, is it generated?), [num_tokens] each."""
    lengths = torch.tensor([len(h) for h in histories], device=device)
    token_ids = torch.tensor(list(chain.from_iterable(histories)), dtype=torch.long, device=device)
    local = torch.repeat_interleave(torch.arange(len(histories), device=device), lengths)
    starts = torch.cumsum(lengths, 0) - lengths
    positions = torch.arange(len(token_ids), device=device) - starts[local]
    return local, token_ids, positions >= torch.tensor(num_prompt_tokens, device=device)[local]


def _unique_pairs(local: torch.Tensor, token_ids: torch.Tensor, vocab_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    # NOTE: token ids were checked < vocab_size at admission, so row * vocab_size + id is a unique key
    keys = torch.unique(local * vocab_size + token_ids)
    return keys // vocab_size, keys % vocab_size
