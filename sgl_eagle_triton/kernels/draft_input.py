"""Input rows of a draft step: embedding gather, hidden gather and (EAGLE-3) the two input RMSNorms.

Row ``r`` of the step reads token ``input_ids[r]`` (target vocabulary) and the carried hidden state
``hidden[hidden_rows[r]]`` (the frontier's parent row, picked by the previous selection). It writes
``x[r] = [rms(embed[t]) * w_in, rms(h) * w_hidden]`` (EAGLE-3 midlayer input) or ``[embed[t], h]`` (EAGLE-1
``fc`` input), and for EAGLE-3 the residual ``h`` (the layer's residual stream starts at the hidden state).
One program per row; RMSNorm as SGLang computes it: fp32 ``x * rstd * w`` rounded to the model's dtype (bf16 or
fp16, that of every tensor here but the ids), with
:func:`sgl_eagle_triton.kernels.rms_norm.rstd` (the kernels' one rounding rule).
"""

import torch
import triton
import triton.language as tl

from sgl_eagle_triton.kernels.pdl import pdl_args, wait_for_prior
from sgl_eagle_triton.kernels.rms_norm import rstd
from sgl_eagle_triton.kernels.rounding import MODEL_DTYPES, round_to, tl_dtype


@triton.jit
def _rms_inv(src, H: tl.constexpr, eps, BLOCK: tl.constexpr):
    """``1 / sqrt(mean(src[:H]^2) + eps)`` of one row (fp32, :func:`rstd`)."""
    sum_sq = tl.zeros([BLOCK], dtype=tl.float32)
    for h0 in range(0, H, BLOCK):
        cols = h0 + tl.arange(0, BLOCK)
        v = tl.load(src + cols, mask=cols < H, other=0.0).to(tl.float32)
        sum_sq += v * v
    return rstd(tl.sum(sum_sq, axis=0), H, eps)


@triton.jit
def _draft_input_kernel(
    input_ids_ptr,
    embed_ptr,
    hidden_ptr,
    stride_hidden,
    hidden_rows_ptr,
    x_ptr,
    residual_ptr,
    input_norm_ptr,
    hidden_norm_ptr,
    eps,
    H: tl.constexpr,
    NORM: tl.constexpr,
    BLOCK: tl.constexpr,
    DTYPE: tl.constexpr,
    USE_GDC: tl.constexpr,
):
    wait_for_prior(USE_GDC)
    r = tl.program_id(0).to(tl.int64)
    token = tl.load(input_ids_ptr + r).to(tl.int64)
    emb = embed_ptr + token * H
    hid = hidden_ptr + tl.load(hidden_rows_ptr + r).to(tl.int64) * stride_hidden
    x_row = x_ptr + r * (2 * H)
    if NORM:
        inv_e = _rms_inv(emb, H, eps, BLOCK)
        inv_h = _rms_inv(hid, H, eps, BLOCK)
    for h0 in range(0, H, BLOCK):
        cols = h0 + tl.arange(0, BLOCK)
        ok = cols < H
        e = tl.load(emb + cols, mask=ok, other=0.0)
        h = tl.load(hid + cols, mask=ok, other=0.0)
        if NORM:
            tl.store(residual_ptr + r * H + cols, h, mask=ok)
            w_e = tl.load(input_norm_ptr + cols, mask=ok, other=0.0).to(tl.float32)
            w_h = tl.load(hidden_norm_ptr + cols, mask=ok, other=0.0).to(tl.float32)
            e = round_to(e.to(tl.float32) * inv_e * w_e, DTYPE)
            h = round_to(h.to(tl.float32) * inv_h * w_h, DTYPE)
        tl.store(x_row + cols, e, mask=ok)
        tl.store(x_row + H + cols, h, mask=ok)


def draft_input(
    input_ids: torch.Tensor,
    embed: torch.Tensor,
    hidden: torch.Tensor,
    hidden_rows: torch.Tensor,
    x: torch.Tensor,
    *,
    residual: torch.Tensor | None = None,
    input_norm: torch.Tensor | None = None,
    hidden_norm: torch.Tensor | None = None,
    eps: float = 0.0,
) -> torch.Tensor:
    """Fill ``x [R, 2H]`` (and ``residual [R, H]`` with the norms) for ``R = input_ids.numel()`` rows.

    input_ids: [R] int (target ids); embed: [V, H] bf16 or fp16, contiguous; hidden: [*, H] (unit column
    stride); hidden_rows: [R] int (row of ``hidden`` per step row); input_norm / hidden_norm: [H], both or
    neither (EAGLE-3 vs EAGLE-1); every float tensor in the embedding's dtype. Returns ``x``.
    """
    R = input_ids.numel()
    H = embed.shape[1]
    norm = input_norm is not None
    assert norm == (hidden_norm is not None) == (residual is not None)
    assert x.shape[1] == 2 * H and x.is_contiguous() and hidden.stride(1) == 1
    assert embed.dtype in MODEL_DTYPES
    assert all(t is None or t.dtype == embed.dtype for t in (hidden, x, residual, input_norm, hidden_norm))
    _draft_input_kernel[(R,)](
        input_ids,
        embed,
        hidden,
        hidden.stride(0),
        hidden_rows,
        x,
        residual if norm else x,
        input_norm if norm else x,
        hidden_norm if norm else x,
        eps,
        H=H,
        NORM=norm,
        BLOCK=min(1024, triton.next_power_of_2(H)),
        DTYPE=tl_dtype(x.dtype),
        **pdl_args(x.device),
        num_warps=4,
    )
    return x
