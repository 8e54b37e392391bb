"""Attention of one EAGLE draft-decode step: RoPE, the chain KV write and split-KV flash decoding.

Row ``r`` (request ``b = r // topk``) attends the way SGLang's draft decode does (the KV span of
``generate_draft_decode_kv_indices``; this is not tree attention): over its request's prefix
``req_to_token[req_pool_indices[b], :L_b]`` in the draft layer's KV pool, then over its own chain
``chain_k/v[0 .. step, r]``, which includes the current step's k and v.

Two kernels. Their grids depend only on (bs, topk, model dims), so the op is CUDA-graph safe:

1. ``_prefix_kernel``, grid ``(bs, Hkv, SPLIT)``: one program per request, kv head and prefix chunk. Its
   query tile stacks the ``topk`` rows x ``Hq / Hkv`` query heads that share the kv head, so each prefix
   K/V block is read once per request, not once per row. It writes the chunk's unnormalised softmax
   partial (max, sum, accumulator) to fp32 scratch. Chunk ``s`` is ``[s * C, (s + 1) * C)``, where
   ``C = cdiv(L_b, SPLIT)`` is rounded up to ``BLOCK_N``. A chunk that starts at or past ``L_b`` loads
   no key and writes the neutral partial ``(-inf, 0, 0)``.
2. ``_chain_merge_kernel``, grid ``(R, Hkv)``: ropes the row's k and stores it and v at
   ``chain[step, r]``. It then attends over chain entries ``0 .. step`` and merges in the ``SPLIT``
   prefix partials.

``SPLIT`` is the power of two that gives kernel 1 about two waves over the SMs (:func:`num_splits`).
Scores are kept in the log2 domain (``scale * log2(e)`` folded in, ``exp2``). Both kernels round the
roped q and k to the model's dtype (bf16 or fp16: that of qkv and the output) before the dot. The
probabilities enter kernel 1's P.V product in that dtype, as in flash attention; everything else is fp32.

FP8 KV cache (the pool and the chain in ``float8_e4m3fn`` or ``float8_e5m2``, SGLang's
``--kv-cache-dtype fp8_e4m3 / fp8_e5m2``): keys and values stay in their quantised units, exactly representable
in the model's dtype, and the layer's scales are applied once: ``k_scale`` to the scores, ``v_scale`` to the
output. The chain entries are quantised as SGLang stores the draft's own KV (``set_kv_buffer``): the model-dtype
k (v) divided by its scale, rounded to the model's dtype, then to the FP8 format, so that our draft steps see the
cache SGLang's draft decode would see.
"""

import math

import torch
import triton
import triton.language as tl

from sgl_eagle_triton.kernels.device import ATTENTION_MAX_SPLIT, ATTENTION_WAVES, device_info, warps
from sgl_eagle_triton.kernels.pdl import pdl_args, wait_for_prior
from sgl_eagle_triton.kernels.rounding import FP8_KV_DTYPES, MODEL_DTYPES, mma, round_to, tl_dtype


@triton.jit
def _roped(x_ptr, head_offs, pos, cos_sin_ptr, cos_sin_stride, D: tl.constexpr, DTYPE: tl.constexpr):
    """Neox RoPE of the ``D``-wide heads at ``x_ptr + head_offs`` for positions ``pos``.

    ``head_offs`` and ``pos`` are ``[ROWS, 1]`` tensors or scalars. Returns ``[ROWS, D]`` (``[1, D]`` for
    scalars): fp32 math, rounded to ``DTYPE``.
    """
    HALF: tl.constexpr = D // 2
    d = tl.arange(0, D)[None, :]
    x = tl.load(x_ptr + head_offs + d).to(tl.float32)
    partner = tl.load(x_ptr + head_offs + (d + HALF) % D).to(tl.float32)
    cos = tl.load(cos_sin_ptr + pos * cos_sin_stride + d % HALF)
    sin = tl.load(cos_sin_ptr + pos * cos_sin_stride + HALF + d % HALF)
    # First half x1 * cos - x2 * sin, second half x2 * cos + x1 * sin.
    return round_to(x * cos + tl.where(d < HALF, -partner, partner) * sin, DTYPE)


