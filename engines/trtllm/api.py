"""The few TensorRT-LLM objects the adapter touches, gathered in one place so that `tensorrt_llm` is imported
only here, only when a worker starts, and so that tests can hand the adapter a fake of exactly these.
Must not import tensorrt_llm at module import."""

import importlib.util
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from engines.base.errors import EngineUnavailableError
from engines.trtllm.config import TRTLLM_VERSION

INSTALL_HINT = (
    f"run the worker in NVIDIA's TensorRT-LLM container (nvcr.io/nvidia/tensorrt-llm/release:"
    f"{TRTLLM_VERSION}; docker/worker-trtllm.Dockerfile builds tandem on it) or install it on a "
    f"CUDA host: pip install tensorrt-llm=={TRTLLM_VERSION}"
)


@dataclass(frozen=True, slots=True)
class TrtllmApi:
    LLM: Any  # tensorrt_llm.LLM (PyTorch backend)
    TrtLLM: Any  # tensorrt_llm._tensorrt_engine.LLM (TensorRT engines)
    SamplingParams: Any
    DisaggregatedParams: Any
    GuidedDecodingParams: Any
    KvCacheConfig: Any
    CacheTransceiverConfig: Any
    QuantConfig: Any
    QuantAlgo: Any
    gpu_memory: Callable[[], tuple[int, int]]  # (free, total) bytes of this process's GPU


def require_package() -> None:
    """Raise EngineUnavailableError (one line: what is missing, how to get it) when tensorrt_llm is absent.
    Looks the package up without importing it: importing it needs a GPU driver."""
    if importlib.util.find_spec("tensorrt_llm") is None:
        raise EngineUnavailableError(
            f"engine trtllm needs the tensorrt_llm package, which is not installed: {INSTALL_HINT}"
        )


def load_api() -> TrtllmApi:
    require_package()
    try:
        import tensorrt_llm
        import torch
        from tensorrt_llm import _tensorrt_engine, llmapi
    except (ImportError, OSError, RuntimeError) as exc:  # e.g. no driver, or a CUDA mismatch
        raise EngineUnavailableError(f"tensorrt_llm is installed but does not import ({exc}); {INSTALL_HINT}") from None
    return TrtllmApi(
        LLM=tensorrt_llm.LLM,
        TrtLLM=_tensorrt_engine.LLM,
        SamplingParams=tensorrt_llm.SamplingParams,
        DisaggregatedParams=llmapi.DisaggregatedParams,
        GuidedDecodingParams=llmapi.GuidedDecodingParams,
        KvCacheConfig=llmapi.KvCacheConfig,
        CacheTransceiverConfig=llmapi.CacheTransceiverConfig,
        QuantConfig=llmapi.QuantConfig,
        QuantAlgo=llmapi.QuantAlgo,
        gpu_memory=torch.cuda.mem_get_info,
    )


def executor_failure(llm: Any) -> str | None:
    """Why TensorRT-LLM's LLM object can serve no more, or None while it can. LLM._executor is private, but it is
    what LLM.generate_async itself checks before taking a request; the snapshot test (api_surface.json) fails the
    day one of the names read here moves."""
    executor = getattr(llm, "_executor", None)
    if executor is None:
        return "TensorRT-LLM's executor is gone"
    try:
        if executor.is_shutdown():
            return "TensorRT-LLM's executor has shut down (a background error ended it)"
        # NOTE: a worker process that died only queues its error here; the executor shuts down when something
        # next calls its _handle_background_error (a new request), so a quiet death shows here first
        pending = getattr(executor, "_error_queue", None)
        if pending is not None and not pending.empty():
            return "TensorRT-LLM's executor has a background error queued (a worker process or thread failed)"
    except Exception as exc:  # NOTE: an executor that cannot even answer this is as good as dead
        return f"TensorRT-LLM's executor does not answer: {exc}"
    return None
