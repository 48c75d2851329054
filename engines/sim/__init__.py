"""A timing runner over engines/core: each step costs what a measured profile says."""

from engines.core.loop import EngineSpec
from engines.sim.config import SimOptions
from engines.sim.runner import SimSpec

__all__ = ["SimOptions", "SimSpec", "sim_spec"]


def sim_spec(sim: SimOptions = SimOptions(), **kw) -> EngineSpec:
    return EngineSpec("engines.sim.runner:build_core", SimSpec(sim, **kw))
