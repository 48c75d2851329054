"""Token sampling: greedy, temperature, top-k, top-p, and log-probabilities (of the unmodified distribution) for
the chosen token and top-N alternatives. A seeded row draws from a generator keyed on (seed, index of the token
it generates), so a request continued on another engine samples what it would have sampled in one place.

`sample` only enqueues device work; `SampledTokens.to_host` is where the host waits for the device.
"""
from dataclasses import dataclass

import torch

from engines.base.types import SamplingParams, TokenLogprob

_MASK64 = (1 << 64) - 1


@dataclass(frozen=True, slots=True)
class SampleRow:
    params: SamplingParams
    index: int  # of the token this row generates, counting the request's output from 0
    banned: tuple[int, ...] = ()  # token ids it must not produce (stop tokens before min_tokens)


def row_seed(seed: int, index: int) -> int:
    """A well-mixed 63-bit seed for (seed, index) (splitmix64's finalizer)."""
    z = (seed * 0x9E3779B97F4A7C15 + index + 1) & _MASK64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK64
    return (z ^ (z >> 31)) & ((1 << 63) - 1)


@dataclass(slots=True)
class SampledTokens:
    """Tokens on the device; `to_host` syncs and adds the log-probabilities asked for."""

    tokens: torch.Tensor  # [num_rows] long
    logits: torch.Tensor  # [num_rows, vocab_size] float32, unmodified
    rows: list[SampleRow]

    def to_host(self) -> list[tuple[int, TokenLogprob | None]]:
        token_list = self.tokens.tolist()
        return list(zip(token_list, _logprobs(self.logits, [r.params for r in self.rows], token_list)))


def sample(logits: torch.Tensor, rows: list[SampleRow], generator: torch.Generator,
           allowed: torch.Tensor | None = None) -> SampledTokens:
    """`logits` [num_rows, vocab_size] float32; `generator` draws for unseeded rows; `allowed` [num_rows,
    vocab_size] bool, when given, is each row's grammar mask (False: never sampled)."""
    masked = logits if allowed is None else logits.masked_fill(~allowed, float("-inf"))
    if any(r.banned for r in rows):
        masked = masked.clone() if allowed is None else masked
        for i, r in enumerate(rows):
            if r.banned:
                masked[i, list(r.banned)] = float("-inf")
    tokens = masked.argmax(dim=-1)  # greedy for every row; sampled rows are overwritten below
    for i, r in enumerate(rows):
        if not r.params.is_greedy:
            tokens[i] = _sample_row(masked[i], r.params, _generator_for(r, generator))
    return SampledTokens(tokens, logits, rows)


def _generator_for(row: SampleRow, shared: torch.Generator) -> torch.Generator:
    if row.params.seed is None:
        return shared
    gen = torch.Generator(device=shared.device)
    gen.manual_seed(row_seed(row.params.seed, row.index))
    return gen


def _sample_row(row: torch.Tensor, p: SamplingParams, gen: torch.Generator) -> torch.Tensor:
    row = row / p.temperature
    if p.top_k > 0:
        kth = torch.topk(row, min(p.top_k, row.shape[-1])).values[-1]
        row = row.masked_fill(row < kth, float("-inf"))
    if p.top_p < 1.0:
        sorted_logits, order = torch.sort(row, descending=True)
        probs = sorted_logits.softmax(-1)
        # drop a token when the tokens before it already reach top_p (the first is always kept)
        drop = (probs.cumsum(-1) - probs) >= p.top_p
        row = row.scatter(0, order[drop], float("-inf"))
    probs = row.softmax(-1)
    return torch.multinomial(probs, 1, generator=gen)[0]


def _logprobs(logits: torch.Tensor, params: list[SamplingParams], tokens: list[int]):
    if not any(p.logprobs or p.top_logprobs for p in params):
        return [None] * len(params)
    logp = logits.log_softmax(-1)
    out: list[TokenLogprob | None] = []
    for i, p in enumerate(params):
        if not (p.logprobs or p.top_logprobs):
            out.append(None)
            continue
        top: tuple[tuple[int, float], ...] = ()
        if p.top_logprobs:
            values, ids = torch.topk(logp[i], p.top_logprobs)
            top = tuple(zip(ids.tolist(), values.tolist()))
        out.append(TokenLogprob(tokens[i], float(logp[i, tokens[i]]), top))
    return out
