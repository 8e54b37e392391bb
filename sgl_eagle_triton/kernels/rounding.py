"""Rounding helpers of the drafter's kernels that stay exact under the CPU interpreter, and the torch -> Triton
dtype map their launchers use.

Triton 3.6's interpreter (``TRITON_INTERPRET=1``, how CI runs kernels) gets several low-precision operations
wrong: ``tl.dot`` on bf16 operands returns garbage; fp32 -> bf16 casts truncate instead of rounding to nearest
even; fp32 -> fp8 casts (float8e4nv and float8e5) round half away from zero and drop the carry when the
mantissa rounds up into the next binade (1.97 -> 1.0 in float8e4nv). Its fp32 -> fp16 cast is numpy's and
correct. Under the interpreter these helpers upcast dot operands (products of 16-bit floats are exact in fp32)
and round by integer arithmetic, then cast the now exactly representable value; compiled for a GPU they are
the plain operations (``cvt.rn``: round to nearest even, on sm_90 one instruction per conversion).
"""

import os

import torch
import triton
import triton.language as tl

INTERPRETED = tl.constexpr(os.environ.get("TRITON_INTERPRET", "0") == "1")

_TL_DTYPES = {
    torch.bfloat16: tl.bfloat16,
    torch.float16: tl.float16,
    torch.float8_e4m3fn: tl.float8e4nv,
    torch.float8_e5m2: tl.float8e5,
    torch.float32: tl.float32,
}


# The activation / weight dtypes of the drafter's kernels: one per call, the model's (SGLang's --dtype).
MODEL_DTYPES = (torch.bfloat16, torch.float16)
# The FP8 formats of a KV pool the draft attention reads (SGLang's --kv-cache-dtype fp8_e4m3 / fp8_e5m2).
FP8_KV_DTYPES = (torch.float8_e4m3fn, torch.float8_e5m2)


def tl_dtype(dtype: torch.dtype) -> tl.dtype:
    """The Triton dtype of a torch dtype (``round_to``'s ``DTYPE`` for a launcher's tensor)."""
    return _TL_DTYPES[dtype]


@triton.jit
def mma(a, b, acc):
    """``acc + a @ b`` with fp32 accumulation; a: [M, K], b: [K, N], both bf16 or both fp16; acc: [M, N] fp32."""
    if INTERPRETED:
        return tl.dot(a.to(tl.float32), b.to(tl.float32), acc)
    else:
        return tl.dot(a, b, acc)


@triton.jit
def _round_bits(x, MANT: tl.constexpr, EMIN: tl.constexpr):
    """fp32 ``x`` rounded to nearest even on the grid of a float with ``MANT`` mantissa bits whose smallest
    normal is ``2**EMIN`` (subnormals below it), as an fp32 tensor holding that format's value (finite inputs
    that do not overflow the format)."""
    SHIFT: tl.constexpr = 23 - MANT
    bits = x.to(tl.uint32, bitcast=True)
    sign = bits & 0x80000000
    mag = bits & 0x7FFFFFFF
    # Normal range: drop SHIFT mantissa bits, ties to even (a carry moves into the exponent, as it should).
    rounded = (mag + ((1 << (SHIFT - 1)) - 1) + ((mag >> SHIFT) & 1)) & (0xFFFFFFFF ^ ((1 << SHIFT) - 1))
    if EMIN > -126:
        # Below 2**EMIN the grid is 2**(EMIN - MANT): adding 2**(EMIN - MANT + 23) rounds there (fp32 addition
        # rounds to nearest even), subtracting it back is exact.
        MAGIC: tl.constexpr = 2.0 ** (EMIN - MANT + 23)
        tiny = ((mag.to(tl.float32, bitcast=True) + MAGIC) - MAGIC).to(tl.uint32, bitcast=True)
        rounded = tl.where(mag < ((EMIN + 127) << 23), tiny, rounded)
    return (rounded | sign).to(tl.float32, bitcast=True)


@triton.jit
def round_to(x, DTYPE: tl.constexpr):
    """fp32 ``x`` rounded to the nearest ``DTYPE`` value (ties to even), as a ``DTYPE`` tensor. ``DTYPE``:
    ``tl.bfloat16``, ``tl.float16``, ``tl.float8e4nv`` or ``tl.float8e5``; finite inputs within its range."""
    tl.static_assert(DTYPE == tl.bfloat16 or DTYPE == tl.float16 or DTYPE == tl.float8e4nv or DTYPE == tl.float8e5)
    if INTERPRETED:
        if DTYPE == tl.bfloat16:  # the top half of the fp32 bits (the interpreter's cast also gets subnormals wrong)
            rounded = _round_bits(x, 7, -126).to(tl.uint32, bitcast=True)
            return (rounded >> 16).to(tl.uint16).to(tl.bfloat16, bitcast=True)
        elif DTYPE == tl.float8e4nv:  # exactly representable now: the interpreter's cast is exact
            return _round_bits(x, 3, -6).to(DTYPE)
        elif DTYPE == tl.float8e5:  # the top byte of the (exact) fp16 bits
            rounded = _round_bits(x, 2, -14).to(tl.float16).to(tl.uint16, bitcast=True)
            return (rounded >> 8).to(tl.uint8).to(tl.float8e5, bitcast=True)
        else:
            return x.to(DTYPE)
    else:
        return x.to(DTYPE)
