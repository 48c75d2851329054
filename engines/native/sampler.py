"""Token sampling: greedy, temperature, top-k, top-p, min-p (after penalties.py's shaping), and log-probabilities
(of the unmodified distribution) for the chosen token and top-N alternatives. A seeded row draws from a generator
keyed on (seed, index of the token it generates), so a request continued elsewhere samples what it would have here.
A row that verifies a proposed token (speculative decoding) applies the speculative-sampling acceptance rule.

`sample` only enqueues device work; `SampledTokens.to_host` is where the host waits for the device.
"""

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from engines.base.types import SamplingParams, TokenLogprob
from engines.native.penalties import shape_logits

_MASK64 = (1 << 64) - 1


@dataclass(frozen=True, slots=True)
class SampleRow:
    params: SamplingParams
    index: int  # of the token this row generates, counting the request's output from 0
    banned: tuple[int, ...] = ()  # token ids it must not produce (stop tokens before min_tokens)
    token_ids: Sequence[int] = ()  # prompt + generated so far (read at `sample`, for penalties)
    num_prompt_tokens: int = 0  # of token_ids
    draft: int = -1  # the token proposed for this row's position, which the row accepts or rejects; -1: none


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
    group_sizes: tuple[int, ...] = ()  # rows per sampling sequence when some verify proposals; (): one each

    def to_host(self) -> list:
        """(token, logprob) per sampling sequence; for a group of verifying rows, the list of the tokens it accepts:
        each row's token while it equals the row's proposal, then the first that does not (or the last row's)."""
        token_list = self.tokens.tolist()
        flat = list(zip(token_list, _logprobs(self.logits, [r.params for r in self.rows], token_list)))
        if not self.group_sizes:
            return flat
        out, first = [], 0
        for size in self.group_sizes:
            if size == 1:
                out.append(flat[first])
            else:
                n = next((j for j in range(size - 1) if token_list[first + j] != self.rows[first + j].draft), size - 1)
                out.append(flat[first : first + n + 1])
            first += size
        return out


def sample(
    logits: torch.Tensor,
    rows: list[SampleRow],
    generator: torch.Generator,
    allowed: torch.Tensor | None = None,
    group_sizes: tuple[int, ...] = (),
) -> SampledTokens:
    """`logits` [num_rows, vocab_size] float32, the caller's to give away: penalties, bias and the mask apply in place
    unless a row asks for log-probabilities; `generator` draws for unseeded rows; `allowed` [num_rows, vocab_size]
    bool, when given, is each row's grammar mask (False: never sampled), applied after the shaping."""
    params = [r.params for r in rows]
    wants_logprobs = any(p.logprobs or p.top_logprobs for p in params)  # then the unmodified logits are kept
    masked = shape_logits(
        logits, params, [r.token_ids for r in rows], [r.num_prompt_tokens for r in rows], in_place=not wants_logprobs
    )
    has_banned = any(r.banned for r in rows)
    if (allowed is not None or has_banned) and masked is logits and wants_logprobs:
        masked = logits.clone()  # NOTE: log-probabilities read the unmodified logits
    if allowed is not None:
        masked.masked_fill_(~allowed, float("-inf"))  # in place: a fresh [rows, vocab] copy costs more than the fill
    if has_banned:
        for i, r in enumerate(rows):
            if r.banned:
                masked[i, list(r.banned)] = float("-inf")
    tokens = masked.argmax(dim=-1)  # greedy for every row (a greedy proposal is accepted iff it is the argmax)
    for i, r in enumerate(rows):
        if r.params.is_greedy:
            continue
        probs = _probs_row(masked[i], r.params)
        gen = _generator_for(r, generator)
        tokens[i] = _verify_row(probs, r.draft, gen) if r.draft >= 0 else torch.multinomial(probs, 1, generator=gen)[0]
    return SampledTokens(tokens, logits, rows, group_sizes)


def _generator_for(row: SampleRow, shared: torch.Generator) -> torch.Generator:
    if row.params.seed is None:
        return shared
    gen = torch.Generator(device=shared.device)
    gen.manual_seed(row_seed(row.params.seed, row.index))
    return gen


def _verify_row(probs: torch.Tensor, draft: int, gen: torch.Generator) -> torch.Tensor:
    """Speculative sampling's rule for a proposal drawn from q = a point mass on `draft` (prompt lookup): accept it
    with probability min(1, p/q) = p(draft); else draw from the residual norm(max(0, p - q)), which is p without
    `draft`. Either way the token is distributed as p."""
    if (
        torch.rand((), generator=gen, device=probs.device) * probs.sum() < probs[draft]
    ):  # NOTE: min-p leaves p unnormalized
        return torch.tensor(draft, device=probs.device)
    return torch.multinomial(residual(probs, draft), 1, generator=gen)[0]


def residual(probs: torch.Tensor, draft: int) -> torch.Tensor:
    """max(0, p - q) for q the point mass on `draft` (multinomial renormalizes)."""
    out = probs.clone()
    out[draft] = 0.0
    if not out.sum() > 0:  # NOTE: p was all on `draft`, which was then accepted with probability 1: unreachable
        out[draft] = 1.0
    return out


def _probs_row(row: torch.Tensor, p: SamplingParams) -> torch.Tensor:
    """The distribution a sampled row draws from (unnormalized after min-p): temperature, top-k, top-p, min-p."""
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
    if p.min_p > 0.0:
        probs = probs.masked_fill(probs < p.min_p * probs.max(), 0.0)  # multinomial renormalizes
    return probs


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
