"""Attention of the target's verify forward: each request's draft tokens over its paged prefix and its tree.

Request ``b`` has ``n_b = qo_indptr[b + 1] - qo_indptr[b]`` draft tokens (rows ``qo_indptr[b] ..`` of ``q``,
``k_extend``, ``v_extend``) and a prefix of ``L_b = kv_indptr[b + 1] - kv_indptr[b]`` tokens whose KV-pool slots are
``kv_indices[kv_indptr[b] ..]``. Draft token ``i`` attends every prefix token and the draft tokens ``j`` its tree
allows: ``custom_mask[mask_indptr[b] + i * (L_b + n_b) + L_b + j]`` (SGLang's target-verify mask: one row of
``L_b + n_b`` per draft token, the prefix columns ignored, as SGLang's extend kernel ignores them by default), or
``j <= i`` without a mask (a chain, causal). This is what SGLang's ``extend_attention_fwd`` computes there.

SGLang's extend kernel runs one program per (request, query head, 64 or 128 query rows): with a handful of draft
tokens per request most rows are padding, and every query head re-reads its kv head's prefix. Here one program per
(request, kv head, ``BLOCK_M`` rows) stacks the ``n_b`` draft tokens x ``Hq / Hkv`` query heads that share the kv
head (row ``r``: token ``r // G``, head ``r % G``), so each prefix K/V block is read once per request and kv head,
as SGLang's grouped decode kernel reads it for one token. One pass over the prefix then the tree, online softmax in
fp32 (log2 domain); probabilities enter the P.V product in the pool's dtype, as in SGLang's kernel.

Split prefix (few programs, long prefixes): a small batch gives bs x Hkv x row blocks programs, too few to keep the
GPU's SMs reading. The launcher then allows up to ``num_splits`` programs per row block; request ``b`` uses
``min(num_splits, ceil(L_b / split_tokens))`` of them, each over its own stretch of the prefix (the first one also
over the tree), each writing its normalised partial output and log-sum-exp (fp32), and a second kernel merges them
(as SGLang's decode kernel splits its KV). A request that uses one split is written directly. Without splits a
program's reduction order depends only on its own request; with them it also depends on ``num_splits``, which the
launcher takes from the batch size (one, always, under SGLang's deterministic inference: the caller passes 1).

FP8 pools are not handled (the launcher refuses them; SGLang's kernel serves them): ``k_scale`` / ``v_scale``
scale the prefix's scores / output as SGLang's kernel does for 16-bit pools with scales.
"""

import functools

import torch
import triton
import triton.language as tl

from sgl_eagle_triton.kernels.device import H100, device_info, warps
from sgl_eagle_triton.kernels.rounding import MODEL_DTYPES, mma, round_to, tl_dtype

LOG2E = tl.constexpr(1.4426950408889634)  # a constexpr: jitted code reads no plain Python globals


