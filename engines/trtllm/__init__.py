"""TensorRT-LLM as a tandem worker engine. Importing this package never imports tensorrt_llm."""

from engines.trtllm.api import INSTALL_HINT, require_package
from engines.trtllm.config import TRTLLM_VERSION, TrtllmConfig
from engines.trtllm.engine import TrtllmEngine

__all__ = ["INSTALL_HINT", "TRTLLM_VERSION", "TrtllmConfig", "TrtllmEngine", "require_package"]
