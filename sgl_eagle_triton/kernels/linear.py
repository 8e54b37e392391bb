"""Skinny linear layer of the fused drafter: ``out = epilogue(prologue(x) @ weight.T)``.

The draft forward multiplies a few rows (``batch * topk``) by weight matrices of tens to hundreds of MB, so
it is bound by reading the weight once. The grid splits the output columns finely enough that every SM
streams its own slice of the weight; each program keeps its rows of ``x`` (a few KB) hot in L1/L2.

All tensors but fp32 ones are in the model's dtype (bf16 or fp16, one per call; "rounded" below means to it).

Prologue (optional): RMSNorm of ``x`` with ``norm_weight``, computed in fp32 and rounded per element as
SGLang's RMSNorm does; every program recomputes its rows' ``rstd`` (one extra pass over ``x``;
:func:`sgl_eagle_triton.kernels.rms_norm.rstd`, the kernels' one rounding rule).
From ``CUBLAS_MIN_ROWS`` rows on (the draft at large batch x topk) the layer is no longer skinny: a kernel
normalises ``x`` once, cuBLAS runs the GEMM and one kernel applies the epilogues (``_linear_cublas``).
Epilogues, all after rounding the fp32 accumulator (SGLang's GEMM output):
``bias`` (added in fp32 before rounding, as a cuBLAS bias epilogue does), ``silu_mul`` (``weight`` holds
``[gate; up]`` of ``2 * N`` rows, ``out = silu(gate) * up`` in fp32, rounded), ``residual``
(``out = rnd(y + residual)``; ``out_sum`` optionally receives the unrounded fp32 sum, which SGLang's fused
add-RMSNorm normalises).
"""

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from sgl_eagle_triton.kernels.device import (
    CUBLAS_MIN_ROWS,
    DeviceInfo,
    device_info,
    pipeline_budget,
    stage_bytes,
    warps,
)
from sgl_eagle_triton.kernels.pdl import pdl_args, wait_for_prior
from sgl_eagle_triton.kernels.rms_norm import rms_norm, rstd
from sgl_eagle_triton.kernels.rounding import MODEL_DTYPES, mma, round_to, tl_dtype


@triton.jit
def _linear_kernel(
    x_ptr,
    stride_x,
    w_ptr,
    bias_ptr,
    norm_w_ptr,
    res_ptr,
    stride_res,
    out_ptr,
    stride_out,
    sum_ptr,
    M,
    N,
    eps,
    K: tl.constexpr,
    NORM: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    SILU_MUL: tl.constexpr,
    ADD_RESIDUAL: tl.constexpr,
    WRITE_SUM: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    DTYPE: tl.constexpr,
    USE_GDC: tl.constexpr,
):
    wait_for_prior(USE_GDC)
    pid_m = tl.program_id(0)  # row tiles sharing a weight tile run side by side: it is read from HBM once
    pid_n = tl.program_id(1)
    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    row_ok = rows < M
    col_ok = cols < N
    x_rows = x_ptr + rows.to(tl.int64)[:, None] * stride_x
    w_rows = w_ptr + cols.to(tl.int64)[:, None] * K

    if NORM:
        # Four loads in flight per trip: this pass runs before any weight is read, so its latency is a bubble
        # in the weight stream (32 dependent round trips at K 4096). Same summation order as one at a time.
        sum_sq = tl.zeros([BLOCK_M], dtype=tl.float32)
        for k0 in range(0, K, 4 * BLOCK_K):
            for j in tl.static_range(4):
                ks = k0 + j * BLOCK_K + tl.arange(0, BLOCK_K)
                xv = tl.load(x_rows + ks[None, :], mask=row_ok[:, None] & (ks < K)[None, :], other=0.0)
                sum_sq += tl.sum(xv.to(tl.float32) * xv.to(tl.float32), axis=1)
        inv = rstd(sum_sq, K, eps)

    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    if SILU_MUL:
        acc_up = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        ks = k0 + tl.arange(0, BLOCK_K)
        k_ok = ks < K
        xv = tl.load(x_rows + ks[None, :], mask=row_ok[:, None] & k_ok[None, :], other=0.0)
        if NORM:
            nw = tl.load(norm_w_ptr + ks, mask=k_ok, other=0.0).to(tl.float32)
            xv = round_to(xv.to(tl.float32) * inv[:, None] * nw[None, :], DTYPE)
        elif xv.dtype != DTYPE:
            xv = round_to(xv.to(tl.float32), DTYPE)  # an x in the model's dtype goes to the MMA as loaded
        wv = tl.load(w_rows + ks[None, :], mask=col_ok[:, None] & k_ok[None, :], other=0.0)
        acc = mma(xv, tl.trans(wv), acc)
        if SILU_MUL:
            wu = tl.load(w_rows + N * K + ks[None, :], mask=col_ok[:, None] & k_ok[None, :], other=0.0)
            acc_up = mma(xv, tl.trans(wu), acc_up)

    if HAS_BIAS:
        acc += tl.load(bias_ptr + cols, mask=col_ok, other=0.0).to(tl.float32)[None, :]
    y = round_to(acc, DTYPE)
    up = round_to(acc_up, DTYPE) if SILU_MUL else y
    _store_epilogue(y, up, rows, cols, row_ok[:, None] & col_ok[None, :], res_ptr, stride_res, out_ptr,
                    stride_out, sum_ptr, N, SILU_MUL, ADD_RESIDUAL, WRITE_SUM, DTYPE)


