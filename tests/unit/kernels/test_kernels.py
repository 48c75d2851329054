"""The attention kernels against their PyTorch reference (engines.native.kernels.checks) at tiny shapes:
fp32 and bf16, an FP8 KV cache, GQA ratios from MHA to 8, odd context lengths, cache blocks of 4, 16
and 64 tokens, one split or several; and proof that the checks can fail."""

import pytest
import torch

from engines.native.kernels import checks

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
FP8 = torch.float8_e4m3fn
BF16 = torch.bfloat16


@pytest.mark.parametrize("kv_dtype", [None, FP8])
def test_write_kv(kv_dtype):
    result = checks.check_write_kv(DEVICE, torch.float32, kv_dtype)
    assert result.ok, result


def test_write_kv_check_takes_fp8_zeros_of_either_sign_as_equal():
    a = torch.tensor([0.0, 1.0, -2.0]).to(FP8)
    b = a.clone()
    b.view(torch.uint8)[0] = 0x80  # -0.0
    assert checks._same_values(a, b)
    b.view(torch.uint8)[1] = 0x39  # 1.125: a real difference
    assert not checks._same_values(a, b)


@pytest.mark.parametrize(
    "dtype, kv_dtype, num_heads, num_kv_heads, block_size, num_splits",
    [
        (torch.float32, None, 4, 2, 4, None),
        (torch.float32, FP8, 4, 2, 4, None),
        (torch.float32, None, 2, 2, 16, 2),  # MHA
        (torch.float32, None, 8, 2, 16, 4),  # GQA 4
        (torch.float32, FP8, 8, 1, 64, 2),  # GQA 8 (MQA)
        (BF16, None, 8, 2, 16, 4),
        (BF16, FP8, 4, 1, 64, 1),
        (BF16, FP8, 8, 2, 16, 8),
    ],
)
def test_paged_decode(dtype, kv_dtype, num_heads, num_kv_heads, block_size, num_splits):
    result = checks.check_decode(
        DEVICE,
        dtype,
        kv_dtype,
        seq_lens=(1, 7, 33, 129),
        num_heads=num_heads,
        num_kv_heads=num_kv_heads,
        block_size=block_size,
        num_splits=num_splits,
        block_n=16 if block_size < 64 else 64,
    )
    assert result.ok, result


def test_paged_decode_mqa_and_zero_length_rows():
    result = checks.check_decode(DEVICE, torch.float32, num_heads=3, num_kv_heads=1, seq_lens=(2, 5), block_size=16)
    assert result.ok, result
    from engines.native.kernels.paged_decode import paged_decode

    q = torch.randn(2, 2, 16, device=DEVICE)
    cache = torch.randn(2, 4, 1, 16, device=DEVICE)
    for num_splits in (1, 4):  # the merge, too, must give zeros for a row with no keys
        out = paged_decode(
            q,
            cache,
            cache,
            torch.zeros(2, 1, dtype=torch.int32, device=DEVICE),
            torch.tensor([0, 3], dtype=torch.int32, device=DEVICE),
            0.25,
            num_splits=num_splits,
        )
        assert torch.equal(out[0], torch.zeros_like(out[0]))  # a padding row: no keys, zeros, no NaN
        assert not torch.isnan(out).any()


def test_paged_decode_splits_follow_the_batch_not_the_lengths():
    from engines.native.kernels.paged_decode import MAX_SPLITS, num_splits_for

    assert num_splits_for(1, 8, 132) == MAX_SPLITS  # batch 1: 8 programs would idle most of 132 SMs
    assert num_splits_for(128, 8, 132) == 1  # 1,024 programs already
    assert num_splits_for(1, 8, 132, max_seq_len=100, block_n=64) == 2  # never more splits than tiles
    with pytest.raises(ValueError, match="power of 2"):
        checks.check_decode(DEVICE, torch.float32, num_splits=3)


@pytest.mark.parametrize(
    "dtype, kv_dtype, block_size, block_m, block_n",
    [
        (torch.float32, None, 4, 16, 16),
        (torch.float32, FP8, 16, 16, 32),
        (BF16, None, 64, 32, 16),
        (BF16, FP8, 16, 16, 16),
    ],
)
def test_paged_prefill_with_cached_prefixes(dtype, kv_dtype, block_size, block_m, block_n):
    result = checks.check_prefill(
        DEVICE,
        dtype,
        kv_dtype,
        spans=((5, 5), (3, 11), (18, 18), (1, 9), (40, 75)),
        block_size=block_size,
        block_m=block_m,
        block_n=block_n,
    )
    assert result.ok, result


def test_paged_prefill_spans_longer_than_a_tile():
    result = checks.check_prefill(
        DEVICE, torch.float32, spans=((20, 37), (33, 33)), num_heads=2, num_kv_heads=2, block_size=8
    )
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
