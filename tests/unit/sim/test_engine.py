"""SimEngine behind the Engine protocol: deterministic tokens, profiled time, held KV and real KV events."""
import pytest

from engines.base.engine import Engine
from engines.base.errors import RequestNotFoundError
from engines.base.types import EngineRequest, SamplingParams
from engines.sim.engine import SimEngine
from engines.sim.profile import TimingProfile

PROFILE = TimingProfile("tiny", 4, 8, 2, 8, (0.0, 1.0, 10.0), (0.0, 0.0, 5.0))


async def collect(engine, request):
    return [out async for out in engine.add_request(request)]


async def test_generates_and_holds_kv():
    engine = SimEngine(PROFILE, time_factor=0.0)
    assert isinstance(engine, Engine)
    await engine.start()
    try:
        outs = await collect(engine, EngineRequest("a", tuple(range(8)), SamplingParams(max_tokens=3), hold_kv=True))
        assert sum(len(o.new_token_ids) for o in outs) == 3 and outs[-1].finished
        again = await collect(engine, EngineRequest("b", tuple(range(8)), SamplingParams(max_tokens=3)))
        assert [o.new_token_ids for o in again] == [o.new_token_ids for o in outs]
        assert again[0].num_cached_tokens == 4  # a's first full block, from the prefix cache
        kv = await engine.export_kv("a")
        assert kv.num_tokens == 10
        await engine.release_kv("a")
        with pytest.raises(RequestNotFoundError):
            await engine.export_kv("a")
        assert (await engine.kv_events_since(0))[0].block_hashes
        assert engine.stats().num_held == 0 and engine.stats().num_running == 0
        # a prefilled all 8 prompt tokens; b only the 4 after its cached block (both prompts, then decodes)
        assert (engine.stats().num_prompt_tokens_computed, engine.stats().num_generated_tokens) == (12, 6)
    finally:
        await engine.shutdown()


def test_worker_settings_build_a_sim_engine():
    from services.common.engine_factory import make_engine
    from services.common.worker_settings import WorkerSettings

    engine = make_engine(WorkerSettings(role="decode", engine="sim", model="unused"))
    assert isinstance(engine, SimEngine) and engine.kv_layout.block_size == 64


async def test_resetting_the_sim_prefix_cache_publishes_cleared():
    from engines.base import EngineBusyError
    from engines.base.events import KvEventKind

    engine = SimEngine(PROFILE, time_factor=0.0)
    await engine.start()
    try:
        await collect(engine, EngineRequest("a", tuple(range(8)), SamplingParams(max_tokens=2), hold_kv=True))
        with pytest.raises(EngineBusyError):
            await engine.reset_prefix_cache()
        await engine.release_kv("a")
        last = engine.worker.event_log.last_seq
        assert await engine.reset_prefix_cache() == 2  # 8 prompt + 1 computed output token: 2 blocks of 4
        assert [e.kind for e in await engine.kv_events_since(last)] == [KvEventKind.CLEARED]
        again = await collect(engine, EngineRequest("b", tuple(range(8)), SamplingParams(max_tokens=2)))
        assert again[0].num_cached_tokens == 0
    finally:
        await engine.shutdown()
