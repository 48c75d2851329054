"""Ceilings and targets for bench/gpu_engine.py: what each figure would be if the card ran at its
measured copy bandwidth or matmul rate, and the issue's targets checked against the rows of one run.

FLOPs of a forward pass: 2 per linear weight per token for every layer but lm_head, 2 per lm_head
weight only for the rows that sample, and causal attention (QK^T and PV, 2 FLOPs per MAC each) over
the pairs each query sees. Linear FLOPs run at the weights' matmul rate (FP8 or bf16), attention at bf16's.
"""

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class ModelFlops:
    body_params: int  # linear weights of every layer (lm_head and embeddings excluded)
    head_params: int  # lm_head
    num_layers: int
    num_heads: int
    head_dim: int

    def attention(self, pairs: int) -> int:
        return 4 * pairs * self.num_heads * self.head_dim * self.num_layers

    def seconds(self, tokens: int, sampled: int, pairs: int, linear_rate: float, bf16_rate: float) -> float:
        linear = 2 * self.body_params * tokens + 2 * self.head_params * sampled
        return linear / linear_rate + self.attention(pairs) / bf16_rate


def causal_pairs(ctx_start: int, num_queries: int) -> int:
    """(query, key) pairs when num_queries tokens follow ctx_start cached ones, each seeing all before it."""
    return num_queries * ctx_start + num_queries * (num_queries + 1) // 2


def prefill_ceiling(flops: ModelFlops, n: int, bf16_rate: float) -> float:
    """tok/s of one n-token prompt that samples once."""
    return n / flops.seconds(n, 1, causal_pairs(0, n), bf16_rate, bf16_rate)


def offline_ceiling(flops: ModelFlops, n_in: int, n_out: int, linear_rate: float, bf16_rate: float) -> float:
    """Output tok/s of requests of n_in prompt and n_out generated tokens (each generated token samples;
    the prompt's pass samples the first)."""
    pairs = causal_pairs(0, n_in) + causal_pairs(n_in, n_out - 1)
    return n_out / flops.seconds(n_in + n_out - 1, n_out, pairs, linear_rate, bf16_rate)


TARGET_BYTES_PER_S = 2.0e12  # paged decode kernel, one H100


def targets(
    rows: list[dict],
    dtype: str,
    kernel_configs: tuple[str, ...],
    prefill_len: int,
    offline_goals: tuple[tuple[str, float], ...],
) -> list[dict]:
    """Each target with its measured value and whether it is met (None where the run lacks the row).
    kernel_configs: the paged decode shapes held to TARGET_BYTES_PER_S ("128 x 1024");
    offline_goals: (offline config, output tok/s goal) each."""
    value = {(r["section"], r["config"]): r for r in rows}
    decode = {w: value.get(("decode batch 1", f"weights={w} kv={dtype}")) for w in (dtype, "fp8", "nvfp4")}
    out = [_fraction(f"decode batch 1 {dtype}: fraction of the copy ceiling", decode[dtype], 0.80)]
    for weights, ratio in (("fp8", 1.6), ("nvfp4", 2.5)):
        out.append(_ratio(f"decode batch 1 {weights} weights / {dtype}", decode[weights], decode[dtype], ratio))
    for config in kernel_configs:
        row = value.get(("paged decode kernel", config))
        out.append(_at_least(f"paged decode kernel {config}: bytes/s", row and row["value"], TARGET_BYTES_PER_S))
    for config, goal in offline_goals:
        row = value.get(("offline", config))
        out.append(_at_least(f"offline {config}: output tok/s", row and row["value"], goal))
    prefill = value.get(("prefill", f"{prefill_len} tokens {dtype}"))
    out.append(_fraction(f"prefill {prefill_len} tokens: fraction of the ceiling", prefill, 0.80))
    return out


def _fraction(name: str, row: dict | None, goal: float) -> dict:
    return _at_least(name, row and row["fraction"], goal)


def _ratio(name: str, row: dict | None, base: dict | None, goal: float) -> dict:
    return _at_least(name, row and base and row["value"] / base["value"], goal)


def _at_least(name: str, measured: float | None, goal: float) -> dict:
    return {"target": name, "measured": measured, "goal": goal, "met": None if measured is None else measured >= goal}