@triton.jit
def _prefix_kernel(
    qkv_ptr,
    qkv_stride,
    positions_ptr,
    cos_sin_ptr,
    cos_sin_stride,
    k_cache_ptr,
    v_cache_ptr,
    slot_stride,
    head_stride,
    req_to_token_ptr,
    req_stride,
    req_pool_indices_ptr,
    seq_lens_ptr,
    part_acc_ptr,
    part_ml_ptr,
    qk_scale,
    TOPK: tl.constexpr,
    GROUP: tl.constexpr,
    HQ: tl.constexpr,
    D: tl.constexpr,
    SPLIT: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    DTYPE: tl.constexpr,
    USE_GDC: tl.constexpr,
):
    wait_for_prior(USE_GDC)
    b = tl.program_id(0).to(tl.int64)
    kv_head = tl.program_id(1)
    split = tl.program_id(2)
    req = tl.load(req_pool_indices_ptr + b)
    seq_len = tl.load(seq_lens_ptr + b)
    chunk = tl.cdiv(tl.cdiv(seq_len, SPLIT), BLOCK_N) * BLOCK_N
    start = split * chunk
    end = tl.minimum(start + chunk, seq_len)

    # Tile row m: branch slot m // GROUP, query head kv_head * GROUP + m % GROUP. Rows past TOPK * GROUP
    # (padding up to BLOCK_M) repeat the last slot and are not stored.
    m = tl.arange(0, BLOCK_M)
    row = b * TOPK + tl.minimum(m // GROUP, TOPK - 1)
    head = kv_head * GROUP + m % GROUP
    pos = tl.load(positions_ptr + row)
    q = _roped(qkv_ptr, (row * qkv_stride + head * D)[:, None], pos[:, None], cos_sin_ptr, cos_sin_stride, D, DTYPE)

    d = tl.arange(0, D)[None, :]
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, D], tl.float32)
    # A while loop: the interpreter cannot take tensor bounds in range(). Each block's slot ids are
    # loaded one iteration ahead, so the K/V gathers do not wait on them.
    token_row = req_to_token_ptr + req * req_stride
    n0 = start
    n = n0 + tl.arange(0, BLOCK_N)
    slots = tl.load(token_row + n, mask=n < end, other=0).to(tl.int64)
    while n0 < end:
        in_chunk = n < end
        kv_offs = slots[:, None] * slot_stride + kv_head * head_stride + d
        # An FP8 pool's values are exact in the model's dtype (its scales are applied outside).
        k = tl.load(k_cache_ptr + kv_offs, mask=in_chunk[:, None], other=0.0).to(DTYPE)
        v = tl.load(v_cache_ptr + kv_offs, mask=in_chunk[:, None], other=0.0).to(DTYPE)
        n0 += BLOCK_N
        n = n0 + tl.arange(0, BLOCK_N)
        slots = tl.load(token_row + n, mask=n < end, other=0).to(tl.int64)
        s = mma(q, tl.trans(k), tl.zeros([BLOCK_M, BLOCK_N], tl.float32)) * qk_scale
        s = tl.where(in_chunk[None, :], s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        alpha = tl.exp2(m_i - m_new)
        p = tl.exp2(s - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = mma(round_to(p, DTYPE), v, acc * alpha[:, None])
        m_i = m_new

    part = (row * HQ + head) * SPLIT + split
    stored = m < TOPK * GROUP
    tl.store(part_ml_ptr + 2 * part, m_i, mask=stored)
    tl.store(part_ml_ptr + 2 * part + 1, l_i, mask=stored)
    tl.store(part_acc_ptr + part[:, None] * D + d, acc, mask=stored[:, None])


@triton.jit
def _chain_merge_kernel(
    qkv_ptr,
    qkv_stride,
    positions_ptr,
    cos_sin_ptr,
    cos_sin_stride,
    chain_k_ptr,
    chain_v_ptr,
    chain_step_stride,
    chain_row_stride,
    chain_head_stride,
    part_acc_ptr,
    part_ml_ptr,
    out_ptr,
    out_stride,
    qk_scale,
    k_scale,
    v_scale,
    step,
    GROUP: tl.constexpr,
    HQ: tl.constexpr,
    HKV: tl.constexpr,
    D: tl.constexpr,
    SPLIT: tl.constexpr,
    BLOCK_G: tl.constexpr,
    DTYPE: tl.constexpr,
    KV_DTYPE: tl.constexpr,
    USE_GDC: tl.constexpr,
):
    wait_for_prior(USE_GDC)
    row = tl.program_id(0).to(tl.int64)
    kv_head = tl.program_id(1)
    g = tl.arange(0, BLOCK_G)
    head = kv_head * GROUP + tl.minimum(g, GROUP - 1)
    pos = tl.load(positions_ptr + row)
    qkv_row = qkv_ptr + row * qkv_stride
    q = _roped(qkv_row, (head * D)[:, None], pos, cos_sin_ptr, cos_sin_stride, D, DTYPE).to(tl.float32)
    k = _roped(qkv_row, (HQ + kv_head) * D, pos, cos_sin_ptr, cos_sin_stride, D, DTYPE)
    d = tl.arange(0, D)[None, :]
    v = tl.load(qkv_row + (HQ + HKV + kv_head) * D + d)
    if KV_DTYPE != DTYPE:  # as SGLang stores a quantised entry: (x / scale) in the model's dtype, then FP8
        k = round_to(round_to(k.to(tl.float32) / k_scale, DTYPE).to(tl.float32), KV_DTYPE)
        v = round_to(round_to(v.to(tl.float32) / v_scale, DTYPE).to(tl.float32), KV_DTYPE)
    chain = row * chain_row_stride + kv_head * chain_head_stride + d
    tl.store(chain_k_ptr + step * chain_step_stride + chain, k)
    tl.store(chain_v_ptr + step * chain_step_stride + chain, v)

    # The current entry opens the softmax (max = its score, sum = 1, acc = v); then the earlier steps.
    m_i = tl.sum(q * k.to(tl.float32), 1) * qk_scale
    l_i = tl.full([BLOCK_G], 1.0, tl.float32)
    acc = tl.broadcast_to(v.to(tl.float32), [BLOCK_G, D])
    i = 0
    while i < step:  # (not range(): the interpreter passes ``step`` as a tensor)
        k_i = tl.load(chain_k_ptr + i * chain_step_stride + chain).to(tl.float32)
        v_i = tl.load(chain_v_ptr + i * chain_step_stride + chain).to(tl.float32)
        i += 1
        s = tl.sum(q * k_i, 1) * qk_scale
        m_new = tl.maximum(m_i, s)
        alpha = tl.exp2(m_i - m_new)
        p = tl.exp2(s - m_new)
        l_i = l_i * alpha + p
        acc = acc * alpha[:, None] + p[:, None] * v_i
        m_i = m_new

    # m_i is finite here, so neutral partials (max -inf) get weight 0. Unrolled: the partials' loads do not
    # depend on each other and issue together instead of one dependent round trip per split.
    part = (row * HQ + head) * SPLIT
    for split in tl.static_range(SPLIT):
        m_s = tl.load(part_ml_ptr + 2 * (part + split))
        l_s = tl.load(part_ml_ptr + 2 * (part + split) + 1)
        acc_s = tl.load(part_acc_ptr + (part + split)[:, None] * D + d)
        m_new = tl.maximum(m_i, m_s)
        alpha = tl.exp2(m_i - m_new)
        beta = tl.exp2(m_s - m_new)
        l_i = l_i * alpha + l_s * beta
        acc = acc * alpha[:, None] + acc_s * beta[:, None]
        m_i = m_new

    out = round_to(acc / l_i[:, None] * v_scale, DTYPE)  # v_scale: 1 unless the values are quantised
    tl.store(out_ptr + row * out_stride + head[:, None] * D + d, out, mask=(g < GROUP)[:, None])


def num_splits(bs: int, num_kv_heads: int, device: torch.device) -> int:
    """Prefix chunks per (request, kv head): the power of two that gives ``bs * Hkv * SPLIT`` at least
    ``ATTENTION_WAVES`` waves over the SMs, at most ``ATTENTION_MAX_SPLIT``. Depends on no tensor value."""
    waves = ATTENTION_WAVES * device_info(device).sms
    return min(ATTENTION_MAX_SPLIT, triton.next_power_of_2(triton.cdiv(waves, bs * num_kv_heads)))


def draft_attention(
    qkv: torch.Tensor,
    positions: torch.Tensor,
    cos_sin_cache: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    req_to_token: torch.Tensor,
    req_pool_indices: torch.Tensor,
    seq_lens: torch.Tensor,
    chain_k: torch.Tensor,
    chain_v: torch.Tensor,
    step: int,
    topk: int,
    num_q_heads: int,
    num_kv_heads: int,
    head_dim: int,
    scale: float,
    out: torch.Tensor,
    k_scale: float = 1.0,
    v_scale: float = 1.0,
) -> torch.Tensor:
    """Draft-decode attention of ``R = bs * topk`` rows (row ``r`` belongs to request ``r // topk``).
    Writes ``out`` and ``chain_k/v[step, :R]`` and returns ``out``.

    Inputs (``Hq, Hkv, D`` = ``num_q_heads, num_kv_heads, head_dim``; ``D`` a power of two >= 16; every
    bf16 / fp16 tensor below in one dtype, the model's):
        qkv              [R, (Hq + 2 Hkv) D] bf16 or fp16: raw (pre-RoPE) q heads, k heads, v heads; any row stride.
        positions        [R] int64: position of each row's token (``L_b + step``).
        cos_sin_cache    [max_pos, D] fp32: cos in columns ``< D / 2``, sin after (neox RoPE over all of D).
        k_cache, v_cache [slots, Hkv, D] model dtype, or float8_e4m3fn / float8_e5m2 (an FP8 pool): the draft
                         layer's KV pool (prefix KV, already roped); ``k_scale`` / ``v_scale``: the layer's scales
                         of an FP8 pool (1 without scales; ignored otherwise).
        req_to_token     [reqs, ctx] int32; req_pool_indices [bs] int64; seq_lens [bs] int64 (``L_b``).
        chain_k, chain_v [S_max, R_max, Hkv, D] the pool's dtype: per-row chain, entries ``0 .. step - 1``
                         already written.
    Output:
        out              [R, Hq D] bf16 / fp16: q head ``h`` attends with kv head ``h // (Hq / Hkv)`` over the
                         prefix, then chain entries ``0 .. step``; scores times ``scale``, fp32 softmax.
    ``chain_k/v[step, r]`` receive row ``r``'s roped k and its v.

    CUDA-graph safe: no host sync. Grids ``(bs, Hkv, SPLIT)`` and ``(R, Hkv)``, where ``SPLIT =
    num_splits(bs, Hkv, device)``. Scratch: ``torch.empty`` fp32 ``[R, Hq, SPLIT, D]`` and
    ``[R, Hq, SPLIT, 2]``.
    """
    bs = req_pool_indices.shape[0]
    rows = bs * topk
    group = num_q_heads // num_kv_heads
    assert group * num_kv_heads == num_q_heads and head_dim >= 16 and head_dim & (head_dim - 1) == 0
    assert qkv.shape == (rows, (num_q_heads + 2 * num_kv_heads) * head_dim) and qkv.stride(1) == 1
    assert out.shape == (rows, num_q_heads * head_dim) and out.stride(1) == 1
    assert positions.shape == (rows,) and cos_sin_cache.shape[1] == head_dim and cos_sin_cache.is_contiguous()
    assert cos_sin_cache.dtype == torch.float32
    assert qkv.dtype in MODEL_DTYPES and out.dtype == qkv.dtype
    assert k_cache.dtype in (qkv.dtype, *FP8_KV_DTYPES) and all(
        t.dtype == k_cache.dtype for t in (v_cache, chain_k, chain_v))
    quantised = k_cache.dtype != qkv.dtype
    assert k_cache.stride() == v_cache.stride() and k_cache.stride(2) == 1 and req_to_token.stride(1) == 1
    assert chain_k.stride() == chain_v.stride() and chain_k.stride(3) == 1
    assert 0 <= step < chain_k.shape[0] and rows <= chain_k.shape[1]
    split = num_splits(bs, num_kv_heads, qkv.device)
    gpu = device_info(qkv.device)
    part_acc = torch.empty(rows, num_q_heads, split, head_dim, dtype=torch.float32, device=qkv.device)
    part_ml = torch.empty(rows, num_q_heads, split, 2, dtype=torch.float32, device=qkv.device)
    qk_scale = scale * math.log2(math.e) * (k_scale if quantised else 1.0)
    rope = (qkv, qkv.stride(0), positions, cos_sin_cache, cos_sin_cache.stride(0))

    block_m = max(16, triton.next_power_of_2(topk * group))  # tl.dot needs >= 16 rows
    _prefix_kernel[(bs, num_kv_heads, split)](
        *rope,
        k_cache,
        v_cache,
        k_cache.stride(0),
        k_cache.stride(1),
        req_to_token,
        req_to_token.stride(0),
        req_pool_indices,
        seq_lens,
        part_acc,
        part_ml,
        qk_scale,
        TOPK=topk,
        GROUP=group,
        HQ=num_q_heads,
        D=head_dim,
        SPLIT=split,
        BLOCK_M=block_m,
        BLOCK_N=min(64, max(16, head_dim // 2)),  # 64 keys at D >= 128; small D (tests) gets several blocks
        DTYPE=tl_dtype(qkv.dtype),
        **pdl_args(qkv.device),
        num_warps=warps(gpu, 128 if block_m <= 64 else 256),  # 4 / 8 warps, 2 / 4 wavefronts
    )
    _chain_merge_kernel[(rows, num_kv_heads)](
        *rope,
        chain_k,
        chain_v,
        chain_k.stride(0),
        chain_k.stride(1),
        chain_k.stride(2),
        part_acc,
        part_ml,
        out,
        out.stride(0),
        qk_scale,
        k_scale if quantised else 1.0,
        v_scale if quantised else 1.0,
        step,
        GROUP=group,
        HQ=num_q_heads,
        HKV=num_kv_heads,
        D=head_dim,
        SPLIT=split,
        BLOCK_G=triton.next_power_of_2(group),
        DTYPE=tl_dtype(qkv.dtype),
        KV_DTYPE=tl_dtype(k_cache.dtype),
        **pdl_args(qkv.device),
        num_warps=warps(gpu, 64),
    )
    return out