@triton.jit
def _scores(q, k, scale_log2, logit_cap, HAS_CAP: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """``q @ k`` ([BLOCK_M, D] x [D, BLOCK_N]) scaled into the log2 domain, SGLang's tanh cap applied to the scaled
    scores when ``HAS_CAP``."""
    s = mma(q, k, tl.zeros([BLOCK_M, BLOCK_N], tl.float32))
    if HAS_CAP:
        s = s * (scale_log2 / LOG2E)
        return logit_cap * (2.0 / (1.0 + tl.exp(-2.0 * s / logit_cap)) - 1.0) * LOG2E
    return s * scale_log2


@triton.jit
def _accumulate(s, v, m_i, l_i, acc, v_scale, DTYPE: tl.constexpr):
    """One online-softmax step over the scores ``s`` (log2 domain, -inf where not attended) and their values ``v``
    (times ``v_scale``): the new (max, sum, accumulator); the probabilities enter P.V rounded to ``DTYPE``."""
    m_new = tl.maximum(m_i, tl.max(s, axis=1))
    p = tl.exp2(s - m_new[:, None])
    alpha = tl.exp2(m_i - m_new)
    pv = mma(round_to(p, DTYPE), v, tl.zeros(acc.shape, tl.float32))
    return m_new, l_i * alpha + tl.sum(p, axis=1), acc * alpha[:, None] + pv * v_scale


@triton.jit
def _rows(block, kv_head, n, G: tl.constexpr, BLOCK_M: tl.constexpr):
    """Row block ``block`` of a request's ``n`` draft tokens x the ``G`` query heads of ``kv_head``: each row's token,
    query head and whether it is a real row (row ``r``: token ``r // G``, head ``r % G``)."""
    rows = block * BLOCK_M + tl.arange(0, BLOCK_M)
    tok = rows // G
    return tok, kv_head * G + rows % G, tok < n


@triton.jit
def _store_rows(o_ptr, acc, total, q_start, tok, head, row_ok, stride_ot, stride_oh, dv, DV: tl.constexpr,
                DTYPE: tl.constexpr):
    """``acc / total`` rounded to ``DTYPE`` into the rows' outputs."""
    tl.store(o_ptr + (q_start + tok)[:, None] * stride_ot + head[:, None] * stride_oh + dv[None, :],
             round_to(acc / total[:, None], DTYPE), mask=row_ok[:, None] & (dv[None, :] < DV))


@triton.jit
def _verify_attention_kernel(
    q_ptr, k_ext_ptr, v_ext_ptr, o_ptr, k_buf_ptr, v_buf_ptr,
    qo_indptr_ptr, kv_indptr_ptr, kv_indices_ptr, mask_ptr, mask_indptr_ptr,
    scale_log2, k_scale, v_scale, logit_cap,
    stride_qt, stride_qh, stride_kt, stride_kh, stride_vt, stride_vh, stride_ot, stride_oh,
    stride_kbs, stride_kbh, stride_vbs, stride_vbh,
    G: tl.constexpr, D: tl.constexpr, DV: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_E: tl.constexpr,
    USE_MASK: tl.constexpr, HAS_CAP: tl.constexpr, DTYPE: tl.constexpr,
    part_o_ptr, part_lse_ptr, SPLITS: tl.constexpr, SPLIT_TOKENS: tl.constexpr,
):
    b = tl.program_id(0)
    kv_head = tl.program_id(1)
    block = tl.program_id(2) // SPLITS
    split = tl.program_id(2) % SPLITS
    q_start = tl.load(qo_indptr_ptr + b)
    n = tl.load(qo_indptr_ptr + b + 1) - q_start
    if block * BLOCK_M >= n * G:
        return
    kv_start = tl.load(kv_indptr_ptr + b)
    prefix = tl.load(kv_indptr_ptr + b + 1) - kv_start
    used = _splits_used(prefix, SPLITS, SPLIT_TOKENS)
    if split >= used:
        return
    # this split's stretch of the prefix: whole blocks of BLOCK_N (stretches past the prefix are empty)
    stretch = tl.cdiv(tl.cdiv(prefix, used), BLOCK_N) * BLOCK_N
    lo = split * stretch
    hi = tl.minimum(prefix, lo + stretch)

    tok, head, row_ok = _rows(block, kv_head, n, G, BLOCK_M)
    d = tl.arange(0, BLOCK_D)
    dv = tl.arange(0, BLOCK_DV)
    q = tl.load(q_ptr + (q_start + tok)[:, None] * stride_qt + head[:, None] * stride_qh + d[None, :],
                mask=row_ok[:, None] & (d[None, :] < D), other=0.0)

    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_DV], tl.float32)

    # the prefix: every draft token sees all of it
    cols = tl.arange(0, BLOCK_N)
    start = lo
    while start < hi:  # (not range(): the interpreter cannot take tensor bounds)
        col_ok = start + cols < hi
        loc = tl.load(kv_indices_ptr + kv_start + start + cols, mask=col_ok, other=0).to(tl.int64)
        k = tl.load(k_buf_ptr + loc[None, :] * stride_kbs + kv_head * stride_kbh + d[:, None],
                    mask=col_ok[None, :] & (d[:, None] < D), other=0.0)
        s = tl.where(col_ok[None, :], _scores(q, k, scale_log2 * k_scale, logit_cap, HAS_CAP, BLOCK_M, BLOCK_N),
                     float("-inf"))
        v = tl.load(v_buf_ptr + loc[:, None] * stride_vbs + kv_head * stride_vbh + dv[None, :],
                    mask=col_ok[:, None] & (dv[None, :] < DV), other=0.0)
        m_i, l_i, acc = _accumulate(s, v, m_i, l_i, acc, v_scale, DTYPE)
        start += BLOCK_N

    # the tree (the first split's): draft token j as the mask (or causality) allows
    ecols = tl.arange(0, BLOCK_E)
    if USE_MASK:
        mask_start = tl.load(mask_indptr_ptr + b)
    tree_end = tl.where(split == 0, n, 0)  # (a typed bound: n is int64 under CUDA graphs, int32 eagerly)
    start = 0
    while start < tree_end:
        j = start + ecols
        col_ok = j < n
        if USE_MASK:
            allowed = tl.load(mask_ptr + mask_start + tok[:, None].to(tl.int64) * (prefix + n) + prefix + j[None, :],
                              mask=row_ok[:, None] & col_ok[None, :], other=0) != 0
        else:
            allowed = j[None, :] <= tok[:, None]
        allowed = allowed & col_ok[None, :]
        k = tl.load(k_ext_ptr + (q_start + j)[None, :] * stride_kt + kv_head * stride_kh + d[:, None],
                    mask=col_ok[None, :] & (d[:, None] < D), other=0.0)
        s = tl.where(allowed, _scores(q, k, scale_log2, logit_cap, HAS_CAP, BLOCK_M, BLOCK_E), float("-inf"))
        v = tl.load(v_ext_ptr + (q_start + j)[:, None] * stride_vt + kv_head * stride_vh + dv[None, :],
                    mask=col_ok[:, None] & (dv[None, :] < DV), other=0.0)
        m_i, l_i, acc = _accumulate(s, v, m_i, l_i, acc, 1.0, DTYPE)
        start += BLOCK_E

    if used == 1:
        _store_rows(o_ptr, acc, l_i, q_start, tok, head, row_ok, stride_ot, stride_oh, dv, DV, DTYPE)
    else:  # a partial: normalised output and log2-sum-exp (a stretch with no column: 0 and -inf)
        seen = l_i > 0
        part = tl.where(seen[:, None], acc / tl.where(seen, l_i, 1.0)[:, None], 0.0)
        lse = tl.where(seen, m_i + tl.log2(tl.where(seen, l_i, 1.0)), float("-inf"))
        row = (q_start + tok).to(tl.int64) * (G * tl.num_programs(1)) + head  # (token, query head) of [T, Hq]
        tl.store(part_lse_ptr + row * SPLITS + split, lse, mask=row_ok)
        tl.store(part_o_ptr + (row * SPLITS + split)[:, None] * DV + dv[None, :], part,
                 mask=row_ok[:, None] & (dv[None, :] < DV))


