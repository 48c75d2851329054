"""engines/trtllm/surface.py on a tiny stand-in tensorrt_llm (written here, as a directory and as a wheel): what
it extracts from the source, and its command line (write, --check, a source without a file it needs)."""

import json
import sys
import zipfile
from pathlib import Path

import pytest

from engines.trtllm import surface

STAND_IN = {
    "version.py": '__version__ = "9.9.9"\n',
    "__init__.py": "from .llmapi import LLM as LLM\nfrom .sampling_params import SamplingParams\nX = 1\n",
    "llmapi/__init__.py": "from .llm_args import KvCacheConfig, CacheTransceiverConfig\n",
    "_tensorrt_engine/__init__.py": "from tensorrt_llm.llmapi.llm import _TrtLLM as LLM\n",
    "sampling_params.py": "@dataclass\nclass SamplingParams:\n    max_tokens: int = 32\n    end_id: Optional[int]\n"
    "class GuidedDecodingParams:\n    json: Optional[str] = None\n",
    "disaggregated_params.py": "class DisaggregatedParams:\n    request_type: Optional[str] = None\n",
    "llmapi/llm_args.py": "class KvCacheConfig(StrictBaseModel):\n    tokens_per_block: int = Field(default=32)\n"
    "class CacheTransceiverConfig(StrictBaseModel):\n"
    "    backend: Optional[Literal['UCX', 'NIXL']] = Field(default=None)\n"
    "class BaseLlmArgs(StrictBaseModel):\n    model: str = Field(description='')\n"
    "class TorchLlmArgs(BaseLlmArgs):\n    enable_iter_perf_stats: bool = False\n"
    "class TrtLlmArgs(BaseLlmArgs):\n    quant_config: QuantConfig = None\n",
    "models/modeling_utils.py": "class QuantConfig:\n    quant_algo: Optional[QuantAlgo] = None\n",
    "quantization/mode.py": "class QuantAlgo(StrEnum):\n    FP8 = auto()\n    NVFP4 = auto()\n",
    "executor/result.py": "class Logprob:\n    logprob: float\nclass CompletionOutput:\n    index: int\n"
    "class GenerationResultBase:\n    @property\n    def outputs(self):\n        pass\n"
    "class GenerationResult(GenerationResultBase):\n    def abort(self):\n        pass\n",
    "executor/utils.py": "class RequestError(RuntimeError):\n    pass\n",
    "executor/executor.py": "class GenerationExecutor(ABC):\n    def __init__(self):\n"
    "        self.doing_shutdown = False\n"
    "    def is_shutdown(self) -> bool:\n        return self.doing_shutdown\n",
    "llmapi/llm.py": "class BaseLLM:\n    def __init__(self, model, dtype='auto', **kwargs):\n"
    "        self._executor: Optional[GenerationExecutor] = None\n        self.args = kwargs\n"
    "    def generate_async(self, inputs, sampling_params=None, *, streaming=False):\n        pass\n"
    "    async def get_stats_async(self, timeout=2):\n        pass\n",
    "_utils.py": "class KVCacheEventSerializer:\n    def to_json(self, e):\n"
    "        out = {'event_id': e.id, 'type': 'stored'}\n"
    "        out['attention_dp_rank'] = 0\n        return {'type': 'removed', 'block_hashes': []}\n",
}


def write_stand_in(root: Path, **replace: str) -> Path:
    for rel, text in {**STAND_IN, **replace}.items():
        path = root / "tensorrt_llm" / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root


