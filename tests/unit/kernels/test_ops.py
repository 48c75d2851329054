"""The fused small ops and the quantized GEMM kernels against their PyTorch references
(engines.native.kernels.op_checks) at tiny shapes, fp32 and bf16, with and without FP8 epilogues."""

import pytest
import torch

from engines.native.kernels import op_checks

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
FP8 = torch.float8_e4m3fn
DTYPES = [torch.float32, torch.bfloat16]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("quant", [None, "static", "dynamic"])
def test_rms_norm_with_residual(dtype, quant):
    result = op_checks.check_rms_norm(DEVICE, dtype, quant)
    assert result.ok, result


def test_rms_norm_without_residual_and_odd_width():
    result = op_checks.check_rms_norm(DEVICE, torch.float32, hidden=72, residual=False)
    assert result.ok, result


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("quant", [None, "static", "dynamic"])
def test_silu_mul(dtype, quant):
    result = op_checks.check_silu_mul(DEVICE, dtype, quant)
    assert result.ok, result


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("kv_dtype", [None, FP8])
def test_rope_and_kv_write(dtype, kv_dtype):
    result = op_checks.check_rope_kv(DEVICE, dtype, kv_dtype)
    assert result.ok, result


def test_rope_and_kv_write_mqa_odd_heads():
    result = op_checks.check_rope_kv(DEVICE, torch.float32, num_heads=3, num_kv_heads=1, head_dim=32)
    assert result.ok, result


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("m, split_k", [(1, None), (3, 2), (17, 1)])
def test_fp8_w8a16(dtype, m, split_k):
    result = op_checks.check_fp8_w8a16(DEVICE, dtype, m=m, split_k=split_k)
    assert result.ok, result


@pytest.mark.parametrize("static", [False, True])
def test_fp8_activation_quant_matches_reference_bytes(static):
    result = op_checks.check_fp8_act_quant(DEVICE, torch.float32, static)
    assert result.ok, result


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("m, split_k", [(1, None), (3, 3), (17, 1)])
def test_nvfp4_matmul(dtype, m, split_k):
    result = op_checks.check_nvfp4_matmul(DEVICE, dtype, m=m, split_k=split_k, block_n=32, block_k=32)
    assert result.ok, result


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_nvfp4_dequantize(dtype):
    result = op_checks.check_nvfp4_dequant(DEVICE, dtype)
    assert result.ok, result


def test_a_wrong_epilogue_scale_fails_its_check(monkeypatch):
    """Guards the FP8 epilogue checks: a kernel whose per-row scale is twice too large must fail."""
    from engines.native.kernels import silu_mul as module

    real = module.silu_mul

    def doubled(x, quant=0, scale=None):
        out, s = real(x, quant, scale)
        return out, s * 2

    monkeypatch.setattr(module, "silu_mul", doubled)
    assert not op_checks.check_silu_mul(DEVICE, torch.float32, "dynamic").ok


@pytest.mark.parametrize("k, split_k", [(80, 1), (80, 2), (272, 3)])
def test_quantized_gemms_with_a_partial_last_k_tile(k, split_k):
    results = [
        op_checks.check_fp8_w8a16(DEVICE, torch.float32, m=2, n=24, k=k, split_k=split_k, block_k=64),
        op_checks.check_nvfp4_matmul(DEVICE, torch.float32, m=2, n=24, k=k, split_k=split_k, block_n=16, block_k=64),
    ]
    assert all(r.ok for r in results), results


def test_e4m3_steps_counts_the_codes_between_two_tensors():
    """The check's distance: 0 for the same bytes, 1 for neighbours, across zero as well as within a sign."""
    values = torch.tensor([1.0, -1.0, 0.0, 448.0]).to(torch.float8_e4m3fn)
    assert op_checks._e4m3_steps(values, values.clone()) == 0.0
    up = (values.view(torch.uint8) + torch.tensor([1, 1, 1, 0], dtype=torch.uint8)).view(torch.float8_e4m3fn)
    assert op_checks._e4m3_steps(values, up) == 1.0  # 1.0 -> 1.125, -1.0 -> -1.125, 0 -> the smallest subnormal
    neg_zero = torch.tensor([-0.0]).to(torch.float8_e4m3fn)
    smallest = torch.tensor([2.0**-9]).to(torch.float8_e4m3fn)
    assert op_checks._e4m3_steps(neg_zero, smallest) == 1.0
