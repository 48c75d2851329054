"""llm-d's precise-prefix benchmark at a tiny size: a pod is the base profile scaled as stated, every QPS stage
gets its figures for each policy, kv reuses the tenants' contexts more than random, and the JSON and PNG are
written beside llm-d's published figures."""

import json

import numpy as np
import pytest

from bench import llmd_precise_prefix as llmd
from engines.timing.profile import load_profile
from tandem.bench.trace_gen import PrefixShape


def test_a_pod_is_the_base_profile_with_its_compute_scaled_and_llm_ds_kv():
    base = load_profile("h100-llama3.1-8b")
    pod = llmd.pod_profile(base, 2.0, llmd.LLMD_KV_TOKENS_PER_POD)
    assert pod.kv_capacity_tokens == pytest.approx(307_328, abs=base.block_size)
    assert pod.prefill_s(4096) == pytest.approx(2.0 * base.prefill_s(4096))
    # the weights pass doubles, the KV-reading part of a decode step does not
    assert pod.decode_s(0.0) == pytest.approx(2.0 * base.decode_s(0.0))
    assert pod.decode_s(0.5) - pod.decode_s(0.0) == pytest.approx(base.decode_s(0.5) - base.decode_s(0.0))
    calibrated = llmd.pod_profile(base, 2.0, llmd.LLMD_KV_TOKENS_PER_POD, kv_read_factor=0.5)
    assert calibrated.decode_s(0.5) - calibrated.decode_s(0.0) == pytest.approx(
        0.5 * (base.decode_s(0.5) - base.decode_s(0.0))
    )
    share = PrefixShape().resident_tokens() / (8 * pod.kv_capacity_tokens)
    assert 0.73 < share < 0.75  # llm-d: 150 x 12,000 tokens = 73.2% of 8 x 307,328; our context is 6,144


def test_a_tiny_replay_reports_every_stage_and_policy_beside_llmds_figures(tmp_path, capsys):
    out = tmp_path / "llmd.json"
    assert (
        llmd.main(
            [
                "--qps",
                "2,6",
                "--stage-s",
                "6",
                "--tenants",
                "6",
                "--workers",
                "4",
                "--output-tokens",
                "16",
                "--json",
                str(out),
            ]
        )
        == 0
    )
    printed = capsys.readouterr().out
    assert "pod model" in printed and "kv/random" in printed
    doc = json.loads(out.read_text())
    assert set(doc["results"]) == {"kv", "kv-approx", "least_loaded", "random"}
    for res in doc["results"].values():
        assert [s["qps"] for s in res["stages"]] == [2.0, 6.0] and all(s["output_tok_s"] > 0 for s in res["stages"])
    kv, rnd = doc["results"]["kv"]["overall"], doc["results"]["random"]["overall"]
    assert doc["results"]["kv"]["ladder"]["output_tok_s"] > 0 and doc["results"]["kv"]["stages"][1]["window_tok_s"] > 0
    assert kv["prefix_hit_rate"] > rnd["prefix_hit_rate"]  # kv sends a tenant's requests where its context is
    assert doc["ratios"]["llmd"]["tok_s_ratio"] == 8730 / 4428.7 and "tandem" in doc["ratios"]
    assert doc["llmd_published"]["stages"]["precise"]["60"] == [10496.9, 0.5]
    assert out.with_suffix(".png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_llm_ds_summary_is_the_mean_of_its_stages_and_the_replay_summarises_alike():
    for name in ("precise", "approximate", "random"):  # the published per-stage figures, as typed in
        mean = sum(tok for tok, _ in llmd.LLMD_STAGES[name].values()) / len(llmd.LLMD_STAGES[name])
        assert mean == pytest.approx(llmd.LLMD[name]["output_tok_s"], abs=0.1)


def test_tokens_produced_in_a_window_spread_evenly_from_first_token_to_finish():
    first, finish = np.array([0.0, 5.0, 2.0, 1.0]), np.array([10.0, 15.0, 2.0, -1.0])  # the last never finished
    tokens = np.array([100.0, 50.0, 7.0, 9.0])
    assert llmd._produced(first, finish, tokens, 0.0, 10.0) == pytest.approx(100 + 25 + 7)
    assert llmd._produced(first, finish, tokens, 10.0, 20.0) == pytest.approx(25)
