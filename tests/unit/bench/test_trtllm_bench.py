"""`bench/gpu_engine.py --engine trtllm`: the dispatch, and the measurement itself driven end to end on CPU over
the fake tensorrt_llm (the figures are the fake's; this checks the benchmark, not TensorRT-LLM)."""

import json

from bench import gpu_engine, trtllm_engine


def test_the_trtllm_mode_writes_every_section_with_its_anchors(tmp_path, capsys):
    out = tmp_path / "trt.json"
    assert gpu_engine.main(["--engine", "trtllm", "--dry-run", "--json", str(out)]) == 0
    data = json.loads(out.read_text())
    assert data["engine"] == "trtllm" and data["trtllm_version"] == "1.2.1"
    assert [(r["section"], r["config"]) for r in data["rows"]] == [
        ("decode batch 1", "16 in"),
        ("prefill", "32 tokens"),
        ("prefill", "64 tokens"),
        ("offline", "4 x 8/8"),
        ("offline", "2 x 16/16"),
    ]
    assert all(r["value"] > 0 for r in data["rows"])
    assert "| offline | 4 x 8/8 |" in capsys.readouterr().out


def test_the_gpu_plan_measures_at_the_published_shapes():
    offline = {(n_in, n_out) for _, n_in, n_out in trtllm_engine.GPU_PLAN.offline}
    assert offline <= set(trtllm_engine.ANCHORS) and trtllm_engine.ANCHORS[(128, 128)] == 28312
    r = trtllm_engine.row("offline", "x", 14156.0, "output tok/s", trtllm_engine.ANCHORS[(128, 128)])
    assert r["fraction"] == 0.5
