"""PyTorch twin of :mod:`sgl_eagle_triton.kernels.rms_norm`: SGLang's RMSNorm rounded to the weight's dtype."""

import torch


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """fp32 ``(x * rstd) * weight`` rounded to the weight's dtype (bf16 or fp16), ``rstd = 1 / sqrt(mean(x**2)
    + eps)`` (a correctly rounded square root, then division, as the kernels compute it; SGLang's ``torch.rsqrt``
    differs from it by at most an ulp or two)."""
    x = x.float()
    rstd = 1 / torch.sqrt(x.pow(2).mean(dim=-1, keepdim=True) + eps)
    return ((x * rstd) * weight.float()).to(weight.dtype)
