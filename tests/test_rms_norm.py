"""Triton ``rms_norm`` (the RMSNorm pass before the drafter's many-row cuBLAS GEMMs) against its PyTorch twin."""

import pytest
import torch

from sgl_eagle_triton.kernels.rms_norm import rms_norm
from sgl_eagle_triton.reference.rms_norm import rms_norm as rms_norm_ref


@pytest.mark.parametrize("M, K", [(1, 32), (3, 96), (40, 64), (256, 4096)])
@pytest.mark.parametrize("x_dtype", [torch.bfloat16, torch.float32])
def test_matches_reference(device, M, K, x_dtype):
    """Random rows (a row stride wider than K): equal to the twin up to a bf16 rounding flip where the two
    sums of squares, taken in different orders, differ in their last bit."""
    if device == "cpu" and K > 1024:
        pytest.skip("real width on the GPU only")
    gen = torch.Generator().manual_seed(M * K)
    x = (3 * torch.randn(M, K + 5, generator=gen)).to(x_dtype).to(device)[:, :K]
    weight = (1 + 0.1 * torch.randn(K, generator=gen)).to(torch.bfloat16).to(device)
    out = rms_norm(x, weight, 1e-5)
    expected = rms_norm_ref(x, weight, 1e-5)
    assert out.dtype == torch.bfloat16 and out.shape == (M, K)
    err = (out.float() - expected.float()).norm() / expected.float().norm()
    assert err < 1e-3
    assert (out != expected).float().mean() < 0.01  # flips are rare
