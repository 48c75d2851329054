"""A dot's operands as the GPU rounds them, also under the CPU interpreter: there the kernels dot in
fp32 (launch.upcast_dots), so an operand is rounded to the model dtype by hand and held in fp32. Only
rounding lives here: no loads, no stores."""

import triton
import triton.language as tl


@triton.jit
def round_to_bf16(x):
    """fp32 -> the nearest bf16 value, ties to even, still fp32 (finite inputs). NOTE: the interpreter's own
    bf16 cast truncates (about half of random values land one step towards zero); a GPU's cvt rounds so."""
    bits = x.to(tl.uint32, bitcast=True)
    bits = bits + 0x7FFF + ((bits >> 16) & 1)
    return ((bits >> 16) << 16).to(tl.float32, bitcast=True)


@triton.jit
def dot_operand(x, DTYPE: tl.constexpr, UPCAST: tl.constexpr):
    """x rounded to DTYPE, the dot's operand type on a GPU (bf16 P in attention, a dequantized weight).
    UPCAST (the interpreter): the same rounded value, in fp32, for the interpreter's fp32 dot."""
    if UPCAST:
        if DTYPE == tl.bfloat16:
            return round_to_bf16(x.to(tl.float32))
        else:
            return x.to(DTYPE).to(tl.float32)
    else:
        return x.to(DTYPE)
