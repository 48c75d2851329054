"""The fused small ops and the quantized GEMMs against their plain-PyTorch references on random data,
as checks.py does for attention: CI runs them under TRITON_INTERPRET=1 at tiny shapes,
bench/gpu_engine.py on the GPU at model shapes before it times anything.
"""

import torch

from engines.base.block_hash import num_blocks_for
from engines.native.kernels.checks import FP8_MAX, REL_BOUNDS, CheckResult, _name, rel_error
from engines.native.quant import formats

# an FP8 output may differ from the reference's by one E4M3 step where the pre-rounding value sits
# on a rounding boundary (the two differ in the last fp32 bits): within 2^-3 of the value.
FP8_STEP = 2.0**-3


def _randn(shape, gen, device, dtype, scale=1.0) -> torch.Tensor:
    return (torch.randn(shape, generator=gen, device=device) * scale).to(dtype)


def check_rms_norm(
    device: str, dtype: torch.dtype, quant: str | None = None, num_tokens=5, hidden=96, residual=True, seed=0
) -> CheckResult:
    """quant: None, "static" or "dynamic" FP8 output."""
    from engines.native.kernels import rms_norm as k

    gen = torch.Generator(device).manual_seed(seed)
    x, res = _randn((num_tokens, hidden), gen, device, dtype), _randn((num_tokens, hidden), gen, device, dtype)
    weight = _randn((hidden,), gen, device, dtype, 0.1) + 1
    ref, ref_res = k.rms_norm_reference(x, weight, 1e-5, res if residual else None)
    mode, static = _quant_mode(quant, ref, device)
    out, new_res, scale = k.rms_norm(x, weight, 1e-5, res if residual else None, mode, static)
    err = _fp8_error(out, scale, ref) if quant else rel_error(out, ref)
    if residual:
        err = max(err, rel_error(new_res, ref_res))
    return CheckResult(f"rms_norm {_name(dtype)}{_suffix(quant, residual)}", err, _bound(dtype, quant))


def check_silu_mul(
    device: str, dtype: torch.dtype, quant: str | None = None, num_tokens=5, n=80, seed=0
) -> CheckResult:
    from engines.native.kernels.silu_mul import silu_mul, silu_mul_reference

    gen = torch.Generator(device).manual_seed(seed)
    x = _randn((num_tokens, 2 * n), gen, device, dtype, 2.0)
    ref = silu_mul_reference(x)
    mode, static = _quant_mode(quant, ref, device)
    out, scale = silu_mul(x, mode, static)
    err = _fp8_error(out, scale, ref) if quant else rel_error(out, ref)
    return CheckResult(f"silu_mul {_name(dtype)}{_suffix(quant, False)}", err, _bound(dtype, quant))


def check_rope_kv(
    device: str,
    dtype: torch.dtype,
    kv_dtype: torch.dtype | None = None,
    num_tokens=7,
    num_heads=4,
    num_kv_heads=2,
    head_dim=16,
    block_size=4,
    seed=0,
) -> CheckResult:
    """Rotated q and the written cache against layers/rotary.py + write_kv_reference; k and v as strided
    views of one fused projection, one padding row (slot -1)."""
    from engines.native.kernels.kv_write import write_kv_reference
    from engines.native.kernels.rope_kv import rope_and_write_kv
    from engines.native.layers.rotary import RotaryEmbedding

    gen = torch.Generator(device).manual_seed(seed)
    kv_dtype = kv_dtype or dtype
    scales = (0.5, 0.25) if kv_dtype == torch.float8_e4m3fn else (1.0, 1.0)
    rotary = RotaryEmbedding(head_dim, 64, 10000.0, None, device)
    q_size, kv_size = num_heads * head_dim, num_kv_heads * head_dim
    qkv = _randn((num_tokens, q_size + 2 * kv_size), gen, device, dtype)
    q, k, v = (t.view(num_tokens, -1, head_dim) for t in qkv.split([q_size, kv_size, kv_size], dim=-1))
    positions = torch.randint(0, 64, (num_tokens,), generator=gen, device=device)
    num_blocks = num_blocks_for(num_tokens, block_size) + 2
    slots = torch.randperm(num_blocks * block_size, generator=gen, device=device)[:num_tokens]
    slots[-1] = -1
    caches = [torch.zeros(num_blocks, block_size, num_kv_heads, head_dim, device=device).to(kv_dtype) for _ in range(4)]
    q_out = rope_and_write_kv(q, k, v, positions, rotary.cos, rotary.sin, caches[0], caches[1], slots, *scales)
    q_ref, k_ref = rotary(positions, q, k)
    write_kv_reference(k_ref, v, caches[2], caches[3], slots, *scales)
    err = max(
        rel_error(q_out, q_ref),
        *(rel_error(a.float(), b.float()) for a, b in ((caches[0], caches[2]), (caches[1], caches[3]))),
    )
    bound = REL_BOUNDS[dtype] * (4 if kv_dtype == torch.float8_e4m3fn else 1)
    return CheckResult(f"rope_kv {_name(dtype, kv_dtype)}", err, bound)


