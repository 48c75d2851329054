"""llm-d's precise-prefix benchmark at a tiny size: the cluster's KV is cut to the demanded share, every QPS stage
gets its figures for each policy, kv reuses the tenants' contexts more than random, and the JSON and PNG are
written beside llm-d's published figures."""
import json

from bench import llmd_precise_prefix as llmd
from engines.sim.profile import load_profile
from tandem.bench.trace_gen import PrefixShape


def test_the_kv_cache_is_sized_so_that_the_contexts_fill_the_demanded_share():
    shape = PrefixShape()
    profile = llmd.sized_profile(load_profile("h100-native-llama3.1-8b-bf16"), shape, 8, 0.73)
    share = shape.context_demand_tokens() / (8 * profile.kv_capacity_tokens)
    assert 0.72 < share <= 0.73


def test_a_tiny_replay_reports_every_stage_and_policy_beside_llmds_figures(tmp_path, capsys):
    out = tmp_path / "llmd.json"
    assert llmd.main(["--qps", "2,6", "--stage-s", "6", "--tenants", "6", "--workers", "4",
                      "--output-tokens", "16", "--json", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "llm-d published" in printed and "kv/random" in printed
    doc = json.loads(out.read_text())
    assert set(doc["results"]) == {"kv", "least_loaded", "random"}
    for res in doc["results"].values():
        assert [s["qps"] for s in res["stages"]] == [2.0, 6.0] and all(s["output_tok_s"] > 0 for s in res["stages"])
    kv, rnd = doc["results"]["kv"]["overall"], doc["results"]["random"]["overall"]
    assert kv["prefix_hit_rate"] > rnd["prefix_hit_rate"]  # kv sends a tenant's requests where its context is
    assert doc["ratios"]["llmd"]["tok_s_ratio"] == 8730 / 4429 and "tandem" in doc["ratios"]
    assert out.with_suffix(".png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