def test_extract_reads_fields_members_signatures_attributes_exports_and_event_keys(tmp_path):
    snap = surface.extract(surface.Source.at(write_stand_in(tmp_path)), "stand-in")
    classes = snap["classes"]
    assert snap["tensorrt_llm_version"] == "9.9.9" and snap["source"] == "stand-in"
    assert classes["SamplingParams"]["fields"] == {
        "max_tokens": {"annotation": "int", "default": True},
        "end_id": {"annotation": "Optional[int]", "default": False},
    }
    assert classes["QuantAlgo"]["members"] == ["FP8", "NVFP4"]
    assert classes["RequestError"]["bases"] == ["RuntimeError"]
    assert list(classes["GenerationResultBase"]["methods"]) == ["outputs"]
    assert classes["GenerationResult"]["bases"] == ["GenerationResultBase"]
    assert classes["BaseLLM"]["attributes"] == ["_executor", "args"]
    assert classes["BaseLLM"]["methods"]["generate_async"] == {
        "params": ["inputs", "sampling_params", "streaming"],
        "optional": ["sampling_params", "streaming"],
        "var_keyword": False,
        "is_async": False,
    }
    assert classes["BaseLLM"]["methods"]["__init__"]["var_keyword"] is True
    assert classes["BaseLLM"]["methods"]["get_stats_async"]["is_async"] is True
    assert snap["exports"]["__init__.py"] == ["LLM", "SamplingParams", "X"]
    assert snap["exports"]["_tensorrt_engine/__init__.py"] == ["LLM"]
    assert snap["kv_events"] == {
        "keys": ["attention_dp_rank", "block_hashes", "event_id", "type"],
        "types": ["removed", "stored"],
    }


def test_a_wheel_reads_as_its_directory_does(tmp_path):
    write_stand_in(tmp_path / "dir")
    wheel = tmp_path / "tensorrt_llm-9.9.9-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as archive:
        for rel, text in STAND_IN.items():
            archive.writestr(f"tensorrt_llm/{rel}", text)
    assert surface.extract(surface.Source.at(wheel)) == surface.extract(surface.Source.at(tmp_path / "dir"))


def test_a_package_that_is_a_module_in_this_release_is_found(tmp_path):
    root = write_stand_in(tmp_path)
    (root / "tensorrt_llm/_tensorrt_engine/__init__.py").unlink()
    (root / "tensorrt_llm/_tensorrt_engine").rmdir()
    (root / "tensorrt_llm/_tensorrt_engine.py").write_text("from .llmapi.llm import LLM\n")
    assert surface.extract(surface.Source.at(root))["exports"]["_tensorrt_engine/__init__.py"] == ["LLM"]


def test_the_command_writes_checks_and_names_what_is_missing(tmp_path, capsys):
    root, out = write_stand_in(tmp_path / "src"), tmp_path / "surface.json"
    assert surface.main([str(root), "--out", str(out), "--note", "v9.9.9"]) == 0
    assert json.loads(out.read_text())["source"] == "v9.9.9"
    assert surface.main([str(root), "--out", str(out), "--check"]) == 0  # the note is no part of the API
    write_stand_in(root, **{"quantization/mode.py": "class QuantAlgo(StrEnum):\n    FP8 = auto()\n"})
    assert surface.main([str(root), "--out", str(out), "--check"]) == 1
    (root / "tensorrt_llm/executor/utils.py").unlink()
    assert surface.main([str(root), "--out", str(out)]) == 2
    assert "no tensorrt_llm/executor/utils.py" in capsys.readouterr().err


def test_without_a_source_it_reads_the_installed_package_or_says_it_is_missing(tmp_path, monkeypatch, capsys):
    root, out = write_stand_in(tmp_path / "site"), tmp_path / "surface.json"
    monkeypatch.syspath_prepend(str(root))  # a stand-in tensorrt_llm, found (never imported) as if installed
    assert surface.installed() == root / "tensorrt_llm"
    assert surface.main(["--out", str(out)]) == 0 and json.loads(out.read_text())["tensorrt_llm_version"] == "9.9.9"
    assert "tensorrt_llm" not in sys.modules
    monkeypatch.setattr(surface, "installed", lambda: None)
    with pytest.raises(SystemExit):
        surface.main(["--out", str(out)])
    assert "tensorrt_llm is not installed here" in capsys.readouterr().err


def test_a_source_without_a_class_fails_clearly(tmp_path):
    root = write_stand_in(tmp_path, **{"executor/result.py": "class Logprob:\n    logprob: float\n"})
    with pytest.raises(surface.SourceError, match="no class CompletionOutput"):
        surface.extract(surface.Source.at(root))


def test_the_committed_snapshot_is_the_output_format():
    """Written by surface.dump, so a refresh shows as a plain diff."""
    assert surface.SNAPSHOT.read_text() == surface.dump(surface.load())
