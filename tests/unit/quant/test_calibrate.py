"""`tandem model calibrate`: static FP8 scales measured over prompts, written into tandem_quant.json,
kept by `tandem model quantize`, and used by the FP8 KV cache."""

import shutil

import pytest
import torch

from engines.base.engine_configs import CacheConfig
from engines.native.config import EngineConfig
from engines.native.quant.calibrate import calibrate
from engines.native.quant.swap import read_quant_config
from engines.native.quant.transform import quantize_checkpoint
from engines.native.runner import build_core, prompt_logits
from tandem.cli import main

PROMPTS = [list(range(5, 30)), list(range(100, 140))]


@pytest.fixture
def model_dir(tiny_llama, tmp_path):
    out = tmp_path / "m"
    shutil.copytree(tiny_llama, out)
    return out


def layer0_by_hand(model_dir, prompt) -> dict[str, float]:
    """Layer 0's k, v and qkv_proj input amax, computed from the model's own modules, step by step."""
    core = build_core(EngineConfig(model=str(model_dir), cache=CacheConfig(num_blocks=8)))
    model = core.runner.model
    attn = model.model.layers[0].self_attn
    with torch.inference_mode():
        h = model.model.layers[0].input_layernorm(model.model.embed_tokens(torch.tensor(prompt)))
        q, k, v = attn.qkv_proj(h).split(attn.split, dim=-1)
        positions = torch.arange(len(prompt))
        _, k = attn.rotary(positions, q.view(len(prompt), -1, attn.head_dim), k.view(len(prompt), -1, attn.head_dim))
    return {"k": k.abs().max().item(), "v": v.abs().max().item(), "qkv": h.abs().max().item()}


def test_scales_are_each_amax_over_448(model_dir):
    config = calibrate(model_dir, PROMPTS)
    by_hand = [layer0_by_hand(model_dir, p) for p in PROMPTS]
    assert len(config.kv_cache_scales) == 2 * 2  # (k, v) per layer
    assert config.kv_cache_scales[0] == pytest.approx(max(h["k"] for h in by_hand) / 448, rel=1e-6)
    assert config.kv_cache_scales[1] == pytest.approx(max(h["v"] for h in by_hand) / 448, rel=1e-6)
    assert config.input_scales["model.layers.0.self_attn.qkv_proj"] == pytest.approx(
        max(h["qkv"] for h in by_hand) / 448, rel=1e-6
    )
    assert len(config.input_scales) == 4 * 2 and config.format is None


def test_cli_writes_scales_that_quantize_keeps_and_the_fp8_cache_uses(model_dir, tmp_path, capsys):
    assert main(["model", "calibrate", str(model_dir), "--num-prompts", "4"]) == 0
    assert capsys.readouterr().out.strip().splitlines()[-1] == str(model_dir / "tandem_quant.json")
    written = read_quant_config(model_dir)
    core = build_core(EngineConfig(model=str(model_dir), kv_cache_dtype="fp8", cache=CacheConfig(num_blocks=8)))
    assert core.runner.kv_cache.scales.flatten().tolist() == pytest.approx(list(written.kv_cache_scales))
    fp8 = quantize_checkpoint(model_dir, tmp_path / "fp8", "fp8")
    kept = read_quant_config(fp8)
    assert (kept.format, kept.kv_cache_scales, kept.input_scales) == (
        "fp8",
        written.kv_cache_scales,
        written.input_scales,
    )


def test_calibrated_fp8_cache_tracks_the_float_cache(model_dir):
    ref = prompt_logits(build_core(EngineConfig(model=str(model_dir), cache=CacheConfig(num_blocks=16))), PROMPTS[1])
    calibrate_and_write = main(["model", "calibrate", str(model_dir)])
    assert calibrate_and_write == 0
    fp8 = build_core(EngineConfig(model=str(model_dir), kv_cache_dtype="fp8", cache=CacheConfig(num_blocks=16)))
    ours = prompt_logits(fp8, PROMPTS[1])
    assert 0 < ((ours - ref).norm() / ref.norm()).item() < 0.05


def test_bad_calibration_input_exits_2(model_dir, tmp_path, capsys):
    assert main(["model", "calibrate", str(tmp_path / "absent")]) == 2
    assert main(["model", "calibrate", str(model_dir), "--prompts", str(tmp_path / "none.txt")]) == 2
    assert "is not a file" in capsys.readouterr().err
