"""Token sampling: greedy, temperature, top-k, top-p with a per-request seeded generator, and
log-probabilities (of the unmodified distribution) for the chosen token and top-N alternatives."""
import torch

from engines.base.types import SamplingParams, TokenLogprob


def make_generator(seed: int | None, device: str) -> torch.Generator:
    gen = torch.Generator(device=device)
    if seed is None:
        gen.seed()
    else:
        gen.manual_seed(seed)
    return gen


def sample(
    logits: torch.Tensor,  # [num_rows, vocab_size] float32
    params: list[SamplingParams],
    generators: list[torch.Generator],
) -> tuple[list[int], list[TokenLogprob | None]]:
    tokens = logits.argmax(dim=-1)  # greedy for every row; sampled rows are overwritten below
    for i, p in enumerate(params):
        if not p.is_greedy:
            tokens[i] = _sample_row(logits[i], p, generators[i])
    token_list = tokens.tolist()
    return token_list, _logprobs(logits, params, token_list)


def _sample_row(row: torch.Tensor, p: SamplingParams, gen: torch.Generator) -> int:
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
    return int(torch.multinomial(probs, 1, generator=gen))


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
