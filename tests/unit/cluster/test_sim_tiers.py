"""The cluster simulator's KV tiers: conversations whose histories outgrow a small device pool are served from a
host tier (and from disk under a small host tier), hit rates by tier add up, loads take bytes / bandwidth of
virtual time, runs stay deterministic, and the CLI reports it all."""

import json

import pytest

from engines.timing.profile import TimingProfile, load_profile
from tandem.bench.traces import TraceRow
from tandem.cli import main
from tandem.cluster.des import ClusterSim, SimConfig
from tandem.cluster.metrics import Slo, summarize

PROFILE = TimingProfile.from_dict({**load_profile().to_dict(), "num_blocks": 160})  # 10k tokens per worker
BLOCK_BYTES = PROFILE.kv_bytes_per_token * PROFILE.block_size  # 8 MiB


def conversations(num_convs: int = 6, num_turns: int = 8) -> list[TraceRow]:
    """Turn t of conversation c resends its history (one 512-token block more per turn), round-robin over
    conversations: together they outgrow the device pool, each alone never does."""
    rows = []
    for turn in range(num_turns):
        for conv in range(num_convs):
            ids = tuple(1000 * (conv + 1) + t for t in range(turn + 2))
            rows.append(TraceRow(2.0 * len(rows), 512 * len(ids) - 64, 4, ids))
    return rows


def run(host_gb: float = 0.0, disk_gb: float = 0.0) -> dict:
    sim = ClusterSim(PROFILE, SimConfig(1, kv_host_gb=host_gb, kv_disk_gb=disk_gb), "kv")
    return summarize(sim, sim.run(conversations()), Slo(), 0.0)


def test_a_host_tier_serves_what_the_device_pool_evicted():
    plain, tiered = run(), run(host_gb=4.0)
    assert plain["prefix_hit_rate_by_tier"]["host"] == 0.0 and plain["kv_bytes_onboarded"] == 0
    assert tiered["prefix_hit_rate_by_tier"]["host"] > 0.4
    assert tiered["prefix_hit_rate"] > plain["prefix_hit_rate"] + 0.3
    assert tiered["ttft_mean_s"] < 0.8 * plain["ttft_mean_s"]
    assert tiered["kv_bytes_onboarded"] == tiered["kv_bytes_onboarded_by_tier"]["host"] > 0
    assert tiered["kv_bytes_onboarded"] % BLOCK_BYTES == 0


def test_hit_rates_by_tier_add_up_to_the_engines_hit_rate():
    result = run(host_gb=0.5, disk_gb=8.0)
    by_tier = result["prefix_hit_rate_by_tier"]
    assert by_tier["disk"] > 0.1 and by_tier["host"] > 0  # a 64-block host tier: the rest comes from disk
    assert sum(by_tier.values()) == pytest.approx(result["prefix_hit_rate"], abs=0.02)
    assert result["kv_bytes_onboarded_by_tier"]["disk"] > 0


def test_tiered_runs_are_deterministic():
    a, b = run(host_gb=0.5, disk_gb=8.0), run(host_gb=0.5, disk_gb=8.0)
    assert a["ttft_values_s"] == b["ttft_values_s"] and a["prefix_hit_rate_by_tier"] == b["prefix_hit_rate_by_tier"]


def test_a_load_takes_its_bytes_over_the_tier_bandwidth_in_virtual_time():
    slow = TimingProfile.from_dict({**PROFILE.to_dict(), "kv_host_gb_per_s": 0.5})  # a 8 MiB block: 17 ms
    sim = ClusterSim(slow, SimConfig(1, kv_host_gb=4.0), "kv")
    fast = ClusterSim(PROFILE, SimConfig(1, kv_host_gb=4.0), "kv")
    rows = conversations()
    slow_result = summarize(sim, sim.run(rows), Slo(), 0.0)
    fast_result = summarize(fast, fast.run(rows), Slo(), 0.0)
    # the cost check weighs 17 ms per block against ~1.3 ms to recompute it: the slow tier is not used
    assert slow_result["prefix_hit_rate_by_tier"]["host"] == 0.0
    assert fast_result["prefix_hit_rate_by_tier"]["host"] > 0.4


def test_the_cli_reports_tiers(tmp_path):
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
            for r in conversations()
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
                "1",
                "--policies",
                "kv",
                "--set",
                "num_blocks=160",
                "--kv-host-gb",
                "4",
                "--json",
                str(out),
            ]
        )
        == 0
    )
    report = json.loads(out.read_text())
    entry = report["policies"]["kv"]
    assert report["kv_host_gb"] == 4.0 and entry["prefix_hit_rate_by_tier"]["host"] > 0.4
    assert entry["kv_bytes_onboarded"] > 0
    with pytest.raises(SystemExit, match="needs a host tier"):
        main(["sim", "--trace", str(trace), "--kv-disk-gb", "1"])
