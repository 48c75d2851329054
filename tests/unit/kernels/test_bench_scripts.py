"""bench/gpu_engine.py's CPU dry run (what CI runs), its ceilings and targets by hand, and
bench/quant_quality.py on the tiny model."""

import json

import pytest
import torch

from bench import gpu_ceilings, gpu_engine, quant_quality


def test_gpu_engine_dry_run_writes_every_section(tmp_path, capsys):
    out = tmp_path / "gpu.json"
    assert gpu_engine.main(["--dry-run", "--json", str(out)]) == 0
    data = json.loads(out.read_text())
    assert data["checks"] and all(c["ok"] for c in data["checks"])
    sections = {r["section"] for r in data["rows"]}
    assert sections == {"paged decode kernel", "prefill attention kernel", "decode batch 1", "prefill", "offline"}
    assert len([r for r in data["rows"] if r["section"] == "decode batch 1"]) == 6  # 3 weights x 2 KV dtypes
    assert all(r["value"] > 0 and 0 < r["fraction"] for r in data["rows"])
    assert {(r["layer"], r["m"]) for r in data["linears"]} == {
        (n, m) for n in ("qkv_proj", "down_proj") for m in (1, 32)
    }
    assert len(data["targets"]) == 8 and all(t["measured"] is not None for t in data["targets"])
    printed = capsys.readouterr().out
    assert "| paged_decode float32 |" in printed and "| nvfp4 never slower |" in printed


def test_ceilings_count_attention_and_charge_lm_head_to_sampled_rows():
    flops = gpu_ceilings.ModelFlops(body_params=100, head_params=1000, num_layers=2, num_heads=4, head_dim=8)
    assert gpu_ceilings.causal_pairs(0, 4) == 1 + 2 + 3 + 4
    assert gpu_ceilings.causal_pairs(10, 2) == 11 + 12
    # 4 tokens: 2*100*4 linear + 2*1000 lm_head once + 4 FLOPs x 10 pairs x 4 heads x 8 dims x 2 layers
    assert gpu_ceilings.prefill_ceiling(flops, 4, 1.0) == pytest.approx(4 / (800 + 2000 + 2560))
    # 3 in, 2 out: passes over 4 tokens, 2 of them sample; pairs 6 for the prompt + 4 for the one decode
    expected = 2 / ((2 * 100 * 4 + 2 * 1000 * 2) / 2.0 + 4 * 10 * 4 * 8 * 2 / 1.0)
    assert gpu_ceilings.offline_ceiling(flops, 3, 2, 2.0, 1.0) == pytest.approx(expected)


def test_targets_read_their_rows():
    def row(section, config, value, fraction=None):
        return {"section": section, "config": config, "value": value, "fraction": fraction}

    rows = [
        row("decode batch 1", "weights=bfloat16 kv=bfloat16", 100.0, 0.81),
        row("decode batch 1", "weights=fp8 kv=bfloat16", 150.0),
        row("decode batch 1", "weights=nvfp4 kv=bfloat16", 260.0),
        row("paged decode kernel", "1 x 8192", 2.1e12),
        row("prefill", "8192 tokens bfloat16", 1.0, 0.7),
    ]
    got = {
        t["target"]: t["met"]
        for t in gpu_ceilings.targets(
            rows, "bfloat16", ("1 x 8192", "128 x 1024"), 8192, (("512 x 128/128 weights=fp8 kv=fp8", 14000.0),)
        )
    }
    assert got == {
        "decode batch 1 bfloat16: fraction of the copy ceiling": True,
        "decode batch 1 fp8 weights / bfloat16": False,
        "decode batch 1 nvfp4 weights / bfloat16": True,
        "paged decode kernel 1 x 8192: bytes/s": True,
        "paged decode kernel 128 x 1024: bytes/s": None,
        "offline 512 x 128/128 weights=fp8 kv=fp8: output tok/s": None,
        "prefill 8192 tokens: fraction of the ceiling": False,
    }


def test_quant_quality_on_tiny_model(tiny_llama, tmp_path):
    out = tmp_path / "q.json"
    assert quant_quality.main(["--model", str(tiny_llama), "--num-prompts", "2", "--json", str(out)]) == 0
    results = {r["variant"]: r for r in json.loads(out.read_text())["results"]}
    assert set(results) == {"reference", "fp8-weights", "fp8-kv", "fp8-kv-calibrated", "nvfp4-weights"}
    assert results["reference"]["top1_agreement"] == 1.0 and results["reference"]["mean_kl"] == 0.0
    for name in ("fp8-weights", "fp8-kv", "fp8-kv-calibrated", "nvfp4-weights"):
        assert results[name]["mean_kl"] > 0 and 0 <= results[name]["top1_agreement"] <= 1
    assert results["nvfp4-weights"]["mean_kl"] > results["fp8-weights"]["mean_kl"]  # 4 bits lose more than 8


def test_kl_and_agreement_by_hand():
    ref = [torch.tensor([[2.0, 0.0], [0.0, 1.0]])]
    ours = [torch.tensor([[0.0, 2.0], [0.0, 1.0]])]
    q = quant_quality.compare(ref, ours, "x", 0.0)
    p = torch.tensor([2.0, 0.0]).softmax(0)
    expected = (p * (p.log() - torch.tensor([0.0, 2.0]).log_softmax(0))).sum().item() / 2
    assert q.top1_agreement == 0.5 and q.mean_kl == pytest.approx(expected)


def test_gpu_engine_offline_through_the_engine_loop_keeps_its_targets(tmp_path):
    out = tmp_path / "overlap.json"
    assert gpu_engine.main(["--dry-run", "--sections", "offline", "--overlap", "both", "--json", str(out)]) == 0
    data = json.loads(out.read_text())
    configs = {r["config"] for r in data["rows"]}
    assert configs == {
        f"{n} x {i}/{o} weights={w}{loop}"
        for n, i, o in gpu_engine.DRY_PLAN.offline
        for w in ("float32 kv=float32", "fp8 kv=fp8")
        for loop in (" loop overlap=off", " loop overlap=on")
    }
    offline = [t for t in data["targets"] if t["target"].startswith("offline")]
    assert len(offline) == 2 and all("overlap=on" in t["target"] and t["measured"] > 0 for t in offline)
