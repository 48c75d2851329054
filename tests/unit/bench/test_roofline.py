"""FLOP accounting of the roofline on fake shapes and timings; one tiny real GEMM measurement."""

import pytest

from engines.native.config import ModelConfig
from tandem.bench.roofline import (
    GemmRate,
    GemmShape,
    GemmTiming,
    aggregate_rate,
    fastest,
    linear_shapes,
    measure_gemm_rate,
    roofline_fraction,
    total_flops,
)


def fake_model_config() -> ModelConfig:
    return ModelConfig.from_dict(
        {
            "architectures": ["LlamaForCausalLM"],
            "vocab_size": 1000,
            "hidden_size": 64,
            "intermediate_size": 160,
            "num_hidden_layers": 3,
            "num_attention_heads": 4,
            "num_key_value_heads": 2,
            "head_dim": 32,
        }
    )


def test_linear_shapes_follow_the_config():
    shapes = {s.name: (s.k, s.n, s.count) for s in linear_shapes(fake_model_config())}
    assert shapes == {
        "qkv_proj": (64, 4 * 32 + 2 * 2 * 32, 3),
        "o_proj": (4 * 32, 64, 3),
        "gate_up_proj": (64, 320, 3),
        "down_proj": (160, 64, 3),
        "lm_head": (64, 1000, 1),
    }


def test_total_flops_counts_every_layer():
    shapes = [GemmShape("a", 10, 20, 3), GemmShape("b", 5, 7, 1)]
    assert total_flops(shapes, m=4) == 2 * 4 * 10 * 20 * 3 + 2 * 4 * 5 * 7


def test_aggregate_rate_weights_by_flops():
    big = GemmTiming(GemmShape("big", 100, 100, 2), m=1, seconds_per_call=1e-3)  # 20 kFLOP per call
    small = GemmTiming(GemmShape("small", 10, 100, 1), m=1, seconds_per_call=1e-3)  # 2 kFLOP per call
    assert big.flops_per_s == pytest.approx(2e7)
    # total FLOPs / total time: (2 * 20k + 2k) / 3 ms, not the mean of the per-shape rates
    assert aggregate_rate([big, small]) == pytest.approx(42_000 / 3e-3)


def test_roofline_fraction():
    assert roofline_fraction(100.0, 1_000_000, 1e9) == pytest.approx(0.2)


def test_measure_gemm_rate_times_every_shape(fast_roofline):
    shapes = [GemmShape("a", 16, 32, 2), GemmShape("b", 32, 16, 1)]
    rate = measure_gemm_rate(shapes, m=4, dtype="bfloat16")
    assert [t.shape.name for t in rate.timings] == ["a", "b"]
    assert rate.flops_per_s > 0 and all(t.m == 4 for t in rate.timings)
    assert set(rate.to_dict()) == {"m", "dtype", "gemm_flops_per_s", "sessions_gemm_flops_per_s", "shapes"}


def test_fastest_keeps_the_best_timing_per_shape():
    a, b = GemmShape("a", 10, 10, 1), GemmShape("b", 10, 10, 1)
    first = GemmRate(1, "float32", 0.0, (GemmTiming(a, 1, 1e-3), GemmTiming(b, 1, 4e-3)))
    second = GemmRate(1, "float32", 0.0, (GemmTiming(a, 1, 2e-3), GemmTiming(b, 1, 2e-3)))
    best = fastest([first, second])
    assert [t.seconds_per_call for t in best.timings] == [1e-3, 2e-3]
    assert best.flops_per_s == pytest.approx(2 * 200 / 3e-3)
    assert best.to_dict()["sessions_gemm_flops_per_s"] == [0.0, 0.0]
