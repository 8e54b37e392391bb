"""Triton skinny ``linear`` (drafter GEMMs with fused norm prologue and epilogues) against its PyTorch twin."""

import pytest
import torch
import triton

from sgl_eagle_triton.kernels.linear import linear
from sgl_eagle_triton.reference.linear import linear as linear_ref


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a.float() - b.float()).norm() / b.float().norm().clamp_min(1e-30)).item()


def run_case(device, M, N, K, *, bias=False, norm=False, silu_mul=False, residual=False, x_fp32=False, seed=0,
             dtype=torch.bfloat16):
    """One call of ``linear`` against the twin; every tensor in ``dtype`` (the model's) but ``x`` with ``x_fp32``."""
    gen = torch.Generator().manual_seed(seed)

    def rand(*shape, scale=1.0, dtype=dtype):
        return (torch.randn(*shape, generator=gen) * scale).to(dtype).to(device)

    x = rand(M, K + 3, dtype=torch.float32 if x_fp32 else dtype)[:, :K]  # row stride > K
    w = rand(2 * N if silu_mul else N, K, scale=K**-0.5)
    kwargs = dict(
        bias=rand(N) if bias else None,
        norm_weight=rand(K) + 1 if norm else None,
        eps=1e-5,
        silu_mul=silu_mul,
        residual=rand(M, N) if residual else None,
    )
    out = torch.empty(M, N, dtype=dtype, device=device)
    out_sum = torch.empty(M, N, dtype=torch.float32, device=device) if residual else None
    linear(x, w, out, out_sum=out_sum, **kwargs)
    expected, expected_sum = linear_ref(x, w, **kwargs)
    assert expected.dtype == dtype
    assert rel_err(out, expected) < 1e-2
    if residual:
        assert rel_err(out_sum, expected_sum) < 1e-2


@pytest.mark.parametrize("M", [1, 5, 16, 37])
@pytest.mark.parametrize("N,K", [(24, 32), (100, 200)])
def test_plain(device, M, N, K):
    run_case(device, M, N, K)


@pytest.mark.parametrize(
    "flags",
    [
        dict(bias=True),
        dict(norm=True),
        dict(norm=True, x_fp32=True),
        dict(norm=True, silu_mul=True),
        dict(residual=True),
        dict(bias=True, residual=True),
    ],
    ids=lambda f: "-".join(f),
)
@pytest.mark.parametrize("M", [1, 20, 40])  # 40: many rows: separate RMSNorm, cuBLAS GEMM, epilogue kernel
def test_fused_variants(device, M, flags):
    run_case(device, M, 72, 96, **flags)


@pytest.mark.parametrize(
    "flags",
    [dict(), dict(norm=True, x_fp32=True, silu_mul=True), dict(bias=True, residual=True)],
    ids=lambda f: "-".join(f) or "plain",
)
@pytest.mark.parametrize("M", [5, 40])
def test_fp16(device, M, flags):
    """An fp16 model: the Triton GEMM and the cuBLAS path round to fp16 as the twin does."""
    run_case(device, M, 72, 96, dtype=torch.float16, **flags)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
@pytest.mark.parametrize("M", [1, 8, 64, 256])
@pytest.mark.parametrize(
    "N,K,flags",
    [
        (6144, 8192, {}),  # EAGLE-3 qkv over [embed; hidden]
        (4096, 4096, dict(residual=True)),  # o_proj + residual
        (14336, 4096, dict(norm=True, x_fp32=True, silu_mul=True)),  # gate_up
        (4096, 14336, dict(residual=True)),  # down_proj + residual
        (4096, 8192, dict(bias=True)),  # EAGLE-1 fc
    ],
)
def test_llama8b_draft_shapes(M, N, K, flags, dtype):
    run_case("cuda", M, N, K, dtype=dtype, **flags)


@pytest.mark.parametrize("M, N, K, silu, x_bytes, stages",
                         [(8, 14336, 4096, True, 4, 2), (8, 4096, 14336, False, 2, 4)])
def test_pipeline_depth_matches_the_h200_sweep(M, N, K, silu, x_bytes, stages):
    """The depth rule picks the best depth the H200 sweep found at 8B draft shapes (132 SMs, 227 KB; the
    sweep's many-row shapes now run on cuBLAS)."""
    from sgl_eagle_triton.kernels.device import DeviceInfo
    from sgl_eagle_triton.kernels.linear import _config, _num_stages

    h200 = DeviceInfo(sms=132, shared_per_block=232_448, capability=(9, 0))

    block_m, block_n, block_k, _ = _config(M, N)
    stage_bytes = block_m * block_k * x_bytes + (1 + silu) * block_n * block_k * 2
    programs = triton.cdiv(M, block_m) * triton.cdiv(N, block_n)
    assert _num_stages(programs, stage_bytes, h200) == stages
