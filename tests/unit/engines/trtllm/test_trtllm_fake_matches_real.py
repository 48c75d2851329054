"""The fake tensorrt_llm against the snapshot of the release's source (engines/trtllm/api_surface.json, written by
engines/trtllm/surface.py): runs everywhere, no TensorRT-LLM needed. A drift between the fake and the real API
fails it (shown on perturbed copies of the snapshot), and the extraction itself is tested on a tiny package."""

import copy

import pytest

from engines.trtllm import surface
from tests.unit.engines.trtllm.fake_surface import literal_values, mismatches


@pytest.fixture(scope="module")
def snapshot() -> dict:
    return surface.load()


def test_the_fake_and_the_adapter_match_the_snapshot(snapshot):
    assert mismatches(snapshot) == []


def test_the_snapshot_holds_the_executor_failure_signal(snapshot):
    """What api.executor_failure reads exists in the release: LLM._executor, GenerationExecutor.is_shutdown and
    its _error_queue."""
    assert "_executor" in snapshot["classes"]["BaseLLM"]["attributes"]
    executor = snapshot["classes"]["GenerationExecutor"]
    assert executor["methods"]["is_shutdown"]["params"] == [] and "_error_queue" in executor["attributes"]


def perturbed(snapshot: dict, change) -> list[str]:
    broken = copy.deepcopy(snapshot)
    change(broken["classes"], broken)
    return mismatches(broken)


@pytest.mark.parametrize(
    "change, named",
    [
        (lambda c, s: c["SamplingParams"]["fields"].pop("min_tokens"), "SamplingParams has no field min_tokens"),
        (
            lambda c, s: c["KvCacheConfig"]["fields"]["tokens_per_block"].update(default=False),
            "KvCacheConfig.tokens_per_block has no default in the release",
        ),
        (lambda c, s: c["QuantAlgo"]["members"].remove("NVFP4"), "QuantAlgo has no member NVFP4"),
        (
            lambda c, s: c["BaseLLM"]["methods"]["generate_async"]["params"].remove("streaming"),
            "LLM.generate_async takes no streaming",
        ),
        (
            lambda c, s: c["BaseLLM"]["methods"]["generate_async"]["optional"].remove("lora_request"),
            "LLM.generate_async needs lora_request, which the adapter does not pass",
        ),
        (lambda c, s: c["BaseLLM"]["attributes"].remove("_executor"), "LLM has no attribute _executor"),
        (
            lambda c, s: c["GenerationExecutor"]["methods"].pop("is_shutdown"),
            "GenerationExecutor has no method is_shutdown",
        ),
        (lambda c, s: c["GenerationResult"]["methods"].pop("finished"), "GenerationResult has no finished"),
        (lambda c, s: c["GenerationResultBase"]["methods"].pop("outputs"), "GenerationResult has no outputs"),
        (
            lambda c, s: c["GenerationExecutor"]["attributes"].remove("_error_queue"),
            "GenerationExecutor has no attribute _error_queue",
        ),
        (
            lambda c, s: c["TorchLlmArgs"]["fields"].pop("enable_iter_perf_stats"),
            "LLM(...) takes no enable_iter_perf_stats",
        ),
        (lambda c, s: c["RequestError"].update(bases=["Exception"]), "RequestError is not a RuntimeError"),
        (lambda c, s: c.pop("DisaggregatedParams"), "no class DisaggregatedParams"),
        (
            lambda c, s: s["exports"]["llmapi/__init__.py"].remove("QuantConfig"),
            "llmapi/__init__.py does not export QuantConfig",
        ),
        (lambda c, s: s["kv_events"]["keys"].remove("block_hashes"), "KV events have no key 'block_hashes'"),
        (lambda c, s: s["kv_events"]["types"].remove("removed"), "KV events have no type 'removed'"),
        (
            lambda c, s: c["CacheTransceiverConfig"]["fields"]["backend"].update(
                annotation="Optional[Literal['DEFAULT', 'NIXL', 'MPI']]"
            ),
            "CacheTransceiverConfig.backend takes no 'UCX'",
        ),
    ],
)
def test_a_drift_from_the_release_is_named(snapshot, change, named):
    assert named in perturbed(snapshot, change)


def test_literal_values_reads_nested_literals():
    assert literal_values("Optional[Literal['a', \"b\"]]") == {"a", "b"}
    assert literal_values("typing.Literal['x'] | None") == {"x"}
    assert literal_values("Optional[str]") == set()
