"""Number formats in plain PyTorch: FP8 E4M3 (per-channel, per-token, per-tensor scales) and NVFP4
(E2M1 values in 16-element blocks, E4M3 block scales, one FP32 tensor scale).

This is the reference every kernel is checked against; it runs on any device and dequantizes in fp32.
"""

import torch

FP8 = torch.float8_e4m3fn
FP8_MAX = 448.0  # largest finite E4M3 value
FP4_MAX = 6.0  # largest E2M1 value
NVFP4_BLOCK = 16  # elements sharing one E4M3 block scale
# the eight E2M1 magnitudes, indexed by the 3 low bits of a code (bit 3 is the sign)
E2M1_VALUES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)
_E2M1_MIDPOINTS = (0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0)
_MIN_SCALE = 1e-12  # an all-zero row or block still gets a finite, positive scale


def to_fp8(x: torch.Tensor, scale: torch.Tensor | float) -> torch.Tensor:
    """x / scale, saturated to E4M3's range (a plain cast turns overflow into NaN)."""
    return (x.float() / scale).clamp(-FP8_MAX, FP8_MAX).to(FP8)


def quantize_fp8_rows(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """One scale per row: per output channel for a weight [out, in], per token for activations.

    Returns (values [rows, cols] float8_e4m3fn, scales [rows] float32)."""
    scale = (x.abs().amax(dim=-1).float() / FP8_MAX).clamp(min=_MIN_SCALE)
    return to_fp8(x, scale[..., None]), scale


def dequantize_fp8_rows(q: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    return q.float() * scale.float()[..., None]


def fp8_linear_reference(x: torch.Tensor, weight: torch.Tensor, weight_scale: torch.Tensor) -> torch.Tensor:
    """What an FP8 tensor-core matmul computes: activations quantized per token (dynamic), weights per
    output channel; products accumulated in fp32 and both scales applied to the output. Returns fp32."""
    xq, x_scale = quantize_fp8_rows(x)
    return (xq.float() @ weight.float().t()) * x_scale[:, None] * weight_scale.float()[None, :]


def nvfp4_global_scale(amax: torch.Tensor | float) -> torch.Tensor:
    """The FP32 tensor scale: maps the tensor's amax onto the largest block scale times the largest value."""
    return (torch.as_tensor(amax, dtype=torch.float32) / (FP8_MAX * FP4_MAX)).clamp(min=_MIN_SCALE)


def quantize_nvfp4(w: torch.Tensor, global_scale: torch.Tensor | None = None):
    """w [rows, cols] (cols a multiple of 16) -> (packed uint8 [rows, cols // 2], block scales
    float8_e4m3fn [rows, cols // 16], global scale float32 []).

    Element 2j sits in the low nibble of byte j, element 2j + 1 in the high nibble. `global_scale`
    lets several tensors (the shards of a merged projection) share one tensor scale."""
    rows, cols = w.shape
    if cols % NVFP4_BLOCK:
        raise ValueError(f"NVFP4 needs columns in multiples of {NVFP4_BLOCK}, got {cols}")
    w32 = w.float()
    if global_scale is None:
        global_scale = nvfp4_global_scale(w32.abs().amax())
    global_scale = global_scale.to(device=w.device, dtype=torch.float32)
    blocks = w32.view(rows, cols // NVFP4_BLOCK, NVFP4_BLOCK)
    block_scale = to_fp8(blocks.abs().amax(-1) / FP4_MAX, global_scale)  # [rows, cols // 16]
    real_scale = block_scale.float() * global_scale
    # NOTE: a block whose scale underflowed to 0 holds only values that round to 0 anyway
    scaled = blocks / torch.where(real_scale > 0, real_scale, 1.0)[..., None]
    codes = encode_e2m1(scaled.view(rows, cols))
    return pack_nibbles(codes), block_scale, global_scale


def dequantize_nvfp4(packed: torch.Tensor, block_scale: torch.Tensor, global_scale: torch.Tensor) -> torch.Tensor:
    """The inverse of quantize_nvfp4, in fp32: [rows, cols]."""
    values = decode_e2m1(unpack_nibbles(packed))  # [rows, cols]
    rows, cols = values.shape
    scale = block_scale.float() * global_scale.float()  # [rows, cols // 16]
    return (values.view(rows, -1, NVFP4_BLOCK) * scale[..., None]).view(rows, cols)


def encode_e2m1(x: torch.Tensor) -> torch.Tensor:
    """Round to the nearest E2M1 value (saturating at 6); returns 4-bit codes as uint8."""
    mids = torch.tensor(_E2M1_MIDPOINTS, device=x.device)
    magnitude = torch.bucketize(x.abs().contiguous(), mids).to(torch.uint8)  # 0..7
    return magnitude | ((x < 0).to(torch.uint8) << 3)


def decode_e2m1(codes: torch.Tensor) -> torch.Tensor:
    table = torch.tensor(E2M1_VALUES, device=codes.device)
    magnitude = table[(codes & 7).long()]
    return torch.where((codes & 8).bool(), -magnitude, magnitude)


def pack_nibbles(codes: torch.Tensor) -> torch.Tensor:
    return codes[..., 0::2] | (codes[..., 1::2] << 4)


def unpack_nibbles(packed: torch.Tensor) -> torch.Tensor:
    return torch.stack((packed & 15, packed >> 4), dim=-1).flatten(-2)
