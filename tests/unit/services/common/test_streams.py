"""coalesced(): deltas that pile up while the consumer is busy travel as one; closing aborts."""

import asyncio

import pytest

from engines.base.types import FinishReason, RequestOutput
from services.common.streams import coalesced, merge


async def produce(n: int, closed: list):
    try:
        for i in range(n):
            done = FinishReason.LENGTH if i == n - 1 else None
            yield RequestOutput("r", (i,), finish_reason=done, num_prompt_tokens=3)
            await asyncio.sleep(0)
    finally:
        closed.append(True)


async def test_slow_consumer_gets_merged_deltas_in_order():
    closed: list = []
    messages = []
    async for out in coalesced(produce(50, closed)):
        messages.append(out)
        await asyncio.sleep(0.002)  # a busy consumer: the producer runs ahead
    tokens = [t for m in messages for t in m.new_token_ids]
    assert tokens == list(range(50))
    assert len(messages) < 50
    assert messages[-1].finish_reason is FinishReason.LENGTH
    assert all(m.finish_reason is None for m in messages[:-1])
    assert closed == [True]


async def test_closing_early_closes_the_engine_stream():
    closed: list = []

    async def endless():
        try:
            i = 0
            while True:
                yield RequestOutput("r", (i,))
                i += 1
                await asyncio.sleep(0)
        finally:
            closed.append(True)

    stream = coalesced(endless())
    first = await stream.__anext__()
    assert first.new_token_ids[0] == 0
    await stream.aclose()
    await asyncio.sleep(0)
    assert closed == [True]


async def test_engine_failure_reaches_the_consumer():
    async def failing():
        yield RequestOutput("r", (1,))
        raise RuntimeError("engine died")

    with pytest.raises(RuntimeError, match="engine died"):
        async for _ in coalesced(failing()):
            await asyncio.sleep(0.001)


def test_merge_keeps_last_status():
    merged = merge(
        [RequestOutput("r", (1, 2)), RequestOutput("r", (3,), finish_reason=FinishReason.STOP, num_cached_tokens=16)]
    )
    assert merged.new_token_ids == (1, 2, 3)
    assert merged.finish_reason is FinishReason.STOP and merged.num_cached_tokens == 16


def test_merge_keeps_the_engines_queue_time_for_the_trace():
    merged = merge(
        [RequestOutput("r", (1,), queue_s=0.25), RequestOutput("r", (2,), queue_s=0.25), RequestOutput("r", (3,))]
    )
    assert merged.queue_s == 0.25
    assert merge([RequestOutput("r", (1,)), RequestOutput("r", (2,))]).queue_s is None
