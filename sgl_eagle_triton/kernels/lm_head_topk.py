"""The fused drafter's last step: LM head, softmax and top-k in two kernels; at small batch the logits never
reach memory.

Kernel 1, grid ``(cdiv(R, BLOCK_R), cdiv(V, BLOCK_V))``, one program per block of rows and ``BLOCK_V``-wide
vocabulary tile: the tile's logits in registers (RMSNorm, if any, applied to ``x`` as it is loaded; ``tl.dot``
over ``H``; rounded to the model's dtype, bf16 or fp16, as SGLang's GEMM output), then per row the tile's
``sum(exp(logit - tile max))`` and its top ``TOPK`` candidates, best first, to scratch. Row blocks are the
fastest grid axis, so the programs that share a weight tile run together and re-read it from L2 rather than HBM.

From ``CUBLAS_MIN_ROWS`` rows on (the draft at large batch x topk) the logits are no longer worth avoiding
(``R * V`` 16-bit logits are a few tens of MB against hundreds of µs of GEMM): ``x`` is normalised once, cuBLAS
writes the logits in the model's dtype (SGLang's own LM head call) and kernel 1 reads its tiles from them.

Kernel 2, grid ``(R,)``: per row, the max ``M`` of the tile maxima and ``S = sum_t sum_t * exp(max_t - M)``.
The top-k lie among the candidates of the ``TOPK`` tiles with the largest maxima (a tile outside them has
``TOPK`` tile maxima above its best), so after ``TOPK`` rounds over the tile maxima only ``TOPK**2``
candidates are merged; ``p = exp(logit - M) / S``.

A candidate is one int64 key: the order-preserving int32 image of its fp32 logit in the high half,
``2**32 - 1 - id`` in the low half. Keys are unique and a larger key is a larger logit or, on equal logits,
the lower id, so each top-k round is one max. (A -0 logit, which needs every product of its sum to be -0,
would rank below +0.)
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

VOCAB_TILE = 64  # BLOCK_V: V = 32000 gives 500 programs per row block, enough to keep every SM streaming
KEY_MIN = tl.constexpr(-(2**63))  # below every candidate: padding and removed candidates
LOW_MASK = tl.constexpr(0xFFFFFFFF)


@triton.jit
def _encode(logits, ids):
    """int64 keys of fp32 ``logits`` and their int32 vocabulary ``ids`` (see the module docstring)."""
    bits = logits.to(tl.int32, bitcast=True)
    ordered = bits ^ ((bits >> 31) & 0x7FFFFFFF)
    return (ordered.to(tl.int64) << 32) | (LOW_MASK - ids.to(tl.int64))


@triton.jit
def _decode(keys):
    """(fp32 logit, int64 vocabulary id) of int64 ``keys``."""
    ordered = (keys >> 32).to(tl.int32)
    logits = (ordered ^ ((ordered >> 31) & 0x7FFFFFFF)).to(tl.float32, bitcast=True)
    return logits, LOW_MASK - (keys & LOW_MASK)


@triton.jit
def _lm_head_tile_kernel(
    x_ptr,
    x_row_stride,
    weight_ptr,
    norm_weight_ptr,
    key_ptr,
    sum_ptr,
    R,
    eps,
    id_offset,
    v_valid,
    V: tl.constexpr,
    H: tl.constexpr,
    TOPK: tl.constexpr,
    HAS_NORM: tl.constexpr,
    FROM_LOGITS: tl.constexpr,
    BLOCK_R: tl.constexpr,
    BLOCK_V: tl.constexpr,
    BLOCK_K: tl.constexpr,
    DTYPE: tl.constexpr,
    USE_GDC: tl.constexpr,
):
    wait_for_prior(USE_GDC)
    NUM_TILES: tl.constexpr = (V + BLOCK_V - 1) // BLOCK_V
    tile = tl.program_id(1)
    rows = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
    vocab = tile * BLOCK_V + tl.arange(0, BLOCK_V)
    # Rows past R and vocabulary past V load clamped (unmasked loads); their results are dropped below.
    safe_rows = tl.minimum(rows, R - 1).to(tl.int64)
    safe_vocab = tl.minimum(vocab, V - 1).to(tl.int64)
    if FROM_LOGITS:  # x holds the logits [R, V] in DTYPE (row stride x_row_stride)
        acc = tl.load(x_ptr + safe_rows[:, None] * x_row_stride + safe_vocab[None, :]).to(tl.float32)
    else:
        ks = tl.arange(0, BLOCK_K)
        x_rows = x_ptr + safe_rows[:, None] * x_row_stride + ks[None, :]
        w_rows = weight_ptr + safe_vocab[:, None] * H + ks[None, :]
        if HAS_NORM:  # four loads in flight per trip (a bubble before the weight stream), same summation order
            sum_sq = tl.zeros([BLOCK_R], tl.float32)
            for k in range(0, H, 4 * BLOCK_K):
                for j in tl.static_range(4):
                    if k + j * BLOCK_K < H:
                        xk = tl.load(x_rows + k + j * BLOCK_K).to(tl.float32)
                        sum_sq += tl.sum(xk * xk, axis=1)
            inv = rstd(sum_sq, H, eps)
        acc = tl.zeros([BLOCK_R, BLOCK_V], tl.float32)
        for k in range(0, H, BLOCK_K):
            z = tl.load(x_rows + k).to(tl.float32)
            if HAS_NORM:
                z = (z * inv[:, None]) * tl.load(norm_weight_ptr + k + ks).to(tl.float32)[None, :]
            acc = mma(round_to(z, DTYPE), tl.trans(tl.load(w_rows + k)), acc)
        acc = round_to(acc, DTYPE).to(tl.float32)

    valid = vocab[None, :] < v_valid  # v_valid <= V: a tensor-parallel shard's padding rows are never candidates
    logits = tl.where(valid, acc, float("-inf"))
    tile_max = tl.max(logits, axis=1)
    tile_sum = tl.sum(tl.exp(logits - tile_max[:, None]), axis=1)
    tile_sum = tl.where(tile_max == float("-inf"), 0.0, tile_sum)  # a tile of padding only
    keys = tl.where(valid, _encode(logits, id_offset + vocab[None, :]), KEY_MIN)

    live = rows < R
    tl.store(sum_ptr + rows * NUM_TILES + tile, tile_sum, mask=live)
    key_out = key_ptr + rows.to(tl.int64) * (TOPK * NUM_TILES) + tile
    for j in tl.static_range(TOPK):
        best = tl.max(keys, axis=1)
        tl.store(key_out + j * NUM_TILES, best, mask=live)
        keys = tl.where(keys == best[:, None], KEY_MIN, keys)


@triton.jit
def _merge_kernel(
    key_ptr,
    sum_ptr,
    token_map_ptr,
    out_p_ptr,
    out_index_ptr,
    id_offset,
    V: tl.constexpr,
    TOPK: tl.constexpr,
    HAS_MAP: tl.constexpr,
    SUMMARY: tl.constexpr,
    BLOCK_V: tl.constexpr,
    BLOCK_T: tl.constexpr,
    TOPK_P2: tl.constexpr,
    USE_GDC: tl.constexpr,
):
    wait_for_prior(USE_GDC)
    NUM_TILES: tl.constexpr = (V + BLOCK_V - 1) // BLOCK_V
    row = tl.program_id(0).to(tl.int64)
    row_keys = key_ptr + row * (TOPK * NUM_TILES)
    tiles = tl.arange(0, BLOCK_T)
    is_tile = tiles < NUM_TILES
    heads = tl.load(row_keys + tiles, mask=is_tile, other=KEY_MIN)  # each tile's best candidate
    tile_sum = tl.load(sum_ptr + row * NUM_TILES + tiles, mask=is_tile, other=0.0)
    row_max, _ = _decode(tl.max(heads, axis=0))
    tile_max, _ = _decode(heads)
    has_candidates = is_tile & (heads != KEY_MIN)  # not a tile (or shard) of padding only
    total = tl.sum(tl.where(has_candidates, tile_sum * tl.exp(tile_max - row_max), 0.0), axis=0)

    # The TOPK tiles with the largest maxima, then the top TOPK of their candidates.
    ranks = tl.arange(0, TOPK_P2)
    top_tiles = tl.zeros([TOPK_P2], tl.int64)
    tile_ok = ranks < 0
    for j in tl.static_range(TOPK):
        best = tl.max(heads, axis=0)
        found = best != KEY_MIN  # fewer than TOPK tiles hold candidates (padding)
        top_tiles = tl.where((ranks == j) & found, (_decode(best)[1] - id_offset) // BLOCK_V, top_tiles)
        tile_ok = tile_ok | ((ranks == j) & found)
        heads = tl.where(heads == best, KEY_MIN, heads)
    pick = (ranks[:, None] < min(TOPK, NUM_TILES)) & (ranks[None, :] < TOPK) & tile_ok[:, None]
    cand = tl.load(row_keys + ranks[None, :] * NUM_TILES + top_tiles[:, None], mask=pick, other=KEY_MIN)
    top_keys = tl.zeros([TOPK_P2], tl.int64)
    for j in tl.static_range(TOPK):
        best = tl.max(tl.max(cand, axis=1), axis=0)
        top_keys = tl.where(ranks == j, best, top_keys)
        cand = tl.where(cand == best, KEY_MIN, cand)

    out = ranks < TOPK
    if SUMMARY:  # a tensor-parallel rank's part: its top keys and its sum relative to its own best logit
        tl.store(out_index_ptr + row * TOPK + ranks, top_keys, mask=out)
        tl.store(out_p_ptr + row, total)
    else:
        logit, ids = _decode(top_keys)
        if HAS_MAP:
            ids = tl.load(token_map_ptr + ids, mask=out, other=0)
        tl.store(out_p_ptr + row * TOPK + ranks, tl.exp(logit - row_max) / total, mask=out)
        tl.store(out_index_ptr + row * TOPK + ranks, ids, mask=out)


def lm_head_topk(
    x: torch.Tensor,
    weight: torch.Tensor,
    topk: int,
    norm_weight: torch.Tensor | None = None,
    eps: float = 1e-6,
    token_map: torch.Tensor | None = None,
    out_p: torch.Tensor | None = None,
    out_index: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per row of ``x``: the ``topk`` most probable tokens of ``softmax(lm_head(z))``, most probable first.

    Args:
        x:           [R, H] in the weight's dtype, or fp32 (e.g. the unrounded residual sum that SGLang's fused
                     add-RMSNorm normalises); unit column stride, any row stride; H a multiple of 16.
        weight:      [V, H] bf16 or fp16, contiguous (``nn.Linear`` layout: the LM head over the draft
                     vocabulary); its dtype is the model's, to which ``rnd`` below rounds.
        topk:        1 .. min(16, V).
        norm_weight: optional [H] in the weight's dtype, contiguous: ``z = RMSNorm(x)`` as SGLang's (fp32
                     ``rnd((x * rstd) * w)``, ``rstd = 1 / sqrt(mean(x**2) + eps)``); without it ``z = rnd(x)``.
        token_map:   optional [V] int64, contiguous: the ids returned are ``token_map[id]`` (EAGLE-3's
                     ``hot_token_id``).
        out_p, out_index: optional contiguous [R, topk] fp32 / int64 results (allocated when None).

    Logits are ``rnd(z @ weight.T)`` summed in fp32 (SGLang's 16-bit GEMM), ``p = softmax(logits)``
    in fp32. Returns ``(topk_p, topk_index)`` ranked by logit (so by ``p``), the lower id first on equal
    logits; ``sgl_eagle_triton.devtools.reference.lm_head_topk`` spells it out.

    V and H are compile-time constants (one compilation per model). CUDA-graph safe: grids depend on R, V
    and H only, no host sync; scratch of ``R * cdiv(V, 64) * (8 * topk + 4)`` bytes from ``torch.empty``.
    """
    R, H = x.shape
    V = weight.shape[0]
    assert weight.dtype in MODEL_DTYPES and weight.shape == (V, H) and weight.is_contiguous()
    assert x.dtype in (weight.dtype, torch.float32) and x.stride(1) == 1 and H % 16 == 0
    assert 1 <= topk <= min(16, V)
    if norm_weight is not None:
        assert norm_weight.shape == (H,) and norm_weight.is_contiguous() and norm_weight.dtype == weight.dtype
    if token_map is not None:
        assert token_map.shape == (V,) and token_map.dtype == torch.int64 and token_map.is_contiguous()
    if out_p is None:
        out_p = torch.empty((R, topk), dtype=torch.float32, device=x.device)
    if out_index is None:
        out_index = torch.empty((R, topk), dtype=torch.int64, device=x.device)
    assert out_p.shape == out_index.shape == (R, topk) and out_p.is_contiguous() and out_index.is_contiguous()
    assert out_p.dtype == torch.float32 and out_index.dtype == torch.int64

    keys, sums = _tile_pass(x, weight, topk, norm_weight, eps, 0, V)
    _merge(keys, sums, V, VOCAB_TILE, topk, token_map, out_p, out_index)
    return out_p, out_index


