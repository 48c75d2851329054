"""The fake tensorrt_llm (fake_trtllm.py) against the real package's source: every class, field, method
parameter, LLM argument and KV event key the fake offers must exist in the release. Runs where the source is
on this machine (tensorrt_llm installed, or TANDEM_TRTLLM_SOURCE naming a checkout or a wheel); otherwise it
skips, saying so. The checker itself is tested on a tiny stand-in package, so it can fail."""
import dataclasses
import enum
from pathlib import Path

import pytest

from tests.unit.engines.trtllm import fake_trtllm
from tests.unit.engines.trtllm.trtllm_source import TrtllmSource, bound_names, class_names, classes, methods, \
    parameters, string_constants


def fake_names(obj) -> set[str]:
    if isinstance(obj, type) and issubclass(obj, enum.Enum):
        return set(obj.__members__)
    return {f.name for f in dataclasses.fields(obj)} if dataclasses.is_dataclass(obj) else set()


def mismatches(src: TrtllmSource) -> list[str]:
    """What the fake offers that the real source does not have (empty: they agree)."""
    problems = []
    for name, (rel, real_name) in fake_trtllm.REAL_SOURCES.items():
        real = classes(src.tree(rel)).get(real_name)
        if real is None:
            problems.append(f"{rel}: no class {real_name}")
            continue
        problems += [f"{rel}: {real_name} has no {field}"
                     for field in sorted(fake_names(getattr(fake_trtllm, name)) - class_names(real))]
    for rel, names in fake_trtllm.EXPORTS.items():
        bound = bound_names(src.tree(rel))
        problems += [f"{rel} does not export {n}" for n in names if n not in bound]
    llm = src.tree("llmapi/llm.py")
    for method, params in fake_trtllm.LLM_METHODS.items():
        defined = methods(llm, method)
        if not defined:
            problems.append(f"llmapi/llm.py: no method {method}")
        problems += [f"llmapi/llm.py: {method} takes no {p}" for p in params
                     if defined and not any(p in parameters(fn) for fn in defined)]
    args_tree = src.tree("llmapi/llm_args.py")
    accepted = set().union(*(class_names(c) for n, c in classes(args_tree).items() if n.endswith("LlmArgs")))
    accepted |= set().union(*(parameters(fn) for fn in methods(llm, "__init__")))
    problems += [f"LLM(...) takes no {arg}" for arg in fake_trtllm.LLM_ARGS if arg not in accepted]
    serializer = classes(src.tree("_utils.py")).get("KVCacheEventSerializer")
    keys = string_constants(serializer) if serializer else set()
    problems += [f"_utils.py: KV events have no key {k!r}" for k in fake_trtllm.KV_EVENT_KEYS if k not in keys]
    return problems


def test_the_fake_matches_the_real_release():
    src = TrtllmSource.find()
    if src is None:
        pytest.skip("tensorrt_llm's source is not on this machine (the package is not installed and "
                    "TANDEM_TRTLLM_SOURCE is unset); the fake was written from 1.2.1's public API")
    version = src.version()
    if not version.startswith("1.2"):
        pytest.skip(f"the tensorrt_llm here is {version}; the fake is written from 1.2.1")
    assert mismatches(src) == []


STAND_IN = {  # a tiny tensorrt_llm that has what the fake offers, minus what each case removes
    "version.py": '__version__ = "1.2.1"\n',
    "sampling_params.py": "class SamplingParams:\n" + "".join(
        f"    {f}: int = 0\n" for f in fake_names(fake_trtllm.SamplingParams))
    + "class GuidedDecodingParams:\n" + "".join(
        f"    {f}: int = 0\n" for f in fake_names(fake_trtllm.GuidedDecodingParams)),
    "disaggregated_params.py": "class DisaggregatedParams:\n" + "".join(
        f"    {f}: int = 0\n" for f in fake_names(fake_trtllm.DisaggregatedParams)),
    "llmapi/llm_args.py": "class KvCacheConfig:\n" + "".join(
        f"    {f}: int = 0\n" for f in fake_names(fake_trtllm.KvCacheConfig)) + "class CacheTransceiverConfig:\n"
        "    backend: str = None\n    max_tokens_in_buffer: int = None\nclass TorchLlmArgs:\n" + "".join(
        f"    {a}: int = 0\n" for a in fake_trtllm.LLM_ARGS),
    "models/modeling_utils.py": "class QuantConfig:\n    quant_algo: int = 0\n    kv_cache_quant_algo: int = 0\n",
    "quantization/mode.py": "class QuantAlgo:\n    FP8 = 'FP8'\n    NVFP4 = 'NVFP4'\n",
    "executor/result.py": "class Logprob:\n    logprob: float\n    rank: int = None\nclass CompletionOutput:\n" + "".join(
        f"    {f}: int = 0\n" for f in fake_names(fake_trtllm.CompletionOutput)),
    "executor/utils.py": "class RequestError(RuntimeError):\n    pass\n",
    "llmapi/llm.py": "class BaseLLM:\n    def __init__(self, model, dtype='auto', tensor_parallel_size=1):\n        pass\n"
        "    def generate_async(self, inputs, sampling_params=None, streaming=False, disaggregated_params=None):\n"
        "        pass\n    async def get_stats_async(self, timeout=2):\n        pass\n"
        "    def get_kv_cache_events_async(self, timeout=2):\n        pass\n    def shutdown(self):\n        pass\n",
    "_utils.py": "class KVCacheEventSerializer:\n    KEYS = " + repr(list(fake_trtllm.KV_EVENT_KEYS)) + "\n",
    "__init__.py": "from .llmapi import LLM, SamplingParams\n",
    "llmapi/__init__.py": "from ..disaggregated_params import DisaggregatedParams\n"
                          "from ..sampling_params import GuidedDecodingParams\n"
                          "from .llm_args import CacheTransceiverConfig, KvCacheConfig, QuantAlgo, QuantConfig\n",
    "_tensorrt_engine/__init__.py": "from .llm import LLM\n",
}


def stand_in(root: Path, **replace: str) -> TrtllmSource:
    for rel, text in {**STAND_IN, **replace}.items():
        (root / "tensorrt_llm" / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / "tensorrt_llm" / rel).write_text(text)
    return TrtllmSource.at(root)


def test_the_checker_passes_a_matching_package_and_names_each_difference(tmp_path, monkeypatch):
    assert mismatches(stand_in(tmp_path / "ok")) == []
    monkeypatch.setenv("TANDEM_TRTLLM_SOURCE", str(tmp_path / "ok"))
    assert TrtllmSource.find().version() == "1.2.1"
    broken = stand_in(tmp_path / "broken",
                      **{"quantization/mode.py": "class QuantAlgo:\n    FP8 = 'FP8'\n",
                         "llmapi/llm.py": STAND_IN["llmapi/llm.py"].replace("streaming=False, ", ""),
                         "_utils.py": "class KVCacheEventSerializer:\n    KEYS = ['event_id']\n",
                         "llmapi/__init__.py": "from .llm_args import KvCacheConfig\n"})
    problems = mismatches(broken)
    assert "quantization/mode.py: QuantAlgo has no NVFP4" in problems
    assert "llmapi/llm.py: generate_async takes no streaming" in problems
    assert "_utils.py: KV events have no key 'block_hashes'" in problems
    assert "llmapi/__init__.py does not export QuantConfig" in problems