def check_fp8_w8a16(device: str, dtype: torch.dtype, m=3, n=40, k=256, seed=0, **launch) -> CheckResult:
    from engines.native.kernels.fp8_gemm import fp8_w8a16_matmul

    gen = torch.Generator(device).manual_seed(seed)
    w, x = torch.randn(n, k, generator=gen, device=device), _randn((m, k), gen, device, dtype)
    wq, w_scale = formats.quantize_fp8_rows(w)
    bias = _randn((n,), gen, device, dtype)
    out = fp8_w8a16_matmul(x, wq, w_scale, bias, **launch)
    ref = x.float() @ formats.dequantize_fp8_rows(wq, w_scale).t() + bias.float()
    return CheckResult(f"fp8_w8a16 {_name(dtype)} m={m}", rel_error(out, ref), REL_BOUNDS[dtype])


def check_fp8_act_quant(
    device: str, dtype: torch.dtype, static: bool = False, m=6, k=96, seed=0, steps: int = 0
) -> CheckResult:
    """The kernel's E4M3 codes against formats': the error is the largest distance in E4M3 steps (0: the same
    bytes), inf when a scale is more than 4 float32 ulps off. `steps`, the bound, is 0 on CPU; a GPU divides with
    an approximate instruction, so a value on a rounding boundary may land one step over (steps=1)."""
    from engines.native.kernels.fp8_gemm import quantize_fp8_act

    gen = torch.Generator(device).manual_seed(seed)
    x = _randn((m, k), gen, device, dtype, 3.0)
    scale = torch.tensor(0.02, device=device) if static else None
    out, got = quantize_fp8_act(x, scale)
    want, want_scale = (formats.to_fp8(x, scale), scale) if static else formats.quantize_fp8_rows(x)
    scale_ok = torch.allclose(got.float(), want_scale.float(), rtol=4 * 2.0**-23, atol=0.0)
    error = _e4m3_steps(out, want) if scale_ok else float("inf")
    return CheckResult(f"fp8_act_quant {_name(dtype)} {'static' if static else 'dynamic'}", error, float(steps))


def _e4m3_steps(a: torch.Tensor, b: torch.Tensor) -> float:
    """Largest distance between two E4M3 tensors in codes: within one sign the bytes count up with the magnitude."""

    def ordinal(t: torch.Tensor) -> torch.Tensor:
        code = t.view(torch.uint8).int()
        magnitude = code & 0x7F
        return torch.where(code & 0x80 != 0, -magnitude, magnitude)

    return float((ordinal(a) - ordinal(b)).abs().max()) if a.numel() else 0.0


def check_nvfp4_matmul(device: str, dtype: torch.dtype, m=3, n=40, k=96, seed=0, **launch) -> CheckResult:
    from engines.native.kernels.nvfp4_gemm import nvfp4_matmul

    gen = torch.Generator(device).manual_seed(seed)
    w, x = torch.randn(n, k, generator=gen, device=device), _randn((m, k), gen, device, dtype)
    packed, block_scale, global_scale = formats.quantize_nvfp4(w)
    out = nvfp4_matmul(x, packed, block_scale, global_scale, **launch)
    ref = x.float() @ formats.dequantize_nvfp4(packed, block_scale, global_scale).t()
    return CheckResult(f"nvfp4_matmul {_name(dtype)} m={m}", rel_error(out, ref), REL_BOUNDS[dtype])


def check_nvfp4_dequant(device: str, dtype: torch.dtype, n=40, k=96, seed=0) -> CheckResult:
    from engines.native.kernels.nvfp4_gemm import dequantize_nvfp4

    gen = torch.Generator(device).manual_seed(seed)
    packed, block_scale, global_scale = formats.quantize_nvfp4(torch.randn(n, k, generator=gen, device=device))
    out = dequantize_nvfp4(packed, block_scale, global_scale, dtype)
    ref = formats.dequantize_nvfp4(packed, block_scale, global_scale)
    # NOTE: one rounding of the same fp32 product: exact, but for the interpreter's bf16 casts, which
    # truncate (the GPU rounds to nearest): one bf16 step there
    if dtype == torch.bfloat16:
        err = ((out.float() - ref).abs() / ref.abs().clamp(min=1e-30)).max().item()
        return CheckResult(f"nvfp4_dequant {_name(dtype)}", err, 2.0**-7)
    same = torch.equal(out, ref.to(dtype))
    return CheckResult(f"nvfp4_dequant {_name(dtype)}", 0.0 if same else float("inf"), 0.0)


# -- helpers ---------------------------------------------------------------------------------
def _quant_mode(quant: str | None, ref: torch.Tensor, device: str) -> tuple[int, torch.Tensor | None]:
    from engines.native.kernels.rms_norm import QUANT_DYNAMIC, QUANT_NONE, QUANT_STATIC

    if quant is None:
        return QUANT_NONE, None
    if quant == "static":  # a calibrated scale: the reference's amax over the whole tensor
        return QUANT_STATIC, (ref.float().abs().amax() / FP8_MAX).reshape(()).to(device)
    return QUANT_DYNAMIC, None


def _fp8_error(out: torch.Tensor, scale: torch.Tensor, ref: torch.Tensor) -> float:
    """Relative error of the dequantized FP8 output against the unquantized reference, in units of
    the error one E4M3 rounding may cause (so <= 1 passes)."""
    back = out.float() * (scale.float()[:, None] if scale.dim() else scale.float())
    return rel_error(back, ref) / FP8_STEP


def _bound(dtype: torch.dtype, quant: str | None) -> float:
    return 1.0 if quant else REL_BOUNDS[dtype]


def _suffix(quant: str | None, residual: bool) -> str:
    return (" +residual" if residual else "") + (f" fp8-{quant}" if quant else "")
