"""RMSNorm of a few hundred rows into the model's dtype (bf16 or fp16), once, before a cuBLAS GEMM (the drafter
at large batch x topk), and :func:`rstd`, the one RMSNorm rule of every kernel that normalises (draft_input,
linear, lm_head_topk, this one).

``out = rnd((x * rstd) * w)`` with ``rstd = 1 / sqrt(mean(x**2) + eps)`` in fp32, the mean, square root and
division correctly rounded (``sgl_eagle_triton.devtools.reference.rms_norm``), and ``rnd`` the rounding to the weight's
dtype; SGLang's ``torch.rsqrt`` differs from it by at most an ulp or two. One program per row.
"""

import torch
import triton
import triton.language as tl

from sgl_eagle_triton.kernels.rounding import MODEL_DTYPES, round_to, tl_dtype


@triton.jit
def rstd(sum_sq, n, eps):
    """``1 / sqrt(sum_sq / n + eps)`` in fp32, each operation correctly rounded (``sum_sq``: a row's sum of
    squares, scalar or vector)."""
    return tl.math.div_rn(1.0, tl.math.sqrt_rn(tl.math.div_rn(sum_sq, n) + eps))


@triton.jit
def _rms_norm_kernel(x_ptr, stride_x, w_ptr, out_ptr, eps, K: tl.constexpr, BLOCK: tl.constexpr, DTYPE: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    sum_sq = tl.zeros([BLOCK], dtype=tl.float32)
    for k0 in range(0, K, BLOCK):
        ks = k0 + tl.arange(0, BLOCK)
        v = tl.load(x_ptr + row * stride_x + ks, mask=ks < K, other=0.0).to(tl.float32)
        sum_sq += v * v
    inv = rstd(tl.sum(sum_sq, axis=0), K, eps)
    for k0 in range(0, K, BLOCK):
        ks = k0 + tl.arange(0, BLOCK)
        v = tl.load(x_ptr + row * stride_x + ks, mask=ks < K, other=0.0).to(tl.float32)
        w = tl.load(w_ptr + ks, mask=ks < K, other=0.0).to(tl.float32)
        tl.store(out_ptr + row * K + ks, round_to((v * inv) * w, DTYPE), mask=ks < K)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """x: [M, K] in the weight's dtype or fp32 (unit column stride); weight: [K] bf16 or fp16. Returns a new
    [M, K] tensor in the weight's dtype."""
    M, K = x.shape
    assert x.stride(1) == 1 and weight.shape == (K,) and weight.is_contiguous()
    assert weight.dtype in MODEL_DTYPES and x.dtype in (weight.dtype, torch.float32)
    out = torch.empty(M, K, dtype=weight.dtype, device=x.device)
    _rms_norm_kernel[(M,)](x, x.stride(0), weight, out, eps, K=K, BLOCK=min(1024, triton.next_power_of_2(K)),
                           DTYPE=tl_dtype(weight.dtype), num_warps=4)
    return out