@triton.jit
def _store_epilogue(y, up, rows, cols, ok, res_ptr, stride_res, out_ptr, stride_out, sum_ptr, N,
                    SILU_MUL: tl.constexpr, ADD_RESIDUAL: tl.constexpr, WRITE_SUM: tl.constexpr, DTYPE: tl.constexpr):
    """The epilogues on a tile of GEMM outputs ``y`` in ``DTYPE`` (``up``: the up half with ``SILU_MUL``), stored."""
    y = y.to(tl.float32)
    if SILU_MUL:
        y = round_to(y / (1.0 + tl.exp(-y)) * up.to(tl.float32), DTYPE).to(tl.float32)
    if ADD_RESIDUAL:
        res = tl.load(res_ptr + rows.to(tl.int64)[:, None] * stride_res + cols[None, :], mask=ok, other=0.0)
        y = y + res.to(tl.float32)
        if WRITE_SUM:
            tl.store(sum_ptr + rows.to(tl.int64)[:, None] * N + cols[None, :], y, mask=ok)
    tl.store(out_ptr + rows.to(tl.int64)[:, None] * stride_out + cols[None, :], round_to(y, DTYPE), mask=ok)


@triton.jit
def _epilogue_kernel(y_ptr, stride_y, res_ptr, stride_res, out_ptr, stride_out, sum_ptr, M, N,
                     SILU_MUL: tl.constexpr, ADD_RESIDUAL: tl.constexpr, WRITE_SUM: tl.constexpr,
                     BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, DTYPE: tl.constexpr):
    """The epilogues after a cuBLAS GEMM: ``y [M, N]`` (``[M, 2N]``, gate then up, with ``SILU_MUL``) in ``DTYPE``."""
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    ok = (rows < M)[:, None] & (cols < N)[None, :]
    y_rows = y_ptr + rows.to(tl.int64)[:, None] * stride_y
    y = tl.load(y_rows + cols[None, :], mask=ok, other=0.0)
    up = tl.load(y_rows + N + cols[None, :], mask=ok, other=0.0) if SILU_MUL else y
    _store_epilogue(y, up, rows, cols, ok, res_ptr, stride_res, out_ptr, stride_out, sum_ptr, N,
                    SILU_MUL, ADD_RESIDUAL, WRITE_SUM, DTYPE)


def _config(M: int, N: int, K: int, silu_mul: bool, x_bytes: int, gpu: DeviceInfo) -> tuple[int, int, int, int]:
    """``(BLOCK_M, BLOCK_N, BLOCK_K, num_warps)`` for up to ``CUBLAS_MIN_ROWS - 1`` rows: one 16/32-row tile,
    32 columns per program (64 where 64-column programs still outnumber the SMs), BLOCK_K 128. Where the grid is
    at most one wave (a tensor-parallel shard, or N 4096 on 132 SMs) one program per SM must keep more bytes in
    flight: deeper K tiles, up to 512 (256 with ``silu_mul``: two weight tiles and an fp32 x), as long as K holds
    six of them and three pipeline stages fit in shared memory (an MI300X's 64 KB of LDS: BLOCK_K 128 always).
    128 threads a program (4 warps; 2 wavefronts on AMD). On the H100 / H200 sweeps of the 8B draft's shards
    at TP 1 / 2 / 4 this picks the best tile or one within 3.2 % of it, but at TP 4's o_proj (K 1024: 6 %, as the
    rule before; bench/results/*-sweep-linear-tp*.json, tests/test_linear.py)."""
    block_m = 16 if M <= 16 else 32
    block_n = 64 if triton.cdiv(N, 32) > 2 * gpu.sms else 32
    block_k = 128
    if block_n == 32 and triton.cdiv(N, block_n) <= gpu.sms:
        block_k = 256 if silu_mul else 512
        while block_k > 128 and (K < 6 * block_k or 3 * stage_bytes(block_m, block_n, block_k, x_bytes, 1 + silu_mul)
                                 > pipeline_budget(gpu)):
            block_k //= 2
    return block_m, block_n, block_k, warps(gpu, 128)


