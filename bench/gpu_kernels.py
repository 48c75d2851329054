"""The kernels alone, for bench/gpu_engine.py: their correctness checks at model shapes, paged decode attention in bytes/s (against the copy
ceiling and contiguous SDPA at the same shapes), paged prefill attention in FLOP/s (against the matmul
ceiling and SDPA's flash kernel), and the FP8 / NVFP4 linear layers against bf16 at every batch size.

Times come from triton.testing.do_bench on a GPU (it clears L2 between calls) and from a wall clock
in the CPU dry run, where the interpreter's numbers mean only that the code runs.
"""

import time
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from engines.base.block_hash import num_blocks_for


@dataclass(frozen=True, slots=True)
class AttnShape:
    num_heads: int
    num_kv_heads: int
    head_dim: int
    block_size: int


def kernel_seconds(fn, device: str) -> float:
    if device.startswith("cuda"):
        from triton.testing import do_bench

        return do_bench(fn, warmup=10, rep=50) / 1e3
    fn()
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def _paged_cache(num_seqs: int, ctx: int, shape: AttnShape, dtype, device: str, gen):
    """K and V caches holding num_seqs contexts of ctx tokens in shuffled blocks, and their tables."""
    blocks_per_seq = num_blocks_for(ctx, shape.block_size)
    num_blocks = num_seqs * blocks_per_seq
    cache_shape = (num_blocks, shape.block_size, shape.num_kv_heads, shape.head_dim)
    k_cache = torch.randn(cache_shape, generator=gen, device=device).to(dtype)
    v_cache = torch.randn(cache_shape, generator=gen, device=device).to(dtype)
    table = torch.randperm(num_blocks, generator=gen, device=device).to(torch.int32).view(num_seqs, blocks_per_seq)
    return k_cache, v_cache, table


def decode_attention(num_seqs: int, ctx: int, shape: AttnShape, dtype, device: str) -> dict:
    """Bytes/s of paged decode over num_seqs x ctx keys, and contiguous SDPA's time at the same shapes."""
    from engines.native.kernels.paged_decode import paged_decode

    gen = torch.Generator(device).manual_seed(0)
    k_cache, v_cache, table = _paged_cache(num_seqs, ctx, shape, dtype, device, gen)
    q = torch.randn(num_seqs, shape.num_heads, shape.head_dim, generator=gen, device=device).to(dtype)
    lens = torch.full((num_seqs,), ctx, dtype=torch.int32, device=device)
    scale = shape.head_dim**-0.5
    ours = kernel_seconds(lambda: paged_decode(q, k_cache, v_cache, table, lens, scale), device)
    kv_bytes = 2 * num_seqs * ctx * shape.num_kv_heads * shape.head_dim * k_cache.element_size()
    moved = kv_bytes + 2 * q.numel() * q.element_size()
    k = torch.randn(num_seqs, shape.num_kv_heads, ctx, shape.head_dim, generator=gen, device=device).to(dtype)
    qs = q.view(num_seqs, shape.num_heads, 1, shape.head_dim)
    sdpa = kernel_seconds(lambda: F.scaled_dot_product_attention(qs, k, k, scale=scale, enable_gqa=True), device)
    return {"config": f"{num_seqs} x {ctx}", "seconds": ours, "bytes_per_s": moved / ours, "sdpa_seconds": sdpa}


def prefill_attention(n: int, shape: AttnShape, dtype, device: str) -> dict:
    """FLOP/s of one causal prefill span of n tokens through the paged kernel, and SDPA's (flash) on
    the same contiguous q/k/v. FLOPs: QK^T and PV over the visible (causal) pairs, 2 per MAC each."""
    from engines.native.kernels.paged_prefill import paged_prefill, tiles_for

    gen = torch.Generator(device).manual_seed(0)
    k_cache, v_cache, table = _paged_cache(1, n, shape, dtype, device, gen)
    q = torch.randn(n, shape.num_heads, shape.head_dim, generator=gen, device=device).to(dtype)
    ints = lambda v: torch.tensor([v], dtype=torch.int32, device=device)  # noqa: E731
    scale = shape.head_dim**-0.5
    tiles = tiles_for(shape.head_dim, device.startswith("cuda"))
    ours = kernel_seconds(
        lambda: paged_prefill(q, k_cache, v_cache, table, ints(0), ints(n), ints(n), n, scale, **tiles), device
    )
    flops = attention_flops(n, n, shape.num_heads, shape.head_dim)
    qs = q.transpose(0, 1)[None]  # [1, heads, n, head_dim]
    kv = torch.randn(1, shape.num_kv_heads, n, shape.head_dim, generator=gen, device=device).to(dtype)
    sdpa = kernel_seconds(
        lambda: F.scaled_dot_product_attention(qs, kv, kv, is_causal=True, scale=scale, enable_gqa=True), device
    )
    return {"config": f"{n} tokens", "seconds": ours, "flops_per_s": flops / ours, "sdpa_flops_per_s": flops / sdpa}


