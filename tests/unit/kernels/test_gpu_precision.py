"""The GPU path's precision, checked on CPU: each kernel under the interpreter at Llama-3.1-8B's head and
layer geometry, with the GPU's tiles, its dot operands rounded as the GPU rounds them (bf16 P and
dequantized weights, FP8 KV values, fp32 accumulation: kernels/operands.py), against the PyTorch reference
with the bounds test_gpu.py uses (the same check functions). Lengths are cut to keep the interpreter quick."""

import os

import pytest
import torch
import triton
import triton.language as tl

from engines.native.kernels import checks, op_checks
from engines.native.kernels.operands import dot_operand

pytestmark = pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1", reason="the CPU half of test_gpu.py")
BF16, FP8 = torch.bfloat16, torch.float8_e4m3fn
HEADS = {"num_heads": 8, "num_kv_heads": 2, "head_dim": 128, "block_size": 16}  # Llama-8B's GQA group of 4


@triton.jit
def _as_bf16_operand(x_ptr, out_ptr, N: tl.constexpr):
    offs = tl.arange(0, N)
    tl.store(out_ptr + offs, dot_operand(tl.load(x_ptr + offs), tl.bfloat16, True))


def test_bf16_operands_round_to_nearest_even_as_the_gpu_does():
    x = torch.randn(4096, generator=torch.Generator().manual_seed(0)) * 100
    x[:4] = torch.tensor([1 + 2**-8, 1 + 3 * 2**-8, -(1 + 2**-8), 2**-130])  # ties (to even: down, up) and tiny
    out = torch.empty_like(x)
    _as_bf16_operand[(1,)](x, out, N=4096)
    assert torch.equal(out, x.to(BF16).float())


@pytest.mark.parametrize("kv_dtype", [None, FP8])
def test_attention_in_the_gpu_precision(kv_dtype):
    from engines.native.kernels.paged_prefill import tiles_for

    tiles = {k: v for k, v in tiles_for(128, True).items() if k.startswith("block")}
    results = [
        checks.check_decode("cpu", BF16, kv_dtype, seq_lens=(1, 129, 1000), **HEADS),
        checks.check_decode("cpu", BF16, kv_dtype, seq_lens=(1, 129, 1000), num_splits=1, **HEADS),
        checks.check_prefill("cpu", BF16, kv_dtype, spans=((200, 200), (100, 700)), **HEADS, **tiles),
        checks.check_write_kv("cpu", BF16, kv_dtype, num_tokens=64, num_kv_heads=8, head_dim=128, block_size=16),
        op_checks.check_rope_kv(
            "cpu", BF16, kv_dtype, num_tokens=16, num_heads=32, num_kv_heads=8, head_dim=128, block_size=16
        ),
    ]
    assert all(r.ok for r in results), results


@pytest.mark.parametrize("m", [1, 16, 64])
def test_quantized_gemms_in_the_gpu_precision(m):
    """The decode GEMV tiles for up to 16 rows, gpu_modules' 64-row tiles above; K at Llama-8B's widths."""
    tiles = {} if m <= 16 else {"block_m": 64, "split_k": 1}
    results = [
        op_checks.check_fp8_w8a16("cpu", BF16, m=m, n=128, k=4096, **tiles),
        op_checks.check_nvfp4_matmul("cpu", BF16, m=m, n=128, k=14336),
        op_checks.check_fp8_act_quant("cpu", BF16, m=m, k=4096),
    ]
    assert all(r.ok for r in results), results


@pytest.mark.parametrize("quant", [None, "static", "dynamic"])
def test_small_ops_at_llama_widths(quant):
    results = [
        op_checks.check_rms_norm("cpu", BF16, quant, num_tokens=8, hidden=4096),
        op_checks.check_silu_mul("cpu", BF16, quant, num_tokens=8, n=14336),
    ]
    assert all(r.ok for r in results), results