def _num_stages(programs: int, stage: int, gpu: DeviceInfo) -> int:
    """Pipeline depth: as deep as shared memory allows (at most 4) while every program of the grid is resident
    at once (programs per SM = ``cdiv(programs, SMs)`` share an SM's shared memory), but at least 2. This rule
    gives the best depth of an H200 sweep at all six 8B draft shapes tried (results/*-linear-sweep.json)."""
    budget = pipeline_budget(gpu)
    resident = budget // (triton.cdiv(programs, gpu.sms) * stage)
    return max(1, min(4, budget // stage, max(2, resident)))


def linear(
    x: torch.Tensor,
    weight: torch.Tensor,
    out: torch.Tensor,
    *,
    bias: torch.Tensor | None = None,
    norm_weight: torch.Tensor | None = None,
    eps: float = 0.0,
    silu_mul: bool = False,
    residual: torch.Tensor | None = None,
    out_sum: torch.Tensor | None = None,
) -> torch.Tensor:
    """``out [M, N] = epilogue(prologue(x) @ weight.T)`` (see the module docstring), in the weight's dtype.

    weight: [N, K] bf16 or fp16, contiguous (``[2N, K]`` with ``silu_mul``); x: [M, K] in the weight's dtype
    or fp32 (row stride free, unit column stride); bias: [N]; norm_weight: [K]; residual: [M, N] (unit column
    stride); out_sum: [M, N] fp32 contiguous; bias, norm_weight, residual and out in the weight's dtype.
    Returns ``out``.
    """
    M, K = x.shape
    N = out.shape[1]
    dtype = weight.dtype
    assert weight.shape == ((2 * N if silu_mul else N), K) and weight.is_contiguous()
    assert dtype in MODEL_DTYPES and x.dtype in (dtype, torch.float32) and out.dtype == dtype
    assert all(t is None or t.dtype == dtype for t in (bias, norm_weight, residual))
    assert x.stride(1) == 1 and out.stride(1) == 1
    assert out_sum is None or residual is not None, "out_sum is the residual epilogue's fp32 sum"
    if M >= CUBLAS_MIN_ROWS:
        return _linear_cublas(x, weight, out, bias, norm_weight, eps, silu_mul, residual, out_sum)
    gpu = device_info(x.device)
    block_m, block_n, block_k, num_warps = _config(M, N, K, silu_mul, x.element_size(), gpu)
    grid = (triton.cdiv(M, block_m), triton.cdiv(N, block_n))
    stage = stage_bytes(block_m, block_n, block_k, x.element_size(), 1 + silu_mul)
    num_stages = _num_stages(grid[0] * grid[1], stage, gpu)
    dummy = out
    _linear_kernel[grid](
        x,
        x.stride(0),
        weight,
        bias if bias is not None else dummy,
        norm_weight if norm_weight is not None else dummy,
        residual if residual is not None else dummy,
        residual.stride(0) if residual is not None else 0,
        out,
        out.stride(0),
        out_sum if out_sum is not None else dummy,
        M,
        N,
        eps,
        K=K,
        NORM=norm_weight is not None,
        HAS_BIAS=bias is not None,
        SILU_MUL=silu_mul,
        ADD_RESIDUAL=residual is not None,
        WRITE_SUM=out_sum is not None,
        BLOCK_M=block_m,
        BLOCK_N=block_n,
        BLOCK_K=block_k,
        DTYPE=tl_dtype(dtype),
        **pdl_args(x.device),
        num_warps=num_warps,
        num_stages=num_stages,
    )
    return out


def _linear_cublas(x, weight, out, bias, norm_weight, eps, silu_mul, residual, out_sum):
    """Many rows: ``x`` normalised (or rounded to the weight's dtype) once, the GEMM by cuBLAS (output in that
    dtype, bias in its epilogue: SGLang's own draft layer makes these very calls), then the other epilogues in
    one kernel."""
    z = rms_norm(x, norm_weight, eps) if norm_weight is not None else x.to(weight.dtype)
    y = F.linear(z, weight, bias)
    if not silu_mul and residual is None:
        return out.copy_(y)
    return epilogue(y, out, residual=residual, out_sum=out_sum, silu_mul=silu_mul)


def epilogue(y: torch.Tensor, out: torch.Tensor, *, residual: torch.Tensor | None = None,
             out_sum: torch.Tensor | None = None, silu_mul: bool = False) -> torch.Tensor:
    """:func:`linear`'s epilogues on a GEMM output already rounded to the model's dtype, in one kernel: ``y [M, N]``
    (``[M, 2N]``, gate then up, with ``silu_mul``; unit column stride) in ``out``'s dtype; ``residual [M, N]`` in
    that dtype (unit column stride), ``out_sum [M, N]`` fp32 contiguous (the unrounded ``y + residual``).
    Also the row-parallel draft linears' epilogue under tensor parallelism, after the all-reduce of ``y``."""
    M, N = out.shape
    assert y.dtype == out.dtype and y.stride(1) == 1 and out.stride(1) == 1
    assert residual is None or (residual.dtype == out.dtype and residual.stride(1) == 1)
    assert out_sum is None or (residual is not None and out_sum.dtype == torch.float32 and out_sum.is_contiguous())
    block_m, block_n = 16, 128
    num_warps = warps(device_info(out.device), 128)
    _epilogue_kernel[(triton.cdiv(M, block_m), triton.cdiv(N, block_n))](
        y, y.stride(0), residual if residual is not None else out, residual.stride(0) if residual is not None else 0,
        out, out.stride(0), out_sum if out_sum is not None else out, M, N,
        SILU_MUL=silu_mul, ADD_RESIDUAL=residual is not None, WRITE_SUM=out_sum is not None,
        BLOCK_M=block_m, BLOCK_N=block_n, DTYPE=tl_dtype(out.dtype), num_warps=num_warps,
    )
    return out
