"""A worker's warm-up runs one dummy request through its engine's real loop and leaves the engine idle."""

from engines.core.client import EngineClient
from engines.sim import SimOptions, sim_spec
from services.common.worker_base import warm_up


async def test_warm_up_prefills_and_decodes_once_then_the_engine_is_idle():
    engine = EngineClient(sim_spec(SimOptions("", 0.0)))
    await engine.start()
    try:
        await warm_up(engine, num_prompt_tokens=32)
        stats = engine.stats()
        assert (stats.num_prompt_tokens_computed, stats.num_generated_tokens) == (32, 4)
        assert stats.num_waiting + stats.num_running + stats.num_held == 0
    finally:
        await engine.shutdown()
