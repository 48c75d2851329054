"""The native runner against a fake engine with the native engine's API: requests, timing, checks."""

import pytest

from tandem.bench.native_runner import run_requests
from tests.unit.bench.conftest import FakeEngine


async def test_runner_times_every_token():
    engine = FakeEngine(chunks=(1, 3, 2))
    await engine.start()
    traces = await run_requests(engine, [[5, 6], [7, 8, 9]], osl=9, prefix="x")
    assert [r.req_id for r in engine.requests] == ["x0", "x1"]
    assert [r.prompt_token_ids for r in engine.requests] == [(5, 6), (7, 8, 9)]
    assert all(r.params.max_tokens == 9 and r.params.ignore_eos and r.params.is_greedy for r in engine.requests)
    assert [t.num_tokens for t in traces] == [9, 9]
    for t in traces:
        assert 0 < t.ttft_s and all(gap > 0 for gap in t.itls_s)


async def test_runner_rejects_a_short_request():
    engine = FakeEngine(short_by=1)
    await engine.start()
    with pytest.raises(RuntimeError, match="made 4 tokens, wanted 5"):
        await run_requests(engine, [[5]], osl=5)


async def test_runner_surfaces_engine_errors():
    engine = FakeEngine(error="boom")
    await engine.start()
    with pytest.raises(RuntimeError, match="boom"):
        await run_requests(engine, [[5]], osl=5)
