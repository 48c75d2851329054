"""A zero-cost runner: no model, tokens at once. For measuring the control plane's own overhead."""

from engines.core.loop import EngineSpec
from engines.zero.runner import ZeroSpec

__all__ = ["ZeroSpec", "zero_spec"]


def zero_spec(model_dir: str, **kw) -> EngineSpec:
    return EngineSpec("engines.zero.runner:build_core", ZeroSpec(model_dir, **kw))
