"""The KV tier benchmarks' code on CPU: the GPU script's copy section in a dry run (tiny shapes, blocks really move
through the runner's tiers and back), and the live script's pool sizing."""
import json

from bench import kv_tiers_gpu, kv_tiers_live
from tandem.bench.multiturn import Multiturn


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
