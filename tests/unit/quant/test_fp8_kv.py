"""FP8 (E4M3) KV cache: per-layer scales travel with exports, an import with other scales is
requantized, and an engine with kv_cache_dtype="fp8" stays close to the float cache."""

import dataclasses
import shutil

import pytest
import torch

from engines.base import EngineRequest, KvLayoutMismatchError
from engines.base.engine_configs import CacheConfig
from engines.base.types import KvLayout
from engines.native.config import EngineConfig
from engines.native.kv_cache import KvCache, check_importable
from engines.native.quant.transform import quantize_checkpoint
from engines.native.runner import build_core, prompt_logits
from tests.unit.engines.helpers import collect, greedy, started

LAYOUT = KvLayout(num_layers=2, num_kv_heads=1, head_dim=4, dtype="float8_e4m3fn", block_size=2)
PROMPT = list(range(7, 44))


def filled(scales: tuple[float, ...]) -> KvCache:
    cache = KvCache(LAYOUT, num_blocks=4, device="cpu", scales=scales)
    values = torch.randn(cache.tensor.shape, generator=torch.Generator().manual_seed(0)) * 4
    cache.tensor.copy_((values / cache.scales.view(2, 2, 1, 1, 1, 1)).to(torch.float8_e4m3fn))
    return cache


def dequantized(cache: KvCache, block_ids: list[int]) -> torch.Tensor:
    raw = cache.tensor.view(torch.uint8)[:, :, block_ids].view(torch.float8_e4m3fn)
    return raw.float() * cache.scales.view(2, 2, 1, 1, 1, 1)


def test_export_carries_scales_and_import_requantizes():
    source = filled((0.5, 0.25, 1.0, 2.0))
    kv = source.export([1, 3], token_ids=(1, 2, 3))
    assert kv.scales == (0.5, 0.25, 1.0, 2.0) and kv.layout.dtype == "float8_e4m3fn"
    same = KvCache(LAYOUT, 4, "cpu", scales=kv.scales)
    same.import_([0, 2], kv)
    assert torch.equal(same.tensor.view(torch.uint8)[:, :, [0, 2]], source.tensor.view(torch.uint8)[:, :, [1, 3]])
    other = KvCache(LAYOUT, 4, "cpu", scales=(0.3, 0.7, 1.3, 0.9))
    other.import_([0, 2], kv)
    expected = dequantized(source, [1, 3])
    # one more E4M3 rounding: within 2^-4 relative, plus the subnormal step of the new scale
    assert ((dequantized(other, [0, 2]) - expected).abs() <= expected.abs() / 16 + 1.3 * 2.0**-9).all()
    assert not torch.equal(other.tensor.view(torch.uint8)[:, :, [0, 2]], source.tensor.view(torch.uint8)[:, :, [1, 3]])


def test_import_without_scales_is_rejected():
    kv = filled(()).export([0], token_ids=(1, 2))
    assert kv.scales == (1.0,) * 4  # no calibration: 1.0 everywhere
    with pytest.raises(KvLayoutMismatchError):
        check_importable(LAYOUT, dataclasses.replace(kv, scales=()))


def test_engine_fp8_kv_stays_close_to_float_cache(tiny_llama):
    def logits(**kw):
        return prompt_logits(
            build_core(EngineConfig(model=str(tiny_llama), **kw, cache=CacheConfig(num_blocks=16))), PROMPT
        )

    ref, ours = logits(), logits(kv_cache_dtype="fp8")
    rel = ((ours - ref).norm() / ref.norm()).item()
    assert 0 < rel < 0.05  # measured ~1e-2 on the tiny model


def test_checkpoint_kv_scales_reach_the_cache(tiny_llama, tmp_path):
    model_dir = tmp_path / "scaled"
    shutil.copytree(tiny_llama, model_dir)
    quantize_checkpoint(tiny_llama, model_dir, "fp8", kv_cache_scales=(0.5, 0.25, 2.0, 4.0))
    core = build_core(EngineConfig(model=str(model_dir), kv_cache_dtype="fp8", cache=CacheConfig(num_blocks=16)))
    assert core.runner.kv_cache.scales.flatten().tolist() == [0.5, 0.25, 2.0, 4.0]
    assert [layer.backend.k_scale for layer in core.runner.model.attention_layers] == [0.5, 2.0]


async def test_fp8_kv_disaggregated_equals_local(tiny_llama):
    source, target = await started(tiny_llama, kv_cache_dtype="fp8"), await started(tiny_llama, kv_cache_dtype="fp8")
    try:
        reference, _ = await collect(source, EngineRequest("ref", tuple(PROMPT), greedy(12)))
        first, _ = await collect(source, EngineRequest("pre", tuple(PROMPT), greedy(12), hold_kv=True))
        kv = await source.export_kv("pre")
        await source.release_kv("pre")
        rest, last = await collect(
            target, EngineRequest("dec", tuple(PROMPT), greedy(12), kv=kv, output_token_ids=tuple(first))
        )
        assert last.num_cached_tokens == kv.num_tokens
    finally:
        await source.shutdown()
        await target.shutdown()
    assert first + rest == reference
