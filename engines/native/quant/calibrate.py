"""Calibration for static FP8 scales: run a checkpoint over sample prompts (plain PyTorch, any device)
and record each layer's K and V amax as the KV cache would store them (after RoPE), and the input
amax of every linear layer that FP8 quantizes. A scale maps the amax onto E4M3's largest value (448).

The result goes into the checkpoint's tandem_quant.json (kv_cache_scales, input_scales), keeping
its weight format; `tandem model quantize` carries the scales into a quantized copy.
"""

from pathlib import Path

import torch

from engines.base.block_hash import num_blocks_for
from engines.base.engine_configs import CacheConfig
from engines.native.quant.formats import FP8_MAX
from engines.native.quant.swap import QUANTIZED_MODULES, QuantConfig, read_quant_config, write_quant_config


class _KvRecorder:
    """Stands in for one layer's attention backend: rotates q and k (as the backend would), records
    their amax, then hands the rotated values on."""

    def __init__(self, inner, amax: list[torch.Tensor]):
        self.inner, self.amax, self.ops = inner, amax, inner.ops

    def forward(self, q, k, v, k_cache, v_cache, meta, scale, positions=None, rotary=None):
        if rotary is not None:
            q, k = rotary(positions, q, k)
        for i, x in enumerate((k, v)):
            self.amax[i] = torch.maximum(self.amax[i], x.detach().float().abs().amax().cpu())
        return self.inner.forward(q, k, v, k_cache, v_cache, meta, scale)


def calibrate(
    model_dir: str | Path, prompts: list[list[int]], device: str = "cpu", dtype: str = "float32"
) -> QuantConfig:
    """Scales measured over `prompts` (token ids each); the checkpoint's weight format is kept."""
    from engines.base.engine_configs import BatchConfig
    from engines.native.config import EngineConfig
    from engines.native.runner import build_core, prompt_logits

    if not prompts:
        raise ValueError("calibration needs at least one prompt")
    longest = max(len(p) for p in prompts)
    core = build_core(
        EngineConfig(
            model=str(model_dir),
            device=device,
            dtype=dtype,
            attention_backend="torch",
            cuda_graphs=False,
            batch=BatchConfig(max_num_batched_tokens=longest, max_model_len=longest + 1, enable_prefix_caching=False),
            cache=CacheConfig(num_blocks=num_blocks_for(longest, 16) + 2),
        )
    )
    model = core.runner.model
    kv_amax = [[torch.zeros(()), torch.zeros(())] for _ in model.attention_layers]
    for attn, amax in zip(model.attention_layers, kv_amax):
        attn.backend = _KvRecorder(attn.backend, amax)
    input_amax: dict[str, torch.Tensor] = {}
    hooks = [
        module.register_forward_pre_hook(_input_recorder(name, input_amax))
        for name, module in model.named_modules()
        if name.rsplit(".", 1)[-1] in QUANTIZED_MODULES
    ]
    try:
        for ids in prompts:
            prompt_logits(core, ids)
    finally:
        for hook in hooks:
            hook.remove()
    previous = read_quant_config(model_dir)
    return QuantConfig(
        previous.format if previous else None,
        tuple(_scale(a) for pair in kv_amax for a in pair),
        {name: _scale(a) for name, a in input_amax.items()},
    )


def calibrate_checkpoint(
    model_dir: str | Path, prompts: list[list[int]], device: str = "cpu", dtype: str = "float32"
) -> Path:
    """calibrate(), written into the checkpoint's tandem_quant.json; returns that file."""
    return write_quant_config(model_dir, calibrate(model_dir, prompts, device, dtype))


def _input_recorder(name: str, amax: dict[str, torch.Tensor]):
    def record(module, args) -> None:
        x = args[0].detach().float().abs().amax().cpu()
        amax[name] = torch.maximum(amax[name], x) if name in amax else x

    return record


def _scale(amax: torch.Tensor) -> float:
    # NOTE: a tensor that was all zeros still gets a positive scale (a scale must be > 0)
    return max(float(amax) / FP8_MAX, 1e-12)
