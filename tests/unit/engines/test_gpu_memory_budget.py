"""TANDEM_WORKER_GPU_MEMORY_UTILIZATION, vLLM's meaning: a worker may fill that share of the card, and what is
already in use there (its own weights, another worker's share) counts against it. The card is faked: only its
memory figures (torch.cuda.mem_get_info) are replaced, the sizing code is the engine's."""

import pytest
import torch

from engines.base.engine_configs import CacheConfig
from engines.native import model_runner as mr
from engines.native.kv_cache import bytes_per_block, gpu_share_left

GB = 1 << 30


@pytest.fixture
def card(monkeypatch):
    """An 80 GB card whose free memory the test sets."""
    state = {"free": 80 * GB}
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None: (state["free"], 80 * GB))
    return state


def test_the_share_left_is_the_budget_less_what_the_card_already_holds(card):
    card["free"] = 64 * GB  # this worker's 16 GB of weights are loaded
    assert gpu_share_left("cuda:0", 0.45) == int(80 * GB * 0.45) - 16 * GB


def test_two_workers_sharing_a_card_each_keep_to_their_share(card):
    card["free"] = 80 * GB - 36 * GB - 16 * GB  # the first worker took its 0.45 share; the second's weights loaded
    assert gpu_share_left("cuda:0", 0.45) == 0  # nothing over the first worker's share is left for the second
    assert gpu_share_left("cuda:0", 0.9) == int(80 * GB * 0.9) - 52 * GB


def test_the_kv_cache_is_sized_from_the_share(card, tmp_path):
    from engines.base.engine_configs import BatchConfig
    from engines.base.types import KvLayout
    from engines.native.config import EngineConfig

    card["free"] = 72 * GB  # 8 GB in use: this worker's weights
    config = EngineConfig(
        model=str(tmp_path),
        device="cuda:0",
        batch=BatchConfig(max_num_seqs=1 << 20),
        cache=CacheConfig(gpu_memory_utilization=0.2),
    )
    runner = mr.ModelRunner.__new__(mr.ModelRunner)  # NOTE: the sizing alone; nothing is put on the fake card
    runner.config, runner.device, runner.block_size, runner.max_model_len = config, "cuda:0", 16, 8192
    runner.kv_layout = KvLayout(32, 8, 128, "bfloat16", 16)  # Llama-3.1-8B: 2 MiB a block
    budget = int((int(80 * GB * 0.2) - 8 * GB) * 0.9)  # a tenth kept for activations and graphs
    assert runner._num_blocks() == budget // bytes_per_block(runner.kv_layout) == budget // (2 << 20)
