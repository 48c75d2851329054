"""The offline transform plus the runtime swap on a tiny random checkpoint: the right layers are
swapped, merged shards land in place, and NVFP4 (weight-only) equals the float model run on the
dequantized weights."""

import json
import shutil

import pytest
import torch
from safetensors.torch import load_file, save_file

from engines.base.engine_configs import CacheConfig
from engines.core.engine_core import EngineCore
from engines.native.config import EngineConfig
from engines.native.quant import formats
from engines.native.quant.modules import Fp8Linear, Nvfp4Linear
from engines.native.quant.swap import QUANT_CONFIG, read_quant_config
from engines.native.quant.transform import quantize_checkpoint
from engines.native.runner import build_core, prompt_logits

PROMPT = list(range(5, 45))
# measured on the tiny random model (no trained robustness, 8 GEMMs deep): FP8 W8A8 ~10% relative
# logit error, top-1 agreement 0.875
FP8_MAX_REL = 0.15
EXACT_REL = 1e-5  # the same fp32 math in a different order


def run(model_dir) -> tuple[torch.Tensor, EngineCore]:
    core = build_core(EngineConfig(model=str(model_dir), cache=CacheConfig(num_blocks=16)))
    return prompt_logits(core, PROMPT), core


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a - b).norm() / b.norm()).item()


@pytest.fixture(scope="module")
def reference(tiny_llama):
    return run(tiny_llama)[0]


@pytest.fixture(scope="module")
def fp8_dir(tiny_llama, tmp_path_factory):
    return quantize_checkpoint(tiny_llama, tmp_path_factory.mktemp("fp8"), "fp8")


def test_nvfp4_equals_float_model_on_dequantized_weights(tiny_llama, tmp_path):
    qdir = quantize_checkpoint(tiny_llama, tmp_path / "nvfp4", "nvfp4")
    assert json.loads((qdir / QUANT_CONFIG).read_text())["format"] == "nvfp4"
    ours, core = run(qdir)
    assert len([m for m in core.runner.model.modules() if isinstance(m, Nvfp4Linear)]) == 4 * 2

    q = load_file(qdir / "model.safetensors")
    fake = {n: t for n, t in q.items() if not n.endswith((".weight_scale", ".weight_scale_2"))}
    for name in [n for n in fake if f"{n.removesuffix('.weight')}.weight_scale_2" in q]:
        stem = name.removesuffix(".weight")
        fake[name] = formats.dequantize_nvfp4(q[name], q[f"{stem}.weight_scale"], q[f"{stem}.weight_scale_2"])
    float_dir = tmp_path / "dequantized"
    shutil.copytree(tiny_llama, float_dir)
    save_file(fake, float_dir / "model.safetensors")
    expected, _ = run(float_dir)
    assert rel(ours, expected) < EXACT_REL
    assert rel(expected, run(tiny_llama)[0]) > 0.01  # and the quantization did change the weights


def test_fp8_merged_shards_dequantize_to_the_checkpoint(tiny_llama, fp8_dir):
    _, core = run(fp8_dir)
    qkv = core.runner.model.model.layers[1].self_attn.qkv_proj
    assert isinstance(qkv, Fp8Linear)
    original = load_file(tiny_llama / "model.safetensors")
    stem = "model.layers.1.self_attn"
    merged = torch.cat([original[f"{stem}.{p}_proj.weight"] for p in "qkv"])
    back = formats.dequantize_fp8_rows(qkv.weight, qkv.weight_scale)
    bound = 2.0**-4 * merged.abs() + qkv.weight_scale[:, None] * 2.0**-9
    assert ((back - merged).abs() <= bound).all()


def test_fp8_model_tracks_reference(fp8_dir, reference):
    ours, _ = run(fp8_dir)
    assert 0 < rel(ours, reference) < FP8_MAX_REL
    assert (ours.argmax(-1) == reference.argmax(-1)).float().mean().item() >= 0.75


def test_misplaced_shard_shows_in_the_logits(fp8_dir, tmp_path, reference):
    """Guards the test above: gate and up swapped in the checkpoint must push it past its bound."""
    bad = tmp_path / "bad"
    shutil.copytree(fp8_dir, bad)
    tensors = load_file(bad / "model.safetensors")
    for layer in range(2):
        for suffix in ("weight", "weight_scale"):
            gate, up = f"model.layers.{layer}.mlp.gate_proj.{suffix}", f"model.layers.{layer}.mlp.up_proj.{suffix}"
            tensors[gate], tensors[up] = tensors[up], tensors[gate]
    save_file(tensors, bad / "model.safetensors")
    assert rel(run(bad)[0], reference) > FP8_MAX_REL


def test_no_quant_config_means_no_swap(tiny_llama):
    assert read_quant_config(tiny_llama) is None
