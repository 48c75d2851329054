"""Load generation: Poisson arrivals, specs, deterministic prompts, and the closed/open-loop driver."""

import asyncio
import json
import time

import numpy as np
import pytest

from tandem.bench.loadgen import (
    FALLBACK_TOKEN_IDS,
    PromptMaker,
    RequestSpec,
    allowed_token_ids,
    poisson_arrivals,
    run_schedule,
    synthetic_specs,
    trace_specs,
)
from tandem.bench.serve_stats import RequestRecord
from tandem.bench.traces import TraceRow


def test_poisson_arrivals_start_at_zero_grow_and_match_the_rate():
    arrivals = poisson_arrivals(20_000, rate=50.0, seed=3)
    assert arrivals[0] == 0.0 and np.all(np.diff(arrivals) >= 0)
    assert 20_000 / arrivals[-1] == pytest.approx(50.0, rel=0.03)
    assert np.array_equal(arrivals, poisson_arrivals(20_000, rate=50.0, seed=3))
    assert np.array_equal(poisson_arrivals(4, float("inf")), np.zeros(4))
    with pytest.raises(ValueError):
        poisson_arrivals(4, 0.0)


def test_synthetic_specs_closed_and_open_loop():
    closed = synthetic_specs(3, isl=8, osl=4)
    assert closed == [RequestSpec(i, None, 8, 4) for i in range(3)]
    open_loop = synthetic_specs(3, isl=8, osl=4, request_rate=10.0)
    assert [s.arrival_s for s in open_loop] == pytest.approx(list(poisson_arrivals(3, 10.0)))
    with pytest.raises(ValueError):
        synthetic_specs(0, 8, 4)


def test_trace_specs_carry_arrivals_lengths_and_hashes():
    specs = trace_specs([TraceRow(0.5, 10, 2, (0, 7))])
    assert specs == [RequestSpec(0, 0.5, 10, 2, (0, 7))]


def test_prompts_are_exact_length_deterministic_and_distinct():
    maker = PromptMaker(np.arange(10, 20), seed=1)
    a, b = maker.prompt(RequestSpec(0, None, 64, 1)), maker.prompt(RequestSpec(1, None, 64, 1))
    assert len(a) == 64 and all(10 <= t < 20 for t in a)
    assert a == maker.prompt(RequestSpec(0, None, 64, 1)) and a != b
    assert a != PromptMaker(np.arange(10, 20), seed=2).prompt(RequestSpec(0, None, 64, 1))


def test_mooncake_prompts_share_the_blocks_of_shared_hash_ids():
    maker = PromptMaker(np.arange(100, 1000), seed=0, block_size=4)
    first = maker.prompt(RequestSpec(0, 0.0, 10, 1, (0, 1, 2)))
    second = maker.prompt(RequestSpec(1, 0.0, 7, 1, (0, 1)))
    other = maker.prompt(RequestSpec(2, 0.0, 8, 1, (0, 9)))
    assert (len(first), len(second)) == (10, 7)
    assert first[:7] == second  # same hash ids, same tokens
    assert other[:4] == first[:4] and other[4:8] != first[4:8]


def test_allowed_ids_leave_out_special_tokens(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"vocab_size": 8, "bos_token_id": 1, "eos_token_id": [2, 5]}))
    assert allowed_token_ids(tmp_path).tolist() == [0, 3, 4, 6, 7]
    assert allowed_token_ids(None).tolist() == list(range(*FALLBACK_TOKEN_IDS))


class FakeSender:
    """Records when each spec was sent and how many were in flight; takes `delay_s` per request."""

    def __init__(self, delay_s: float = 0.01, fail_index: int | None = None):
        self.delay_s, self.fail_index = delay_s, fail_index
        self.sent: dict[int, float] = {}
        self.in_flight = self.max_in_flight = 0

    async def send(self, spec: RequestSpec) -> RequestRecord:
        self.sent[spec.index] = time.perf_counter()
        self.in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        await asyncio.sleep(self.delay_s)
        self.in_flight -= 1
        if spec.index == self.fail_index:
            raise RuntimeError("sender bug")
        now = time.perf_counter()
        return RequestRecord(submit_s=self.sent[spec.index], chunk_times_s=[now], end_s=now, num_output_tokens=1)


async def test_closed_loop_keeps_exactly_n_in_flight_and_returns_records_in_order():
    sender = FakeSender()
    records = await run_schedule(synthetic_specs(12, 4, 1), sender.send, max_concurrency=3)
    assert sender.max_in_flight == 3 and len(sender.sent) == 12
    assert [r.submit_s for r in records] == [sender.sent[i] for i in range(12)]
    with pytest.raises(ValueError, match="max_concurrency"):
        await run_schedule(synthetic_specs(2, 4, 1), sender.send)


async def test_open_loop_sends_at_the_arrival_times():
    sender = FakeSender(delay_s=0.4)  # longer than the gaps: requests overlap, nothing waits for a slot
    specs = [RequestSpec(i, t, 4, 1) for i, t in enumerate([0.0, 0.1, 0.2])]
    start = time.perf_counter()
    await run_schedule(specs, sender.send)
    offsets = [sender.sent[i] - start for i in range(3)]
    assert offsets == pytest.approx([0.0, 0.1, 0.2], abs=0.05)
    assert sender.max_in_flight == 3


async def test_a_sender_exception_becomes_an_error_record():
    records = await run_schedule(synthetic_specs(3, 4, 1), FakeSender(fail_index=1).send, max_concurrency=2)
    assert [r.error for r in records] == [None, "RuntimeError: sender bug", None]
