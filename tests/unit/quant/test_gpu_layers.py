"""The FP8 / NVFP4 GPU layers, run on CPU (their Triton kernels in the interpreter, torch._scaled_mm's
CPU implementation): each GEMM path they can pick against the CPU reference layers, the fused FP8
epilogues of RMSNorm and SiLU-mul feeding _scaled_mm, and the per-shape choice itself."""

import pytest
import torch

from engines.base.engine_configs import CacheConfig
from engines.native.config import EngineConfig
from engines.native.quant import dispatch, gpu_modules, swap
from engines.native.quant.calibrate import calibrate
from engines.native.quant.swap import write_quant_config
from engines.native.quant.transform import quantize_checkpoint
from engines.native.runner import build_core, prompt_logits

PROMPT = list(range(5, 25))
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"  # the GPU layers' kernels: compiled, or interpreted


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a - b).norm() / b.norm()).item()


def test_choice_is_the_fastest_timed_once_per_key():
    dispatch.forget()
    calls = []
    timer = {"a": 3.0, "b": 1.0, "c": 2.0}

    def time_it(name, fn):
        calls.append(fn())
        return timer[name]

    candidates = {name: (lambda n=name: n) for name in timer}
    assert dispatch.choose(("k", 1), candidates, "a", time_it) == "b"
    assert dispatch.choose(("k", 1), candidates, "a", time_it) == "b" and len(calls) == 3  # remembered
    assert dispatch.known(("k", 1)) == "b" and dispatch.known(("k", 2)) is None
    assert dispatch.pick({"x": 1.0, "y": 1.0}) == "x"
    assert [dispatch.m_bucket(m) for m in (1, 2, 3, 16, 17)] == [1, 2, 4, 16, 32]
    dispatch.forget()


def test_nothing_timed_without_a_device_means_the_fallback():
    assert dispatch.choose(("cpu", 1), {"a": lambda: 0, "b": lambda: 0}, "b") == "b"
    assert dispatch.known(("cpu", 1)) is None


@pytest.fixture
def gpu_layers_on_cpu(monkeypatch):
    """swap_linears picks the GPU classes on CPU; `prefer` makes the dispatcher time one path fastest."""
    monkeypatch.setattr(
        swap,
        "_layer_class",
        lambda fmt, device: {"fp8": gpu_modules.Fp8LinearScaledMm, "nvfp4": gpu_modules.Nvfp4LinearTriton}[fmt],
    )
    dispatch.forget()

    def prefer(path: str) -> None:
        dispatch.forget()
        monkeypatch.setattr(dispatch, "_cuda_timer", lambda: lambda name, fn: 0.0 if name == path else 1.0)

    yield prefer
    dispatch.forget()


def logits(model_dir, backend: str) -> torch.Tensor:
    device = DEVICE if backend == "triton" else "cpu"  # the torch backend's layers: the CPU references
    config = EngineConfig(
        model=str(model_dir),
        device=device,
        attention_backend=backend,
        cuda_graphs=False,
        cache=CacheConfig(num_blocks=16),
    )
    return prompt_logits(build_core(config), PROMPT).cpu()


@pytest.mark.parametrize("path, bound", [(gpu_modules.SCALED_MM, 1e-4), (gpu_modules.W8A16, 0.15)])
def test_fp8_paths_track_the_reference(tiny_llama, tmp_path, gpu_layers_on_cpu, path, bound, monkeypatch):
    monkeypatch.setattr(swap, "_layer_class", lambda fmt, device: swap.Fp8Linear)
    model_dir = quantize_checkpoint(tiny_llama, tmp_path / "fp8", "fp8")
    ref = logits(model_dir, "torch")  # the CPU reference layers (W8A8, dynamic per token)
    monkeypatch.undo()
    monkeypatch.setattr(swap, "_layer_class", lambda fmt, device: gpu_modules.Fp8LinearScaledMm)
    gpu_layers_on_cpu(path)
    ours = logits(model_dir, "triton")
    # NOTE: the first call of each shape runs unfused (it is the one timed); later ones (a second
    # engine: choices last for the process) take FP8 straight from the RMSNorm / SiLU-mul epilogue
    if path == gpu_modules.SCALED_MM:
        core = build_core(
            EngineConfig(
                model=str(model_dir),
                device=DEVICE,
                attention_backend="triton",
                cuda_graphs=False,
                cache=CacheConfig(num_blocks=16),
            )
        )
        ours = prompt_logits(core, PROMPT).cpu()
        gate_up = core.runner.model.model.layers[0].mlp.gate_up_proj
        assert gate_up.input_quant(len(PROMPT)).static_scale is None  # dynamic: one scale per row
    assert rel(ours, ref) < bound


def test_fp8_with_calibrated_static_scales_tracks_the_float_model(tiny_llama, tmp_path, gpu_layers_on_cpu):
    float_ref = logits(tiny_llama, "torch")
    model_dir = quantize_checkpoint(tiny_llama, tmp_path / "fp8", "fp8")
    write_quant_config(model_dir, calibrate(model_dir, [PROMPT]))
    gpu_layers_on_cpu(gpu_modules.SCALED_MM)
    core = build_core(
        EngineConfig(
            model=str(model_dir),
            device=DEVICE,
            attention_backend="triton",
            cuda_graphs=False,
            cache=CacheConfig(num_blocks=16),
        )
    )
    qkv = core.runner.model.model.layers[0].self_attn.qkv_proj
    assert qkv.input_scale is not None and qkv.input_scale.item() > 0
    prompt_logits(core, PROMPT)  # times each shape
    assert qkv.input_quant(len(PROMPT)).static_scale is qkv.input_scale
    assert rel(prompt_logits(core, PROMPT).cpu(), float_ref) < 0.15  # as FP8 W8A8 with dynamic scales


@pytest.mark.parametrize("path", [gpu_modules.IN_REGISTERS, gpu_modules.DEQUANT_CUBLAS])
def test_nvfp4_paths_equal_the_reference(tiny_llama, tmp_path, gpu_layers_on_cpu, path, monkeypatch):
    model_dir = quantize_checkpoint(tiny_llama, tmp_path / "nvfp4", "nvfp4")
    monkeypatch.setattr(swap, "_layer_class", lambda fmt, device: swap.Nvfp4Linear)
    ref = logits(model_dir, "torch")
    monkeypatch.setattr(swap, "_layer_class", lambda fmt, device: gpu_modules.Nvfp4LinearTriton)
    gpu_layers_on_cpu(path)
    assert rel(logits(model_dir, "triton"), ref) < 1e-4  # the same fp32 math in another order
