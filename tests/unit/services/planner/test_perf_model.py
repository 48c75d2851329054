"""PerfModel: replicas from a profile, exact on round numbers; SLO budgets from a worker's own load."""

import pytest

from services.planner.perf_model import PerfModel, Sizing, Slo
from services.planner.types import Load, WorkerRole, WorkerSample
from tests.unit.services.planner.helpers import round_profile

PROFILE = round_profile()


def test_prefill_throughput_at_an_isl_and_in_chunks():
    model = PerfModel(PROFILE, Slo())
    assert model.prefill_tokens_per_s(1000) == pytest.approx(10_000)
    assert model.prefill_s(1500) == pytest.approx(0.15)
    # 9,000 tokens with a 4,000-token step budget: two full chunks (400 ms each) and 1,000 (100 ms)
    assert model.prefill_s(9000) == pytest.approx(0.9)


def test_decode_batch_is_the_largest_within_the_itl_target():
    model = PerfModel(PROFILE, Slo(itl_s=0.05), Sizing(itl_headroom=0.3))  # 15 ms steps
    assert model.decode_batch(1000, 0.015) == 51  # 10 + (51 - 1) / 10 = 15 ms
    assert model.decode_tokens_per_s(1000) == pytest.approx(51 / 0.015)
    assert model.decode_batch(1000, 0.005) == 1  # even one sequence is over: the model still counts one
    small = PerfModel(round_profile(max_num_seqs=8), Slo())
    assert small.decode_batch(1000, 0.05) == 8
    tight = PerfModel(round_profile(num_blocks=300), Slo())  # 3,000 tokens of KV: 3 sequences of 1,000
    assert tight.decode_batch(1000, 0.05) == 3


def test_replicas_disaggregated_and_aggregated():
    model = PerfModel(PROFILE, Slo(itl_s=0.05), Sizing(itl_headroom=0.4, prefill_max_utilization=0.5))
    # 20 ms steps at context 1,000 fit 101 sequences: 5,050 tokens/s per decode worker
    load = Load(request_rate=12.0, isl=1000.0, osl=0.0)
    assert model.replicas(load, has_prefill=True) == {WorkerRole.PREFILL: 3, WorkerRole.DECODE: 0}  # 1.2 / 0.5
    load = Load(request_rate=10.0, isl=990.0, osl=20.0)  # context 1,000
    per_worker = 101 / 0.02
    assert model.replicas(load, has_prefill=True)[WorkerRole.DECODE] == 1  # 200 / 5,050
    assert 12_000 / per_worker == pytest.approx(2.376, abs=1e-3)
    assert model.replicas(Load(600.0, 990.0, 20.0), True)[WorkerRole.DECODE] == 3
    # without prefill workers the decode pool also prefills: 10 x 99 ms + 200 / 5,050 worker-seconds per second
    assert model.replicas(load, has_prefill=False) == {WorkerRole.DECODE: 2}


def test_covers_only_the_measured_isl_range():
    model = PerfModel(PROFILE, Slo())
    assert model.covers(2000) and not model.covers(2001)
    formula = PerfModel(round_profile(prefill_ms_points=()), Slo())
    assert formula.covers(10**6)  # a formula claims no range


def test_budgets_from_a_workers_own_load():
    model = PerfModel(PROFILE, Slo(ttft_s=0.5, itl_s=0.05))
    queued = WorkerSample("p", WorkerRole.PREFILL, num_waiting=3, num_running=1)
    assert model.budget(queued, isl=1000) == pytest.approx(5 * 0.1 / 0.5)  # four ahead of the next prompt
    # 101 sequences holding half of 200,000 tokens: mean context 990 -> the 1,000-token row: 20 ms
    busy = WorkerSample("d", WorkerRole.DECODE, num_running=101, num_blocks_used=9999, num_blocks_total=20_000)
    assert model.budget(busy, isl=1000) == pytest.approx(0.02 / 0.05, rel=1e-3)
    assert model.budget(WorkerSample("d", WorkerRole.DECODE), isl=1000) == 0.0
