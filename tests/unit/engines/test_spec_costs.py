"""Verification costs timed at start: one figure per draft length, from a decode step and verifying steps in scratch
blocks, and the adaptive rule reads them as they are (on a CPU verifying is far from linear in k)."""

import pytest

from engines.base.engine_configs import CacheConfig
from engines.core.speculative import SpecConfig, best_draft_len
from engines.native.config import EngineConfig, ModelConfig
from engines.native.model_runner import ModelRunner
from engines.native.spec_costs import measure_verify_costs


def runner(model_dir, num_blocks: int) -> ModelRunner:
    config = EngineConfig(model=str(model_dir), cache=CacheConfig(num_blocks=num_blocks, block_size=16))
    return ModelRunner(config, ModelConfig.from_dir(str(model_dir)))


def test_one_cost_per_draft_length_and_kind_each_a_fraction_of_a_decode_step(tiny_llama):
    costs = measure_verify_costs(runner(tiny_llama, 16), 4, repeats=2)
    assert set(costs) == {"greedy", "sampled"}
    assert all(len(c) == 4 and min(c) >= 0.0 for c in costs.values())


def test_a_cache_too_small_for_the_timed_steps_is_a_clear_error(tiny_llama):
    with pytest.raises(ValueError, match="KV blocks"):
        measure_verify_costs(runner(tiny_llama, 4), 4, repeats=1)


def test_the_rule_reads_the_measured_table_and_adds_the_proposers_cost():
    # as measured on a 2-core CPU: verifying 4 tokens (one blocked GEMM) is cheaper than verifying 2
    spec = SpecConfig("ngram", max_draft_tokens=4, verify_costs=(0.75, 1.2, 1.1, 0.54))
    assert [spec.cost(k) for k in (1, 4)] == [0.75, 0.54]
    assert best_draft_len(0.5, 4, spec.cost) == 4  # 1.94 / 1.54 > 1, while k = 1: 1.5 / 1.75 < 1
    assert best_draft_len(0.25, 4, spec.cost) == 0
    assert SpecConfig("ngram", draft_cost=0.1, propose_cost=0.4).cost(2) == pytest.approx(1.0)
    sampled = SpecConfig("ngram", verify_costs=(0.75, 1.2, 1.1, 0.54), verify_costs_sampled=(0.9, 1.5, 1.6, 1.2))
    assert (sampled.cost(4), sampled.cost(4, is_greedy=False)) == (0.54, 1.2)
    assert best_draft_len(0.5, 4, lambda k: sampled.cost(k, False)) == 0  # sampling each verified row: no k pays
    with pytest.raises(ValueError, match="verify_costs"):
        SpecConfig("ngram", verify_costs=(0.5, -0.1))
