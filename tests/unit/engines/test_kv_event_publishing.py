"""The native engine publishes its block manager's changes as numbered KV events (engines/base/events.py)."""

import asyncio

import pytest

from engines.base import EngineRequest, chain_block_hashes
from engines.base.events import KvEvent, KvEventKind, KvTier
from tests.unit.engines.helpers import collect, greedy, started

PROMPT = tuple(range(1, 41))  # 2 full blocks of 16 and 8 tokens more


def test_native_engine_publishes_stored_events_for_a_small_prompt(tiny_llama):
    async def go():
        engine = await started(tiny_llama, num_blocks=64)
        try:
            assert engine.capabilities.kv_events
            assert await engine.kv_events_since(0) == []
            waiter = asyncio.create_task(engine.wait_kv_events(0))
            await collect(engine, EngineRequest("a", PROMPT, greedy(1)))
            await asyncio.wait_for(waiter, 5)
            first = await engine.kv_events_since(0)
            # a sibling sharing both blocks adds only its third block, chained on the second
            await collect(engine, EngineRequest("b", PROMPT[:32] + tuple(range(100, 116)), greedy(1)))
            await asyncio.wait_for(engine.wait_kv_events(1), 5)
            return first, await engine.kv_events_since(1), await engine.kv_snapshot()
        finally:
            await engine.shutdown()

    first, second, snapshot = asyncio.run(go())
    h0, h1 = chain_block_hashes(PROMPT, 16)
    (h2,) = chain_block_hashes(PROMPT[:32] + tuple(range(100, 116)), 16)[2:]
    assert first == [KvEvent(1, KvEventKind.STORED, 0, (h0, h1), KvTier.DEVICE)]
    assert second == [KvEvent(2, KvEventKind.STORED, h1, (h2,), KvTier.DEVICE)]
    assert snapshot.seq == 2
    assert snapshot.events == (KvEvent(2, KvEventKind.STORED, 0, (h0, h1, h2), KvTier.DEVICE),)


def test_evicting_a_cached_block_publishes_removed(tiny_llama):
    async def go():
        engine = await started(tiny_llama, num_blocks=4)  # room for one 3-block prompt at a time
        try:
            await collect(engine, EngineRequest("a", PROMPT, greedy(1)))
            await collect(engine, EngineRequest("b", tuple(range(200, 240)), greedy(1)))
            await asyncio.wait_for(engine.wait_kv_events(2), 5)
            return await engine.kv_events_since(0)
        finally:
            await engine.shutdown()

    events = asyncio.run(go())
    h0, h1 = chain_block_hashes(PROMPT, 16)
    g0, g1 = chain_block_hashes(tuple(range(200, 240)), 16)
    assert [e.kind for e in events] == [KvEventKind.STORED, KvEventKind.REMOVED, KvEventKind.STORED]
    assert events[0].block_hashes == (h0, h1)
    assert set(events[1].block_hashes) <= {h0, h1} and events[1].block_hashes
    assert (events[2].parent_hash, events[2].block_hashes) == (0, (g0, g1))


@pytest.mark.parametrize("after_seq", [0, 5])
def test_a_fresh_zero_engine_has_an_empty_log(tmp_path, after_seq):
    from engines.core.client import EngineClient
    from engines.zero import zero_spec

    engine = EngineClient(zero_spec(str(tmp_path)))
    assert engine.capabilities.kv_events
    assert asyncio.run(engine.kv_events_since(after_seq)) == ([] if after_seq == 0 else None)
    assert asyncio.run(engine.kv_snapshot()).events == ()


def test_resetting_the_prefix_cache_publishes_cleared_and_forgets_every_prefix(tiny_llama):
    from engines.base import EngineBusyError

    async def go():
        engine = await started(tiny_llama, num_blocks=64)
        try:
            await collect(engine, EngineRequest("a", PROMPT, greedy(1)))
            await asyncio.wait_for(engine.wait_kv_events(0), 5)
            # busy: a held request keeps its blocks, so the reset is refused and nothing is published
            await collect(engine, EngineRequest("held", PROMPT, greedy(4), hold_kv=True))
            with pytest.raises(EngineBusyError):
                await engine.reset_prefix_cache()
            await engine.release_kv("held")
            assert await engine.reset_prefix_cache() == 2  # the prompt's two full blocks
            await asyncio.wait_for(engine.wait_kv_events(1), 5)
            events = await engine.kv_events_since(1)
            again = await collect(engine, EngineRequest("b", PROMPT, greedy(1)))
            await asyncio.wait_for(engine.wait_kv_events(events[-1].seq), 5)
            return events, again, await engine.kv_snapshot()
        finally:
            await engine.shutdown()

    events, again, snapshot = asyncio.run(go())
    assert [e.kind for e in events] == [KvEventKind.CLEARED]
    assert again[1].num_cached_tokens == 0  # nothing cached any more: computed afresh, and stored again
    h0, h1 = chain_block_hashes(PROMPT, 16)
    assert snapshot.events == (KvEvent(snapshot.seq, KvEventKind.STORED, 0, (h0, h1), KvTier.DEVICE),)