def _tile_pass(x, weight, topk, norm_weight, eps, id_offset: int, v_valid: int):
    """Kernel 1 over ``weight``'s rows (ids ``id_offset + row``; rows from ``v_valid`` on never chosen):
    ``(keys [R, topk, tiles] int64, sums [R, tiles] fp32)``."""
    R, H = x.shape
    V = weight.shape[0]
    from_logits = R >= CUBLAS_MIN_ROWS
    if from_logits:  # many rows: cuBLAS writes the logits in the weight's dtype, the tile kernel reads them
        z = rms_norm(x, norm_weight, eps) if norm_weight is not None else x.to(weight.dtype)
        x = F.linear(z, weight)
    num_tiles = triton.cdiv(V, VOCAB_TILE)
    gpu = device_info(x.device)
    block_r, block_k, num_stages = _tile_pass_config(R, H, num_tiles, x.element_size(), gpu)
    keys = torch.empty((R, topk, num_tiles), dtype=torch.int64, device=x.device)
    sums = torch.empty((R, num_tiles), dtype=torch.float32, device=x.device)
    _lm_head_tile_kernel[(triton.cdiv(R, block_r), num_tiles)](
        x,
        x.stride(0),
        weight,
        norm_weight if norm_weight is not None else x,
        keys,
        sums,
        R,
        eps,
        id_offset,
        v_valid,
        V=V,
        H=H,
        TOPK=topk,
        HAS_NORM=norm_weight is not None and not from_logits,
        FROM_LOGITS=from_logits,
        BLOCK_R=block_r,
        BLOCK_V=VOCAB_TILE,
        BLOCK_K=block_k,
        DTYPE=tl_dtype(weight.dtype),
        **pdl_args(x.device),
        num_warps=warps(gpu, 128),
        num_stages=num_stages,
    )
    return keys, sums


