"""The machine's matmul roofline for one model: time torch GEMMs at the model's linear-layer shapes
and batch size, weight them by FLOPs. Reads shapes from the checkpoint's config; loads no weights."""

import time
from dataclasses import dataclass

import torch

from engines.native.config import ModelConfig

# NOTE: weights are streamed from DRAM in real decode (a model's layers do not fit in cache), so each
# shape rotates over copies of its weight that together exceed the last-level cache.
_ROTATE_BYTES = 128 << 20
_MIN_ROUND_S = 0.05
_NUM_ROUNDS = 5


@dataclass(frozen=True, slots=True)
class GemmShape:
    """y[m, n] = x[m, k] @ w[n, k].T, run `count` times per forward token batch."""

    name: str
    k: int
    n: int
    count: int


@dataclass(frozen=True, slots=True)
class GemmTiming:
    shape: GemmShape
    m: int
    seconds_per_call: float

    @property
    def flops_per_s(self) -> float:
        return 2 * self.m * self.shape.k * self.shape.n / self.seconds_per_call


@dataclass(frozen=True, slots=True)
class GemmRate:
    m: int
    dtype: str
    flops_per_s: float  # FLOP-weighted aggregate over `timings`
    timings: tuple[GemmTiming, ...]
    sessions_flops_per_s: tuple[float, ...] = ()  # each measurement's aggregate, when combined by fastest()

    def to_dict(self) -> dict:
        shapes = [
            {
                "name": t.shape.name,
                "m": t.m,
                "k": t.shape.k,
                "n": t.shape.n,
                "count": t.shape.count,
                "flops_per_s": t.flops_per_s,
            }
            for t in self.timings
        ]
        return {
            "m": self.m,
            "dtype": self.dtype,
            "gemm_flops_per_s": self.flops_per_s,
            "sessions_gemm_flops_per_s": list(self.sessions_flops_per_s or (self.flops_per_s,)),
            "shapes": shapes,
        }


def linear_shapes(cfg: ModelConfig) -> list[GemmShape]:
    """Every linear layer of one forward pass, with q/k/v and gate/up merged as the native engine runs them."""
    hidden, layers = cfg.hidden_size, cfg.num_hidden_layers
    q_dim = cfg.num_attention_heads * cfg.head_dim
    kv_dim = cfg.num_key_value_heads * cfg.head_dim
    return [
        GemmShape("qkv_proj", hidden, q_dim + 2 * kv_dim, layers),
        GemmShape("o_proj", q_dim, hidden, layers),
        GemmShape("gate_up_proj", hidden, 2 * cfg.intermediate_size, layers),
        GemmShape("down_proj", cfg.intermediate_size, hidden, layers),
        GemmShape("lm_head", hidden, cfg.vocab_size, 1),
    ]


def total_flops(shapes: list[GemmShape], m: int) -> int:
    return sum(2 * m * s.k * s.n * s.count for s in shapes)


def aggregate_rate(timings: list[GemmTiming]) -> float:
    """Total FLOPs over total time, each shape counted as often as the model runs it."""
    flops = sum(2 * t.m * t.shape.k * t.shape.n * t.shape.count for t in timings)
    seconds = sum(t.seconds_per_call * t.shape.count for t in timings)
    return flops / seconds


def roofline_fraction(output_tokens_per_s: float, num_parameters: int, gemm_flops_per_s: float) -> float:
    """Achieved FLOP rate (2 FLOPs per parameter per token) as a fraction of the measured GEMM rate."""
    return output_tokens_per_s * 2 * num_parameters / gemm_flops_per_s


def measure_gemm_rate(shapes: list[GemmShape], m: int, dtype: str) -> GemmRate:
    timings = tuple(time_gemm(s, m, getattr(torch, dtype)) for s in shapes)
    return GemmRate(m, dtype, aggregate_rate(list(timings)), timings)


def fastest(rates: list[GemmRate]) -> GemmRate:
    """Per shape, the fastest of several measurements of the same shapes (e.g. before and after a run)."""
    timings = tuple(min(group, key=lambda t: t.seconds_per_call) for group in zip(*(r.timings for r in rates)))
    first = rates[0]
    return GemmRate(first.m, first.dtype, aggregate_rate(list(timings)), timings, tuple(r.flops_per_s for r in rates))


@torch.inference_mode()
def time_gemm(shape: GemmShape, m: int, dtype: torch.dtype) -> GemmTiming:
    gen = torch.Generator().manual_seed(0)
    weight_bytes = shape.n * shape.k * torch.finfo(dtype).bits // 8
    num_copies = max(2, -(-_ROTATE_BYTES // weight_bytes))
    first = torch.randn(shape.n, shape.k, generator=gen).to(dtype)  # [n, k]
    weights = [first] + [first.clone() for _ in range(num_copies - 1)]
    x = torch.randn(m, shape.k, generator=gen).to(dtype)  # [m, k]
    _time_round(x, weights)  # warm-up: thread pool, allocator, kernel selection
    # NOTE: the fastest round, not the mean: a roofline is what the machine can do, and other
    # processes on a shared machine only ever slow a round down.
    return GemmTiming(shape, m, min(_time_round(x, weights) for _ in range(_NUM_ROUNDS)))


def _time_round(x: torch.Tensor, weights: list[torch.Tensor]) -> float:
    """Seconds per call, over at least one pass through every weight copy and _MIN_ROUND_S."""
    num_calls, start = 0, time.perf_counter()
    while num_calls < len(weights) or time.perf_counter() - start < _MIN_ROUND_S:
        torch.nn.functional.linear(x, weights[num_calls % len(weights)])
        num_calls += 1
    return (time.perf_counter() - start) / num_calls
