"""FP8 and NVFP4 reference formats: exact codes on representable values, and error bounds elsewhere."""

import pytest
import torch

from engines.native.quant import formats

# E4M3 keeps 3 mantissa bits: round-to-nearest is within 2^-4 relative for normal values
FP8_REL = 2.0**-4


def test_e2m1_codes_are_exact_on_representable_values():
    values = torch.tensor(formats.E2M1_VALUES + tuple(-v for v in formats.E2M1_VALUES))
    codes = formats.encode_e2m1(values)
    assert codes.tolist() == list(range(8)) + [0] + [8 | i for i in range(1, 8)]  # -0 encodes as +0
    assert torch.equal(formats.decode_e2m1(codes).abs(), values.abs())


def test_e2m1_rounds_to_nearest_and_saturates():
    x = torch.tensor([0.2, 0.3, 1.2, 2.6, 4.9, 5.1, 100.0, -3.4])
    assert formats.decode_e2m1(formats.encode_e2m1(x)).tolist() == [0.0, 0.5, 1.0, 3.0, 4.0, 6.0, 6.0, -3.0]


def test_nibbles_pack_low_first():
    codes = torch.tensor([[1, 2, 15, 0]], dtype=torch.uint8)
    packed = formats.pack_nibbles(codes)
    assert packed.tolist() == [[0x21, 0x0F]]
    assert torch.equal(formats.unpack_nibbles(packed), codes)


def test_nvfp4_block_of_representable_values_roundtrips_exactly():
    row = torch.tensor(formats.E2M1_VALUES + tuple(-v for v in formats.E2M1_VALUES))[None, :]  # amax 6
    packed, block_scale, global_scale = formats.quantize_nvfp4(row)
    assert block_scale.float().item() * global_scale.item() == pytest.approx(1.0)
    assert packed[0, 0].item() == 0x10  # codes 0 and 1
    assert torch.equal(formats.dequantize_nvfp4(packed, block_scale, global_scale), row)


def test_nvfp4_error_within_half_the_widest_gap_per_block():
    w = torch.randn(8, 64, generator=torch.Generator().manual_seed(0)) * torch.logspace(-3, 1, 8)[:, None]
    packed, block_scale, global_scale = formats.quantize_nvfp4(w)
    err = (formats.dequantize_nvfp4(packed, block_scale, global_scale) - w).abs().view(8, 4, 16)
    real_scale = block_scale.float() * global_scale  # [8, 4]
    # NOTE: the widest gap between E2M1 values is 4 -> 6, so rounding costs at most 1 * block scale
    assert (err <= real_scale[..., None] * 1.0 + 1e-6).all()
    assert (packed.shape, block_scale.dtype) == ((8, 32), formats.FP8)


def test_nvfp4_shared_global_scale_is_used():
    w = torch.randn(4, 32)
    shared = formats.nvfp4_global_scale(100.0)
    _, _, global_scale = formats.quantize_nvfp4(w, shared)
    assert global_scale.item() == shared.item()


def test_fp8_rows_within_relative_bound():
    x = torch.randn(16, 64, generator=torch.Generator().manual_seed(1)) * 30
    q, scale = formats.quantize_fp8_rows(x)
    back = formats.dequantize_fp8_rows(q, scale)
    subnormal = scale[:, None] * 2.0**-9  # E4M3's smallest step below its smallest normal
    assert ((back - x).abs() <= FP8_REL * x.abs() + subnormal).all()
    assert (q.float().abs().amax(-1) == formats.FP8_MAX).all()  # each row's amax maps onto 448


def test_to_fp8_saturates_instead_of_nan():
    assert formats.to_fp8(torch.tensor([1e6, -1e6]), 1.0).float().tolist() == [448.0, -448.0]


def test_fp8_linear_reference_close_to_fp32_matmul():
    gen = torch.Generator().manual_seed(2)
    x, w = torch.randn(8, 64, generator=gen), torch.randn(32, 64, generator=gen)
    wq, w_scale = formats.quantize_fp8_rows(w)
    y = formats.fp8_linear_reference(x, wq, w_scale)
    rel = (y - x @ w.t()).norm() / (x @ w.t()).norm()
    assert 0 < rel < 0.05