def _tile_pass_config(R: int, H: int, num_tiles: int, x_bytes: int, gpu: DeviceInfo) -> tuple[int, int, int]:
    """``(BLOCK_R, BLOCK_K, num_stages)`` of kernel 1 for ``R`` rows of x (``x_bytes`` an element), hidden size ``H``
    and ``num_tiles`` vocabulary tiles. Up to 16 rows: ``BLOCK_K`` 256 where three stages of it fit in shared memory
    (else 128), 4 stages where the tiles are at most one wave (a tensor-parallel shard of the vocabulary), else 3:
    the best tile of H100 / H200 sweeps at the 8B draft's 32000 / 16000 / 8000-row shards, or within 2 % of it
    (bench/results/*-sweep-linear-tp*.json). 17-32 rows: 128, 4 stages; from logits: 64 (unused), 4 stages.
    ``BLOCK_K`` never exceeds the largest power of two dividing ``H`` (the K loop is unmasked), the stages never
    shared memory (an MI300X's 64 KB of LDS: BLOCK_K 128). Launched with 128 threads a program (4 warps; 2
    wavefronts on AMD)."""
    block_r = 16 if R <= 16 else 32 if R <= 32 else 64
    budget = pipeline_budget(gpu)
    deep_fits = 3 * stage_bytes(block_r, VOCAB_TILE, 256, x_bytes) <= budget
    block_k = min(H & -H, 64 if block_r == 64 else 256 if block_r == 16 and deep_fits else 128)
    num_stages = 3 if block_r == 16 and num_tiles > gpu.sms else 4
    return block_r, block_k, max(1, min(num_stages, budget // stage_bytes(block_r, VOCAB_TILE, block_k, x_bytes)))


def _merge(keys, sums, V: int, block_v: int, topk: int, token_map, out_a, out_b, id_offset: int = 0,
           summary: bool = False):
    """Kernel 2 over ``keys`` [R, topk, tiles] / ``sums`` [R, tiles] of ``block_v``-wide tiles of ``V`` ids: into
    ``out_a`` (p [R, topk], or with ``summary`` the row's sum [R]) and ``out_b`` (ids, or the top keys)."""
    R, _, num_tiles = keys.shape
    _merge_kernel[(R,)](
        keys,
        sums,
        token_map if token_map is not None else keys,
        out_a,
        out_b,
        id_offset,
        V=V,
        TOPK=topk,
        HAS_MAP=token_map is not None,
        SUMMARY=summary,
        BLOCK_V=block_v,
        BLOCK_T=triton.next_power_of_2(max(num_tiles, 16)),
        TOPK_P2=triton.next_power_of_2(max(topk, 2)),
        **pdl_args(keys.device),
        num_warps=warps(device_info(keys.device), 128),
    )


def lm_head_topk_shard(x, weight, topk, norm_weight=None, eps=1e-6, vocab_offset: int = 0,
                       valid: int | None = None):
    """One tensor-parallel rank's part of :func:`lm_head_topk`: ``(keys [R, topk] int64, sum [R] fp32)``.

    ``weight`` [V_shard, H] is the rank's vocabulary-parallel shard of the LM head: rows ``vocab_offset ..
    vocab_offset + V_shard`` of the whole one, of which the first ``valid`` (default all) are real and the rest
    SGLang's padding. ``keys``: the shard's ``topk`` best candidates as the kernels' int64 keys (logit and global
    id, best first; ``KEY_MIN`` past a shard's real rows); ``sum``: ``sum(exp(logit - best logit))`` over the
    shard. :func:`merge_shards` turns every rank's part into the whole vocabulary's top-k: ``topk * 8 + 4`` bytes
    per row and rank cross the link, never the logits. Other arguments as :func:`lm_head_topk`'s.
    """
    R, H = x.shape
    V = weight.shape[0]
    valid = V if valid is None else valid
    assert weight.dtype in MODEL_DTYPES and weight.shape == (V, H) and weight.is_contiguous()
    assert x.dtype in (weight.dtype, torch.float32) and x.stride(1) == 1 and H % 16 == 0
    assert 1 <= topk <= 16 and 0 <= valid <= V and vocab_offset >= 0
    keys, sums = _tile_pass(x, weight, topk, norm_weight, eps, vocab_offset, valid)
    top_keys = torch.empty((R, topk), dtype=torch.int64, device=x.device)
    total = torch.empty(R, dtype=torch.float32, device=x.device)
    _merge(keys, sums, V, VOCAB_TILE, topk, None, total, top_keys, vocab_offset, summary=True)
    return top_keys, total


def merge_shards(keys: torch.Tensor, sums: torch.Tensor, shard_size: int, topk: int,
                 token_map: torch.Tensor | None = None, out_p: torch.Tensor | None = None,
                 out_index: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Every rank's :func:`lm_head_topk_shard` (gathered: ``keys`` [tp, R, topk], ``sums`` [tp, R]; rank ``r``
    holding ids ``r * shard_size ..``) merged into :func:`lm_head_topk`'s result over the whole vocabulary:
    the same ids in the same order (ties: the lower id first, as on one GPU), ``p`` equal up to fp32 rounding
    (the sum over the vocabulary is added up in another order). ``token_map`` [tp * shard_size or more] int64
    maps the ids as in :func:`lm_head_topk`. Each rank runs it on the same gathered inputs: identical results."""
    tp, R, k = keys.shape
    assert k == topk and sums.shape == (tp, R) and keys.dtype == torch.int64 and sums.dtype == torch.float32
    if out_p is None:
        out_p = torch.empty((R, topk), dtype=torch.float32, device=keys.device)
    if out_index is None:
        out_index = torch.empty((R, topk), dtype=torch.int64, device=keys.device)
    # ranks as the merge kernel's tiles: [R, topk, tp] keys, [R, tp] sums
    _merge(keys.permute(1, 2, 0).contiguous(), sums.t().contiguous(), tp * shard_size, shard_size, topk, token_map,
           out_p, out_index)
    return out_p, out_index
