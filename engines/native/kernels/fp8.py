"""FP8 E4M3 rounding and the FP8 row store shared by the kernels that write FP8 (KV cache, activations)."""

import triton
import triton.language as tl

FP8_MAX = 448.0
# NOTE: globals read inside @triton.jit must be constexpr
_FP8_MAX = tl.constexpr(FP8_MAX)
_MIN_SCALE = tl.constexpr(1e-12)  # an all-zero row still gets a finite, positive scale
_RNE_MAGIC = tl.constexpr(
    12582912.0
)  # 1.5 * 2^23: adding q * this rounds to a multiple of q (a power of 2), ties to even


@triton.jit
def round_to_e4m3(x):
    """Round fp32 (already within +-448) to the nearest E4M3 value, ties to even, staying in fp32.

    NOTE: the cast that follows is then exact. Triton's CPU interpreter rounds some casts to FP8 wrongly
    (7.82 -> 4.0, a lost mantissa carry); the GPU's own cvt would round the same way as this."""
    exp = ((x.to(tl.int32, bitcast=True) >> 23) & 0xFF) - 127
    quantum = ((tl.maximum(exp, -6) - 3 + 127) << 23).to(tl.float32, bitcast=True)  # E4M3 step at |x|
    r = tl.abs((x + quantum * _RNE_MAGIC) - quantum * _RNE_MAGIC)
    return tl.where(x < 0, -r, r)  # keeps -0 for negatives that round to 0, as torch's cast does


@triton.jit
def to_e4m3(x, scale):
    """x / scale saturated to +-448 and rounded to E4M3 (still fp32; the store's cast is exact)."""
    return round_to_e4m3(tl.minimum(tl.maximum(x.to(tl.float32) / scale, -_FP8_MAX), _FP8_MAX))


@triton.jit
def store_row(out_ptr, scale_ptr, row, offs, mask, y, QUANT: tl.constexpr):
    """Store one row: as it is (QUANT 0), or as FP8 with the scale at scale_ptr (1: one given scale)
    or with the row's own amax / 448, stored at scale_ptr[row] (2). The fused ops' FP8 epilogue."""
    if QUANT == 0:
        tl.store(out_ptr + offs, y, mask=mask)
    else:
        if QUANT == 1:
            scale = tl.load(scale_ptr)
        else:
            scale = tl.maximum(tl.max(tl.abs(y.to(tl.float32)), axis=0) / _FP8_MAX, _MIN_SCALE)
            tl.store(scale_ptr + row, scale)
        tl.store(out_ptr + offs, to_e4m3(y, scale).to(out_ptr.dtype.element_ty), mask=mask)
