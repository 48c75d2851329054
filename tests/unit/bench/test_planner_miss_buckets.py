"""bench/planner/miss_buckets.py: each missed request gets one cause, read against the engines' truth."""

from bench.planner import miss_buckets
from services.planner.perf_model import PerfModel, Slo
from tests.unit.services.planner.helpers import round_profile

TRUTH = PerfModel(round_profile(), Slo(0.5, 0.05))  # prefill: 100 ms per 1,000 tokens


def row(ttft=0.1, itl=0.02, prompt=1000, cached=0, prefill="prefill-000"):
    return {"ttft_s": ttft, "itl_s": itl, "prompt": prompt, "cached": cached, "prefill_worker": prefill}


def test_each_miss_gets_one_cause_and_a_request_within_both_slos_none():
    assert miss_buckets.cause(row(), TRUTH) is None
    assert miss_buckets.cause(row(ttft=0.9, prompt=6000), TRUTH) == "infeasible"  # 600 ms alone
    assert miss_buckets.cause(row(ttft=0.9, prompt=6000, cached=2000), TRUTH) == "ttft_prefill"  # 400 ms uncached
    assert miss_buckets.cause(row(ttft=0.9, prefill=""), TRUTH) == "ttft_decode"
    assert miss_buckets.cause(row(itl=0.06), TRUTH) == "itl"
    assert miss_buckets.cause(row(ttft=0.9, itl=0.06), TRUTH) == "ttft_prefill"  # the first token decides first


def test_buckets_count_misses_by_arrival_beside_the_fleet_wanted_then():
    fields = ["arrival_s", "ttft_s", "itl_s", "prompt", "cached", "prefill_worker", "decode_worker"]
    rows = [
        [1.0, 0.1, 0.02, 1000, 0, "prefill-000", "decode-000"],
        [61.0, 0.9, 0.02, 1000, 0, "prefill-000", "decode-001"],  # decode-001 began at 30 s: cold
        [62.0, 0.1, 0.09, 1000, 0, "prefill-000", "decode-000"],
    ]
    run = {
        "requests": {"fields": fields, "rows": rows, "worker_added_s": {"decode-001": 30.0}},
        "timeline": [{"t_s": 0.0, "replicas": {"prefill": 1, "decode": 1}}, {"t_s": 60.0, "replicas": {"decode": 2}}],
    }
    table = miss_buckets.buckets(run, TRUTH, 60.0, 60.0)
    assert [(b["start_s"], b["num_requests"], b["fleet"]) for b in table] == [(0.0, 1, (1, 1)), (60.0, 2, (0, 2))]
    assert (table[1]["ttft_prefill"], table[1]["itl"], table[1]["num_cold"]) == (1, 1, 1)
    assert miss_buckets.totals(table)["num_missed"] == 2