def attention_flops(num_queries: int, ctx_len: int, num_heads: int, head_dim: int) -> int:
    """The last num_queries of ctx_len positions, each seeing keys up to its own: 4 FLOPs per pair per dim."""
    first = ctx_len - num_queries + 1  # keys the first query sees
    pairs = (first + ctx_len) * num_queries // 2
    return 4 * pairs * num_heads * head_dim


def linear_layers(shapes: list[tuple[str, int, int]], ms: tuple[int, ...], dtype, device: str) -> list[dict]:
    """Seconds per call of each layer shape (name, out, in) at each m: bf16 F.linear, the FP8 GPU layer
    and the NVFP4 GPU layer, each picking its own GEMM (dispatch), and the paths they picked."""
    from engines.native.quant import dispatch

    rows = []
    for name, n, k in shapes:
        w = torch.randn(n, k, device=device).to(dtype) * k**-0.5
        fp8, nvfp4 = _quantized_layers(w, dtype, device)
        for m in ms:
            x = torch.randn(m, k, device=device).to(dtype)
            times = {"bf16": kernel_seconds(lambda x=x, w=w: F.linear(x, w), device)}
            for label, layer in (("fp8", fp8), ("nvfp4", nvfp4)):
                layer(x)  # picks (and times) its GEMM for this m once
                times[label] = kernel_seconds(lambda layer=layer, x=x: layer(x), device)
            key = dispatch.m_bucket(m)
            rows.append(
                {
                    "layer": name,
                    "m": m,
                    **{f"{p}_seconds": s for p, s in times.items()},
                    "fp8_path": dispatch.known(("fp8", n, k, key)),
                    "nvfp4_path": dispatch.known(("nvfp4", n, k, key)),
                }
            )
    return rows


def _quantized_layers(w: torch.Tensor, dtype, device: str):
    from engines.native.quant import formats
    from engines.native.quant.gpu_modules import Fp8LinearScaledMm, Nvfp4LinearTriton

    n, k = w.shape
    with torch.device(device):
        fp8, nvfp4 = Fp8LinearScaledMm(k, {"": n}, dtype=dtype), Nvfp4LinearTriton(k, {"": n}, dtype=dtype)
    q, scale = formats.quantize_fp8_rows(w)
    fp8.weight.data.copy_(q)
    fp8.weight_scale.data.copy_(scale)
    packed, block_scale, global_scale = formats.quantize_nvfp4(w)
    for param, value in (
        (nvfp4.weight, packed),
        (nvfp4.weight_scale, block_scale),
        (nvfp4.weight_scale_2, global_scale),
    ):
        param.data.copy_(value)
    return fp8, nvfp4


def kernel_checks(plan) -> list:
    """Every kernel check, at the plan's model shapes (GPU) or tiny ones (dry run)."""
    from engines.native.kernels import checks, op_checks

    dtype, dev, fp8 = getattr(torch, plan.dtype), plan.device, torch.float8_e4m3fn
    big = plan.check_scale > 1
    attn = (
        {
            "num_heads": plan.attn.num_heads,
            "num_kv_heads": plan.attn.num_kv_heads,
            "head_dim": plan.attn.head_dim,
            "block_size": plan.attn.block_size,
        }
        if big
        else {}
    )
    results = []
    for kv in (None, fp8):
        results.append(checks.check_write_kv(dev, dtype, kv, **({"num_tokens": 4096, **_kv_only(attn)} if big else {})))
        results.append(
            checks.check_decode(dev, dtype, kv, seq_lens=(1, 129, 1000, 4097) if big else (1, 7, 33), **attn)
        )
        results.append(
            checks.check_prefill(
                dev, dtype, kv, **({"spans": ((2048, 2048), (100, 1124), (1, 513)), **attn} if big else {})
            )
        )
        results.append(
            op_checks.check_rope_kv(dev, dtype, kv, **({"num_tokens": 512, **_no_block(attn)} if big else {}))
        )
    for quant in (None, "static", "dynamic"):
        results.append(
            op_checks.check_rms_norm(dev, dtype, quant, **({"num_tokens": 256, "hidden": 4096} if big else {}))
        )
        results.append(op_checks.check_silu_mul(dev, dtype, quant, **({"num_tokens": 256, "n": 14336} if big else {})))
    for m, (_, n, k) in [(m, shape) for m in (1, 16, 256) for shape in plan.linears[:1]] if big else [(3, (0, 40, 96))]:
        results.append(op_checks.check_fp8_w8a16(dev, dtype, m, n, k))
        results.append(op_checks.check_nvfp4_matmul(dev, dtype, m, n, k))
    steps = 1 if dev.startswith("cuda") else 0  # a GPU's approximate division: one E4M3 step at a boundary
    results.append(op_checks.check_fp8_act_quant(dev, dtype, m=256 if big else 6, k=4096 if big else 96, steps=steps))
    results.append(op_checks.check_nvfp4_dequant(dev, dtype))
    return results


def _kv_only(attn: dict) -> dict:
    return {key: attn[key] for key in ("num_kv_heads", "head_dim", "block_size")}


def _no_block(attn: dict) -> dict:
    return {key: attn[key] for key in ("num_heads", "num_kv_heads", "head_dim", "block_size")}
