"""Prompts: exact length, deterministic, drawn from the tokenizer's ordinary ids only."""

import pytest

from tandem.bench.workload import Workload, make_prompts, prompts_for, special_token_ids, vocab_size


def test_prompts_are_exact_and_deterministic():
    w = Workload("w", num_requests=5, isl=33, osl=1, seed=7)
    first = make_prompts(w, num_ids=50, excluded={0, 1, 2})
    assert first == make_prompts(w, num_ids=50, excluded={0, 1, 2})
    assert [len(p) for p in first] == [33] * 5
    assert all(3 <= t < 50 for p in first for t in p)
    assert first != make_prompts(Workload("w", 5, 33, 1, seed=8), num_ids=50, excluded={0, 1, 2})


def test_vocab_and_special_ids_come_from_the_checkpoint(bench_llama):
    assert vocab_size(bench_llama) == 200  # the tokenizer's, below config.json's 256 rows
    assert special_token_ids(bench_llama) == {0, 1, 2}
    prompts = prompts_for(bench_llama, Workload("w", 3, 64, 1))
    assert all(3 <= t < 200 for p in prompts for t in p)


def test_workload_rejects_empty_sizes():
    with pytest.raises(ValueError):
        Workload("w", num_requests=0, isl=1, osl=1)
