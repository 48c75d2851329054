"""bench/gpu_engine.py's CPU dry run (what CI runs) and bench/quant_quality.py on the tiny model."""
import json

import pytest
import torch

from bench import gpu_engine, quant_quality


def test_gpu_engine_dry_run_writes_every_section(tmp_path, capsys):
    out = tmp_path / "gpu.json"
    assert gpu_engine.main(["--dry-run", "--json", str(out)]) == 0
    data = json.loads(out.read_text())
    assert data["checks"] and all(c["ok"] for c in data["checks"])
    sections = {r["section"] for r in data["rows"]}
    assert sections == {"decode batch 1", "prefill", "offline"}
    assert len([r for r in data["rows"] if r["section"] == "decode batch 1"]) == 6  # 3 weights x 2 KV dtypes
    assert all(r["value"] > 0 and 0 < r["fraction"] for r in data["rows"])
    assert "| paged_decode float32 |" in capsys.readouterr().out


def test_quant_quality_on_tiny_model(tiny_llama, tmp_path):
    out = tmp_path / "q.json"
    assert quant_quality.main(["--model", str(tiny_llama), "--num-prompts", "2", "--json", str(out)]) == 0
    results = {r["variant"]: r for r in json.loads(out.read_text())["results"]}
    assert set(results) == {"reference", "fp8-weights", "fp8-kv", "nvfp4-weights"}
    assert results["reference"]["top1_agreement"] == 1.0 and results["reference"]["mean_kl"] == 0.0
    for name in ("fp8-weights", "fp8-kv", "nvfp4-weights"):
        assert results[name]["mean_kl"] > 0 and 0 <= results[name]["top1_agreement"] <= 1
    assert results["nvfp4-weights"]["mean_kl"] > results["fp8-weights"]["mean_kl"]  # 4 bits lose more than 8


def test_kl_and_agreement_by_hand():
    ref = [torch.tensor([[2.0, 0.0], [0.0, 1.0]])]
    ours = [torch.tensor([[0.0, 2.0], [0.0, 1.0]])]
    q = quant_quality.compare(ref, ours, "x", 0.0)
    p = torch.tensor([2.0, 0.0]).softmax(0)
    expected = (p * (p.log() - torch.tensor([0.0, 2.0]).log_softmax(0))).sum().item() / 2
    assert q.top1_agreement == 0.5 and q.mean_kl == pytest.approx(expected)
