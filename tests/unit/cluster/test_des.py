"""The cluster simulator on small synthetic traces: exact counts, determinism, kv beats round-robin on
prefix reuse, and the CLI's JSON report and plots."""

import json

import pytest

from engines.timing.profile import load_profile
from tandem.bench.traces import TraceRow
from tandem.cli import main
from tandem.cluster.des import ClusterSim, SimConfig
from tandem.cluster.metrics import Slo, summarize

PROFILE = load_profile()


def conversations(num_requests: int = 50, num_convs: int = 5) -> list[TraceRow]:
    """Request i continues conversation i % num_convs: a shared system block, then the conversation's
    history (grows by one 512-token block per turn), so each turn's prefix is the last turn's prompt."""
    rows = []
    for i in range(num_requests):
        conv, turn = i % num_convs, i // num_convs
        ids = (0, *(1000 * (conv + 1) + t for t in range(turn + 2)))
        rows.append(TraceRow(0.4 * i, 512 * len(ids) - 100, 8 + i % 3, ids))
    return rows


def run(policy: str, rows: list[TraceRow], workers: int = 4) -> dict:
    sim = ClusterSim(PROFILE, SimConfig(workers), policy)
    return summarize(sim, sim.run(rows), Slo(), 0.0)


@pytest.mark.parametrize("policy", ["kv", "round_robin", "random", "least_loaded"])
def test_every_request_finishes_with_its_tokens(policy):
    rows = conversations()
    result = run(policy, rows)
    assert result["num_requests"] == result["num_finished"] == 50
    assert sum(w["num_requests"] for w in result["load_per_worker"].values()) == 50
    assert sum(w["num_generated_tokens"] for w in result["load_per_worker"].values()) == sum(r.osl for r in rows)
    assert 0 < result["ttft_p50_s"] <= result["ttft_p99_s"]


def test_round_robin_spreads_evenly_and_runs_are_deterministic():
    a, b = run("round_robin", conversations()), run("round_robin", conversations())
    assert [w["num_requests"] for w in a["load_per_worker"].values()] == [13, 13, 12, 12]
    assert a["ttft_values_s"] == b["ttft_values_s"]


def test_kv_finds_more_prefix_hits_than_round_robin():
    kv, rr = run("kv", conversations()), run("round_robin", conversations())
    assert kv["prefix_hit_rate"] > rr["prefix_hit_rate"] + 0.2
    assert kv["ttft_mean_s"] < rr["ttft_mean_s"]


def test_the_kv_policys_weights_reach_the_simulated_router(tmp_path):
    sim = ClusterSim(PROFILE, SimConfig(2, kv_overlap_weight=2.0, kv_inflight_weight=0.1), "kv")
    assert (sim.policy.config.overlap_weight, sim.policy.config.inflight_weight) == (2.0, 0.1)
    trace = tmp_path / "t.jsonl"
    trace.write_text(json.dumps({"timestamp": 0, "input_length": 600, "output_length": 4, "hash_ids": [1, 2]}) + "\n")
    with pytest.raises(SystemExit, match="--kv-inflight-weight must be >= 0"):
        main(["sim", "--trace", str(trace), "--kv-inflight-weight", "-1"])


def test_disaggregated_prefill_hands_off_to_decode():
    sim = ClusterSim(PROFILE, SimConfig(2, num_prefill_workers=1), "least_loaded")
    records = sim.run(conversations(10, 2))
    assert all(r.finish_s > r.first_token_s > r.arrival_s for r in records)
    assert {r.prefill_worker_id for r in records} == {"prefill-000"}  # every prompt is >= 512 tokens


def test_a_one_token_request_done_on_its_prefill_worker_leaves_no_decode_worker_waiting():
    """One output token comes from the prefill itself: nothing is handed off, and the decode worker it was routed
    to must still drain (it was billed until the run's end when the prefill worker kept the prompt)."""
    rows = [TraceRow(row.arrival_s, row.isl, 1, row.hash_ids) for row in conversations(6, 2)]
    sim = ClusterSim(PROFILE, SimConfig(2, num_prefill_workers=1), "least_loaded")
    records = sim.run(rows)
    assert all(r.finish_s >= r.first_token_s > r.arrival_s and r.prefill_worker_id for r in records)
    assert not sim.workers["prefill-000"].prompts
    assert all(sim.is_drained(worker_id) for worker_id in sim.workers)


def test_cli_writes_the_json_and_plots(tmp_path):
    trace = tmp_path / "t.jsonl"
    trace.write_text(
        "".join(
            json.dumps(
                {
                    "timestamp": int(r.arrival_s * 1000),
                    "input_length": r.isl,
                    "output_length": r.osl,
                    "hash_ids": list(r.hash_ids),
                }
            )
            + "\n"
            for r in conversations(20)
        )
    )
    out = tmp_path / "r.json"
    assert (
        main(
            [
                "sim",
                "--trace",
                str(trace),
                "--workers",
                "2",
                "--policies",
                "kv,round_robin",
                "--time-scale",
                "0.5",
                "--json",
                str(out),
            ]
        )
        == 0
    )
    report = json.loads(out.read_text())
    assert (report["kv_overlap_weight"], report["kv_inflight_weight"]) == (1.0, 0.1)
    assert report["time_scale"] == 0.5 and set(report["policies"]) == {"kv", "round_robin"}
    for entry in report["policies"].values():
        assert {"ttft_mean_s", "ttft_p50_s", "ttft_p99_s", "itl_p50_s", "prefix_hit_rate", "goodput_rps"} <= set(entry)
    assert (tmp_path / "r_ttft_cdf.png").stat().st_size > 0 and (tmp_path / "r_load.png").stat().st_size > 0
