"""A timing runner over engines/core: each step costs what a measured profile says."""

from engines.core.loop import EngineSpec
from engines.sim.runner import SimSpec

__all__ = ["SimSpec", "sim_spec"]


def sim_spec(profile: str = "", time_factor: float = 1.0, **kw) -> EngineSpec:
    return EngineSpec("engines.sim.runner:build_core", SimSpec(profile, time_factor, **kw))