@triton.jit
def _splits_used(prefix, SPLITS: tl.constexpr, SPLIT_TOKENS: tl.constexpr):
    """How many of the ``SPLITS`` programs a request with a prefix of ``prefix`` tokens uses (>= 1)."""
    return tl.maximum(tl.minimum(tl.cdiv(prefix, SPLIT_TOKENS), SPLITS), 1)  # one return type: prefix's


@triton.jit
def _merge_splits_kernel(
    o_ptr, part_o_ptr, part_lse_ptr, qo_indptr_ptr, kv_indptr_ptr, stride_ot, stride_oh,
    G: tl.constexpr, DV: tl.constexpr, BLOCK_DV: tl.constexpr, BLOCK_M: tl.constexpr,
    SPLITS: tl.constexpr, SPLIT_TOKENS: tl.constexpr, DTYPE: tl.constexpr,
):
    """The split requests' outputs: their partials weighted by exp2(lse - max lse), in fp32, rounded once."""
    b = tl.program_id(0)
    kv_head = tl.program_id(1)
    block = tl.program_id(2)
    q_start = tl.load(qo_indptr_ptr + b)
    n = tl.load(qo_indptr_ptr + b + 1) - q_start
    prefix = tl.load(kv_indptr_ptr + b + 1) - tl.load(kv_indptr_ptr + b)
    used = _splits_used(prefix, SPLITS, SPLIT_TOKENS)
    if block * BLOCK_M >= n * G or used == 1:
        return
    tok, head, row_ok = _rows(block, kv_head, n, G, BLOCK_M)
    row = (q_start + tok).to(tl.int64) * (G * tl.num_programs(1)) + head
    dv = tl.arange(0, BLOCK_DV)
    top = tl.full([BLOCK_M], float("-inf"), tl.float32)
    i = 0
    while i < used:  # the largest log-sum-exp (run-time loops: no unrolling, no [rows, splits] registers)
        top = tl.maximum(top, tl.load(part_lse_ptr + row * SPLITS + i, mask=row_ok, other=float("-inf")))
        i += 1
    top = tl.where(top == float("-inf"), 0.0, top)
    acc = tl.zeros([BLOCK_M, BLOCK_DV], tl.float32)
    total = tl.zeros([BLOCK_M], tl.float32)
    i = 0
    while i < used:
        weight = tl.exp2(tl.load(part_lse_ptr + row * SPLITS + i, mask=row_ok, other=float("-inf")) - top)
        part = tl.load(part_o_ptr + (row * SPLITS + i)[:, None] * DV + dv[None, :],
                       mask=row_ok[:, None] & (dv[None, :] < DV), other=0.0)
        acc += weight[:, None] * part
        total += weight
        i += 1
    _store_rows(o_ptr, acc, tl.where(total > 0, total, 1.0), q_start, tok, head, row_ok, stride_ot, stride_oh, dv,
                DV, DTYPE)


