"""Triton ``rms_norm`` (the RMSNorm pass before the drafter's many-row cuBLAS GEMMs) against its PyTorch twin."""

import pytest
import torch

from sgl_eagle_triton.devtools.reference.rms_norm import rms_norm as rms_norm_ref
from sgl_eagle_triton.kernels.rms_norm import rms_norm


@pytest.mark.parametrize("M, K", [(1, 32), (3, 96), (40, 64), (256, 4096)])
@pytest.mark.parametrize("x_dtype", ["model", torch.float32], ids=["x_model", "x_fp32"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
def test_matches_reference(device, M, K, x_dtype, dtype):
    """Random rows (a row stride wider than K) of an x in the model's ``dtype`` or fp32, weights in ``dtype``:
    equal to the twin up to a rounding flip where the two sums of squares, taken in different orders, differ in
    their last bit."""
    if device == "cpu" and K > 1024:
        pytest.skip("real width on the GPU only")
    gen = torch.Generator().manual_seed(M * K)
    x = (3 * torch.randn(M, K + 5, generator=gen)).to(dtype if x_dtype == "model" else x_dtype).to(device)[:, :K]
    weight = (1 + 0.1 * torch.randn(K, generator=gen)).to(dtype).to(device)
    out = rms_norm(x, weight, 1e-5)
    expected = rms_norm_ref(x, weight, 1e-5)
    assert out.dtype == dtype and out.shape == (M, K)
    err = (out.float() - expected.float()).norm() / expected.float().norm()
    assert err < 1e-3
    assert (out != expected).float().mean() < 0.01  # flips are rare
