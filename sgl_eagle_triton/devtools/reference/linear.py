"""PyTorch twin of :mod:`sgl_eagle_triton.kernels.linear`: the drafter's linear layer with its fused
RMSNorm prologue and bias / SiLU-and-mul / residual epilogues, in SGLang's rounding order, rounding to the
weight's dtype (bf16 or fp16)."""

import torch.nn.functional as F

from sgl_eagle_triton.devtools.reference.rms_norm import rms_norm


def linear(x, weight, *, bias=None, norm_weight=None, eps=0.0, silu_mul=False, residual=None):
    """``(out [M, N] in the weight's dtype, sum [M, N] fp32 or None)``; shapes as in the kernel's launcher."""
    dtype = weight.dtype
    x = rms_norm(x, norm_weight, eps) if norm_weight is not None else x.to(dtype)
    acc = x.float() @ weight.float().T
    if bias is not None:
        acc = acc + bias.float()
    y = acc.to(dtype).float()
    if silu_mul:
        gate, up = y.chunk(2, dim=-1)
        y = (F.silu(gate) * up).to(dtype).float()
    total = None
    if residual is not None:
        total = y + residual.float()
        y = total
    return y.to(dtype), total