SPLIT_TOKENS = 512  # a request splits its prefix only into stretches at least this long
MAX_HEAD_DIM = 128  # the head dims parity-tested (64, 80, 128); wider heads' tiles are untried (shared memory)
MAX_SPLITS = 8  # SGLang's --triton-attention-num-kv-splits default
SPLITS_CAP = 64  # whatever that flag says (--triton-attention-split-tile-size can raise it into the hundreds)
BUSY_PROGRAMS_PER_SM = 2  # splits are allowed until the batch's programs reach this many per SM


@functools.lru_cache(maxsize=None)
def _sm_count(device: torch.device) -> int:
    """Streaming multiprocessors (AMD: compute units) of ``device``; an H100's 132 off CUDA (the interpreter then
    splits as it would there)."""
    return device_info(device).sms if device.type == "cuda" else H100.sms


def splits_for(programs: int, device: torch.device, max_splits: int = MAX_SPLITS) -> int:
    """The prefix splits per row block for a batch of ``programs`` (bs x Hkv x row blocks): a power of two, 1 once
    the batch alone has BUSY_PROGRAMS_PER_SM programs per SM, at most ``max_splits`` and SPLITS_CAP."""
    splits = max(1, min(max_splits, SPLITS_CAP, BUSY_PROGRAMS_PER_SM * _sm_count(device) // max(programs, 1)))
    return 1 << (splits.bit_length() - 1)


def verify_attention(q, k_extend, v_extend, o, k_buffer, v_buffer, qo_indptr, kv_indptr, kv_indices, custom_mask,
                     mask_indptr, max_len_extend: int, sm_scale: float, k_scale: float = 1.0, v_scale: float = 1.0,
                     logit_cap: float = 0.0, num_splits: int | None = None, max_splits: int = MAX_SPLITS,
                     split_tokens: int = SPLIT_TOKENS) -> torch.Tensor:
    """Writes ``o`` and returns it.

    q: [T, Hq, D], k_extend / v_extend: [T, Hkv, D] / [T, Hkv, DV] (the draft tokens' own K/V), o: [T, Hq, DV],
    all one of MODEL_DTYPES; k_buffer / v_buffer: the KV pool [slots, Hkv, D] / [slots, Hkv, DV] in that dtype;
    qo_indptr, kv_indptr: [bs + 1] int32/int64; kv_indices: the prefixes' pool slots; custom_mask: flat bool /
    uint8 with mask_indptr [bs + 1] (module docstring), or None for causal chains; ``max_len_extend`` >= every
    n_b. ``num_splits``: prefix splits per row block (a power of two; 1: one pass, batch-invariant), None: chosen
    by :func:`splits_for` up to ``max_splits``; a request uses one split per ``split_tokens`` of its prefix at most.
    CUDA-graph safe: the grid and the fp32 scratch of the split partials ([T, Hq, splits, DV] and [T, Hq, splits])
    depend on (bs, Hkv, max_len_extend) only.
    """
    if q.dtype not in MODEL_DTYPES or k_buffer.dtype != q.dtype or v_buffer.dtype != q.dtype:
        raise ValueError(f"verify_attention: q and the pool in one of {MODEL_DTYPES}, got {q.dtype} / "
                         f"{k_buffer.dtype}")
    heads, kv_heads = q.shape[1], k_extend.shape[1]
    if max(q.shape[2], v_extend.shape[2]) > MAX_HEAD_DIM:
        raise ValueError(f"verify_attention: head dims up to {MAX_HEAD_DIM}, got {q.shape[2]} / {v_extend.shape[2]}")
    if heads % kv_heads:
        raise ValueError(f"verify_attention: {heads} query heads over {kv_heads} kv heads")
    group, dim, dim_v = heads // kv_heads, q.shape[2], v_extend.shape[2]
    bs = qo_indptr.shape[0] - 1
    block_m = min(64, max(16, triton.next_power_of_2(max_len_extend * group)))
    block_e = max(16, triton.next_power_of_2(min(max_len_extend, 64)))
    row_blocks = triton.cdiv(max_len_extend * group, block_m)
    splits = splits_for(bs * kv_heads * row_blocks, q.device, max_splits) if num_splits is None else num_splits
    if splits < 1 or splits & (splits - 1):
        raise ValueError(f"verify_attention: num_splits must be a power of two >= 1, got {splits}")
    part_o = part_lse = o  # (unread without splits)
    if splits > 1:
        part_o = torch.empty(q.shape[0] * heads * splits * dim_v, dtype=torch.float32, device=q.device)
        part_lse = torch.empty(q.shape[0] * heads * splits, dtype=torch.float32, device=q.device)
    gpu = device_info(q.device)
    mask = custom_mask.view(torch.uint8) if custom_mask is not None and custom_mask.dtype == torch.bool else custom_mask
    common = dict(G=group, BLOCK_DV=triton.next_power_of_2(dim_v), BLOCK_M=block_m, SPLITS=splits,
                  SPLIT_TOKENS=split_tokens, DTYPE=tl_dtype(q.dtype))
    _verify_attention_kernel[(bs, kv_heads, row_blocks * splits)](
        q, k_extend, v_extend, o, k_buffer, v_buffer,
        qo_indptr, kv_indptr, kv_indices, mask if mask is not None else qo_indptr,
        mask_indptr if mask_indptr is not None else qo_indptr,
        sm_scale * LOG2E.value, float(k_scale), float(v_scale), float(logit_cap),
        q.stride(0), q.stride(1), k_extend.stride(0), k_extend.stride(1), v_extend.stride(0), v_extend.stride(1),
        o.stride(0), o.stride(1), k_buffer.stride(0), k_buffer.stride(1), v_buffer.stride(0), v_buffer.stride(1),
        D=dim, DV=dim_v, BLOCK_D=triton.next_power_of_2(dim), BLOCK_N=64, BLOCK_E=block_e,
        USE_MASK=mask is not None, HAS_CAP=logit_cap > 0, part_o_ptr=part_o, part_lse_ptr=part_lse, **common,
        num_warps=warps(gpu, 256 if dim >= 128 else 128),  # D 128 at 4 warps: ptxas spilled (sm_90a)
    )
    if splits > 1:
        _merge_splits_kernel[(bs, kv_heads, row_blocks)](
            o, part_o, part_lse, qo_indptr, kv_indptr, o.stride(0), o.stride(1), DV=dim_v, **common,
            num_warps=warps(gpu, 128))
    return o
