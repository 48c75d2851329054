"""The sim engine behind the Engine protocol (its loop on a thread): deterministic tokens, profiled time, held KV
and real KV events."""

import json

import pytest

from engines.base.errors import RequestNotFoundError
from engines.base.types import EngineRequest, FinishReason, SamplingParams
from engines.core.client import EngineClient
from engines.sim import SimOptions, sim_spec
from engines.timing.profile import TimingProfile

PROFILE = TimingProfile("tiny", 4, 8, 2, 8, (0.0, 1.0, 10.0), (0.0, 0.0, 5.0))


async def collect(engine, request):
    return [out async for out in engine.add_request(request)]


@pytest.fixture
async def engine(tmp_path):
    path = tmp_path / "tiny.json"
    path.write_text(json.dumps(PROFILE.to_dict()))
    engine = EngineClient(sim_spec(SimOptions(str(path), time_factor=0.0)))
    await engine.start()
    yield engine
    await engine.shutdown()


async def test_generates_and_holds_kv(engine):
    outs = await collect(engine, EngineRequest("a", tuple(range(8)), SamplingParams(max_tokens=3), hold_kv=True))
    assert [len(o.new_token_ids) for o in outs] == [1] and outs[-1].finish_reason is FinishReason.PREFILLED
    again = await collect(engine, EngineRequest("b", tuple(range(8)), SamplingParams(max_tokens=3)))
    assert again[0].new_token_ids == outs[0].new_token_ids and sum(len(o.new_token_ids) for o in again) == 3
    assert again[0].num_cached_tokens == 4  # a's first full block, from the prefix cache
    kv = await engine.export_kv("a")
    assert kv.num_tokens == 8
    await engine.release_kv("a")
    with pytest.raises(RequestNotFoundError):
        await engine.export_kv("a")
    assert (await engine.kv_events_since(0))[0].block_hashes
    assert engine.stats().num_held == 0 and engine.stats().num_running == 0
    # a prefilled all 8 prompt tokens; b only the 4 after its cached block (both prompts, then decodes)
    assert (engine.stats().num_prompt_tokens_computed, engine.stats().num_generated_tokens) == (12, 4)


def test_worker_settings_build_a_sim_engine():
    from services.common.engine_factory import engine_spec
    from services.common.worker_settings import WorkerSettings

    engine = EngineClient(engine_spec(WorkerSettings(role="decode", engine="sim", model="unused")))
    assert engine.kv_layout.block_size == 64


async def test_resetting_the_sim_prefix_cache_publishes_cleared(engine):
    from engines.base import EngineBusyError
    from engines.base.events import KvEventKind

    await collect(engine, EngineRequest("a", tuple(range(8)), SamplingParams(max_tokens=2), hold_kv=True))
    with pytest.raises(EngineBusyError):
        await engine.reset_prefix_cache()
    await engine.release_kv("a")
    last = (await engine.kv_snapshot()).seq
    assert await engine.reset_prefix_cache() == 2  # 8 prompt tokens: 2 full blocks of 4
    assert [e.kind for e in await engine.kv_events_since(last)] == [KvEventKind.CLEARED]
    again = await collect(engine, EngineRequest("b", tuple(range(8)), SamplingParams(max_tokens=2)))
    assert again[0].num_cached_tokens == 0
