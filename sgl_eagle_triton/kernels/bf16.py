"""bf16 helpers for the drafter's kernels that stay exact under the CPU interpreter.

Triton 3.6's interpreter (``TRITON_INTERPRET=1``, how CI runs kernels) gets two bf16 operations wrong:
``tl.dot`` on bf16 operands returns garbage, and fp32 -> bf16 casts truncate instead of rounding to nearest
even. Under the interpreter these helpers upcast dot operands (bf16 products are exact in fp32) and round
by integer arithmetic; compiled for a GPU they are the plain operations.
"""

import os

import triton
import triton.language as tl

INTERPRETED = tl.constexpr(os.environ.get("TRITON_INTERPRET", "0") == "1")


@triton.jit
def mma(a, b, acc):
    """``acc + a @ b`` with fp32 accumulation; a: [M, K], b: [K, N] bf16, acc: [M, N] fp32."""
    if INTERPRETED:
        return tl.dot(a.to(tl.float32), b.to(tl.float32), acc)
    else:
        return tl.dot(a, b, acc)


@triton.jit
def to_bf16(x):
    """fp32 ``x`` rounded to the nearest bf16 (ties to even), as a bf16 tensor (finite inputs)."""
    if INTERPRETED:
        bits = x.to(tl.uint32, bitcast=True)
        bits = (bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000
        return bits.to(tl.float32, bitcast=True).to(tl.bfloat16)
    else:
        return x.to(tl.bfloat16)
