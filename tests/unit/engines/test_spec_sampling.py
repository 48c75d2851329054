"""Speculative sampling keeps the target's distribution: rows that verify prompt-lookup proposals (a point-mass
draft) on a tiny model's real logits emit tokens distributed as the target's p, checked by chi-square tests at a
1e-4 level with a fixed seed; the same tests reject a broken rule (a residual that keeps the rejected proposal)."""

import math

import pytest
import torch

from engines.base.engine_configs import CacheConfig
from engines.base.types import SamplingParams
from engines.native import sampler
from engines.native.config import EngineConfig
from engines.native.runner import build_core, prompt_logits
from engines.native.sampler import SampleRow, sample

NUM_TRIALS = 6000
PARAMS = SamplingParams(max_tokens=8, temperature=0.8, top_k=8, min_p=0.02)  # min-p: p left unnormalized
Z_1E4 = 3.719  # the standard normal's 1 - 1e-4 quantile


def chi2_critical(df: int) -> float:
    """The chi-square 1 - 1e-4 quantile (Wilson-Hilferty; within 5% for df >= 2, on the lenient side)."""
    a = 2.0 / (9.0 * df)
    return df * (1.0 - a + Z_1E4 * math.sqrt(a)) ** 3


def chi2(counts: torch.Tensor, probs: torch.Tensor) -> tuple[float, int]:
    """Pearson's statistic over the tokens p allows, pooling those expected fewer than 5 times; (stat, df)."""
    n = counts.sum().item()
    expected = probs * n
    big = expected >= 5
    assert counts[probs == 0].sum() == 0, "a token p forbids was emitted"
    obs = torch.cat([counts[big].float(), counts[~big & (probs > 0)].sum().float().reshape(1)])
    exp = torch.cat([expected[big], expected[~big & (probs > 0)].sum().reshape(1)])
    keep = exp > 0
    stat = (((obs - exp) ** 2)[keep] / exp[keep]).sum().item()
    return stat, int(keep.sum().item()) - 1


def target_probs(logits: torch.Tensor) -> torch.Tensor:
    """p as the sampler defines it for PARAMS: temperature, top-k, min-p; normalized."""
    row = logits / PARAMS.temperature
    kth = torch.topk(row, PARAMS.top_k).values[-1]
    probs = row.masked_fill(row < kth, float("-inf")).softmax(-1)
    probs = probs.masked_fill(probs < PARAMS.min_p * probs.max(), 0.0)
    return probs / probs.sum()


@pytest.fixture(scope="module")
def model_rows(tiny_llama):
    """The tiny model's logits at the last two positions of prompt + d1 (the rows verifying d1 and d2), and the
    proposals: d1 the second most likely token (often rejected, often accepted), d2 the most likely."""
    core = build_core(EngineConfig(model=str(tiny_llama), cache=CacheConfig(num_blocks=32)))
    prompt = torch.randint(0, 256, (20,), generator=torch.Generator().manual_seed(5)).tolist()
    p0 = target_probs(prompt_logits(core, prompt)[-1])
    d1 = int(torch.topk(p0, 2).indices[1])
    logits = prompt_logits(core, prompt + [d1])[-2:]  # [2, vocab]: verifies d1, then d2
    d2 = int(target_probs(logits[1]).argmax())
    return logits, (d1, d2)


def run_trials(logits: torch.Tensor, drafts: tuple[int, int]) -> list[list[int]]:
    rows = [SampleRow(PARAMS, 0, draft=drafts[0]), SampleRow(PARAMS, 1, draft=drafts[1]), SampleRow(PARAMS, 2)]
    third = logits[1:]  # the bonus row's logits are not examined here: any valid distribution will do
    batch = torch.cat([logits, third]).repeat(NUM_TRIALS, 1)
    gen = torch.Generator().manual_seed(1234)
    out = sample(batch, rows * NUM_TRIALS, gen, group_sizes=(3,) * NUM_TRIALS).to_host()
    return [[t for t, _ in accepted] for accepted in out]


def emitted_counts(runs: list[list[int]], vocab: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Counts of the first emitted token, and of the second among runs whose first was the proposal d1."""
    first = torch.bincount(torch.tensor([r[0] for r in runs]), minlength=vocab)
    second = torch.bincount(torch.tensor([r[1] for r in runs if len(r) > 1]), minlength=vocab)
    return first, second


def check(model_rows) -> list[bool]:
    logits, drafts = model_rows
    p0, p1 = target_probs(logits[0]), target_probs(logits[1])
    assert 0.1 < p0[drafts[0]] < 0.9  # both branches of the rule are exercised
    runs = run_trials(logits, drafts)
    first, second = emitted_counts(runs, logits.shape[-1])
    assert all(r[0] != drafts[0] or len(r) > 1 for r in runs)  # an accepted proposal is followed by a token
    verdicts = []
    for counts, probs in ((first, p0), (second, p1)):
        stat, df = chi2(counts, probs)
        verdicts.append(stat < chi2_critical(df))
    return verdicts


def test_verified_tokens_follow_the_targets_distribution(model_rows):
    assert check(model_rows) == [True, True]


def test_the_test_rejects_a_residual_that_keeps_the_proposal(model_rows, monkeypatch):
    monkeypatch.setattr(sampler, "residual", lambda probs, draft: probs)  # on rejection, draw from p itself
    assert check(model_rows)[0] is False


def test_the_test_rejects_greedy_acceptance(model_rows, monkeypatch):
    monkeypatch.setattr(
        sampler, "residual", lambda probs, draft: torch.where(torch.arange(len(probs)) == probs.argmax(), 1.0, 0.0)
    )  # on rejection, always the mode
    assert check(model_rows)[0] is False


def test_critical_values_match_the_table():
    for df, table in ((2, 18.42), (7, 29.88), (10, 35.56)):
        assert table <= chi2_critical(df) <= table * 1.05
