"""The transformers runner on a tiny random Llama: exact token counts, step timestamps, parameter count."""

import pytest
import torch

from tandem.bench.hf_baseline import HfRunner, count_parameters, left_pad
from tests.unit.bench.conftest import TINY_CONFIG


def test_left_pad_aligns_last_tokens():
    ids, mask = left_pad([[5, 6, 7], [8]])
    assert ids.tolist() == [[5, 6, 7], [0, 0, 8]]
    assert mask.tolist() == [[1, 1, 1], [0, 0, 1]]


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_runner_makes_exactly_osl_tokens_per_request(bench_llama, dtype):
    runner = HfRunner(bench_llama, dtype)
    assert runner.model.dtype == getattr(torch, dtype)
    prompts = [[3 + i] * 10 for i in range(3)] + [[9] * 4]  # one shorter prompt: left padded
    traces = runner.run(prompts, osl=7)
    assert [t.num_tokens for t in traces] == [7] * 4
    for t in traces:  # token i of every request arrives at step i's time
        assert t.token_times_s == traces[0].token_times_s
        assert t.submit_s < t.token_times_s[0]
        assert all(b >= a for a, b in zip(t.token_times_s, t.token_times_s[1:]))
    assert "model.generate" in runner.mode


def _expected_parameters(tied: bool) -> int:
    h, i, v, n = (TINY_CONFIG[k] for k in ("hidden_size", "intermediate_size", "vocab_size", "num_hidden_layers"))
    head_dim = h // TINY_CONFIG["num_attention_heads"]
    kv = TINY_CONFIG["num_key_value_heads"] * head_dim
    per_layer = h * (h + 2 * kv) + h * h + 3 * h * i + 2 * h  # q, k, v, o, gate/up/down, two norms
    return n * per_layer + h + v * h  # final norm; the embedding counted once, as the lm_head


def test_count_parameters_counts_the_embedding_once(bench_llama, bench_llama_tied):
    assert count_parameters(bench_llama) == _expected_parameters(tied=False)
    assert count_parameters(bench_llama_tied) == _expected_parameters(tied=True)
