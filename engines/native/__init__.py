"""The PyTorch runner over engines/core. Importing this package imports no torch; the engine process does."""

from engines.core.loop import EngineSpec
from engines.native.config import EngineConfig

__all__ = ["native_spec"]


def native_spec(config: EngineConfig) -> EngineSpec:
    return EngineSpec("engines.native.runner:build_core", config)
