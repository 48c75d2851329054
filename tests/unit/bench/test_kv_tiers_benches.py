"""The KV tier benchmarks' code on CPU: the GPU script's copy section in a dry run (tiny shapes, blocks really move
through the runner's tiers and back), the live script's pool sizing and run averages, and the simulator script's
routing reach."""

import json

from bench import kv_tiers_gpu, kv_tiers_live, kv_tiers_sim
from tandem.bench.multiturn import Multiturn
from tandem.bench.traces import TraceRow


def test_the_gpu_copy_section_moves_blocks_both_ways_in_a_dry_run(tmp_path):
    out = tmp_path / "gpu.json"
    assert kv_tiers_gpu.main(["--sections", "copy", "--dry-run", "--json", str(out)]) == 0
    copy = json.loads(out.read_text())["copy"]
    assert copy["num_blocks"] == 16 and copy["block_bytes"] == 2 * 2 * 16 * 2 * 16 * 4
    assert copy["g1_to_g2_gb_per_s"] > 0 and copy["g2_to_g1_gb_per_s"] > 0


def test_the_live_pool_is_a_third_of_the_conversations_but_holds_the_longest_request():
    issue = Multiturn(8, 4, 1000, 1000, 32)
    assert kv_tiers_live.distinct_tokens(issue) == 1000 + 8 * (1000 + 4 * 32 + 3 * 32)
    assert kv_tiers_live.pool_blocks(issue, 3) == 10792 // 16 // 3
    tiny = Multiturn(1, 4, 256, 256, 16)  # a third would not hold its one request
    assert kv_tiers_live.pool_blocks(tiny, 3) == -(-kv_tiers_live.distinct_tokens(tiny) // 16) + 2


def test_no_reuse_runs_are_averaged_per_case():
    runs = [
        {"output_tokens_per_s": 6.0, "ttft_s": {"mean": 2.0}},
        {"output_tokens_per_s": 8.0, "ttft_s": {"mean": 1.0}},
    ]
    assert kv_tiers_live.mean_summary(runs) == {"output_tokens_per_s": 7.0, "ttft_s": {"mean": 1.5}}


def test_routing_reach_counts_the_prefix_each_worker_was_sent_before():
    first, again, other = TraceRow(0.0, 1024, 1, (1, 2)), TraceRow(1.0, 1100, 1, (1, 2, 3)), TraceRow(2.0, 512, 1, (9,))
    rows = [first, again, again, other]
    # `again` on w0 hits `first`'s 1024 tokens; on w1, where nothing was sent before, nothing; sent to w1 a second
    # time, its own 17 full blocks (1,088 tokens: the last block is partial); `other` shares no prefix
    assert kv_tiers_sim.routing_reach(rows[:2], ["w0", "w0"], 64) == 1024 / (1024 + 1100)
    assert kv_tiers_sim.routing_reach(rows[:2], ["w0", "w1"], 64) == 0.0
    assert kv_tiers_sim.routing_reach(rows, ["w0", "w1", "w1", "w1"], 64) == 1088 / (1024 + 1100 + 1100 + 512)
