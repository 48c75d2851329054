"""Every Triton kernel against its PyTorch reference (engines.native.kernels.checks) at tiny shapes,
in fp32 and with an FP8 KV cache; and proof that the checks can fail."""
import pytest
import torch

from engines.native.kernels import checks

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
FP8 = torch.float8_e4m3fn


@pytest.mark.parametrize("kv_dtype", [None, FP8])
def test_write_kv(kv_dtype):
    result = checks.check_write_kv(DEVICE, torch.float32, kv_dtype)
    assert result.ok, result


@pytest.mark.parametrize("kv_dtype", [None, FP8])
def test_paged_decode_gqa(kv_dtype):
    result = checks.check_decode(DEVICE, torch.float32, kv_dtype)
    assert result.ok, result


def test_paged_decode_mqa_and_zero_length_rows():
    result = checks.check_decode(DEVICE, torch.float32, num_heads=3, num_kv_heads=1, seq_lens=(2, 5), block_size=16)
    assert result.ok, result
    from engines.native.kernels.paged_decode import paged_decode

    q = torch.randn(2, 2, 16, device=DEVICE)
    cache = torch.randn(2, 4, 1, 16, device=DEVICE)
    out = paged_decode(q, cache, cache, torch.zeros(2, 1, dtype=torch.int32, device=DEVICE),
                       torch.tensor([0, 3], dtype=torch.int32, device=DEVICE), 0.25)
    assert torch.equal(out[0], torch.zeros_like(out[0]))  # a padding row: no keys, zeros, no NaN
    assert not torch.isnan(out).any()


@pytest.mark.parametrize("kv_dtype", [None, FP8])
def test_paged_prefill_with_cached_prefixes(kv_dtype):
    result = checks.check_prefill(DEVICE, torch.float32, kv_dtype)
    assert result.ok, result


def test_paged_prefill_spans_longer_than_a_tile():
    result = checks.check_prefill(DEVICE, torch.float32, spans=((20, 37), (33, 33)), num_heads=2, num_kv_heads=2,
                                  block_size=8)
    assert result.ok, result


def test_nvfp4_matmul():
    result = checks.check_nvfp4_matmul(DEVICE, torch.float32)
    assert result.ok, result


def test_a_wrong_kernel_fails_its_check(monkeypatch):
    """Guards the tests above: a kernel that drops the last key of each sequence must fail."""
    from engines.native.kernels import paged_decode as module

    real = module.paged_decode

    def off_by_one(q, k_cache, v_cache, table, lens, *args, **kw):
        return real(q, k_cache, v_cache, table, (lens - 1).clamp(min=1), *args, **kw)

    monkeypatch.setattr(module, "paged_decode", off_by_one)
    assert not checks.check_decode(DEVICE, torch.float32).ok
    assert not checks.CheckResult("nan", float("nan"), 1.0).ok
