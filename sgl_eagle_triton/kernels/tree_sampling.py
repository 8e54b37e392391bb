"""Sampled (temperature > 0) verification of an EAGLE draft tree: Triton port of sgl-kernel's
``tree_speculative_sampling_target_only``.

As in ``verify_greedy``, a request's tree rows are loaded once as ``BLOCK_N``-lane vectors and the walk runs
in registers, the CUDA kernel's level loop and sibling loop fused into one ``while`` loop with one iteration
per visited node; only the target probability of each visited draft token is a (scalar) global load. The
tokens rejected among the children of the last accepted node are kept in a ``BLOCK_N``-lane register vector
instead of CUDA's dense ``draft_probs`` tensor. The correction ("bonus") token is then drawn from the target
row of the last accepted node with those tokens zeroed, that row split over ``SPLIT`` programs
(``tree_rows.row_slices``: on an H100 32 slices of 4096 tokens at V = 128256 up to 8 requests), in two launches:

1. ``_walk_kernel``, grid ``(bs, SPLIT)``: every program walks its request's tree (the same walk, at the
   same time: no launch in between), program 0 writes the outputs and, into the request's scratch record,
   the last accepted node, its position and the rejected tokens; each program then sums the residual over
   its slice and finds its last positive token;
2. ``_correction_kernel``, grid ``(bs,)``: ``u * sum`` from the slice sums, the first slice whose end's prefix
   sum exceeds it, then a running prefix sum from that slice's start that stops at the first token where it
   exceeds ``u * sum`` (one slice, unless rounding carries it further).

Scratch, int32 per request (floats stored in place): last node, position, rejected count, ``[BLOCK_N]``
rejected tokens, ``[SPLIT]`` slice sums, ``[SPLIT]`` last positive tokens.
"""

import torch
import triton
import triton.language as tl

from sgl_eagle_triton.kernels.device import device_info, warps
from sgl_eagle_triton.kernels.tree_rows import MAX_SPLIT, load_tree, pick, row_slices


@triton.jit
def _residual_chunk(row_ptr, start, end, rejected, lanes, num_rejected, BLOCK_N: tl.constexpr, BLOCK_V: tl.constexpr):
    """``relu(target_row[start : start + BLOCK_V])`` with the rejected tokens zeroed (0 from ``end`` on).

    The rejected tokens are compared one by one, and only in the (few) chunks that hold one."""
    cols = start + tl.arange(0, BLOCK_V)
    r = tl.maximum(tl.load(row_ptr + cols, mask=cols < end, other=0.0), 0.0)
    if tl.max(((rejected >= start) & (rejected < start + BLOCK_V)).to(tl.int32), axis=0) > 0:
        k = 0
        while k < tl.minimum(num_rejected, BLOCK_N):
            r = tl.where(cols == pick(rejected, lanes, k), 0.0, r)
            k += 1
    return r


@triton.jit(do_not_specialize=["record", "split"])
def _walk_kernel(
    predicts_ptr,
    accept_index_ptr,
    accept_token_num_ptr,
    candidates_ptr,
    retrieve_index_ptr,
    retrieve_next_token_ptr,
    retrieve_next_sibling_ptr,
    uniform_samples_ptr,
    target_probs_ptr,
    scratch_ptr,
    fscratch_ptr,
    threshold_single,
    threshold_acc,
    record,
    split,
    slice_len,
    N: tl.constexpr,
    NUM_SPEC: tl.constexpr,
    VOCAB: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_V: tl.constexpr,
):
    """Program ``(b, s)``: the walk of request ``b`` (program 0 writes its outputs and, in ``b``'s scratch
    record, the last accepted node, its position and the rejected tokens), then the residual's sum and last
    positive token in slice ``s`` of that node's target row."""
    b = tl.program_id(0).to(tl.int64)
    s = tl.program_id(1)
    lead = s == 0
    row_start = b * N
    lanes, in_tree, offsets, candidates, retrieve_index, next_token, next_sibling, last, cur = load_tree(
        candidates_ptr, retrieve_index_ptr, retrieve_next_token_ptr, retrieve_next_sibling_ptr, row_start, N,
        NUM_SPEC, BLOCK_N)
    coins = tl.load(uniform_samples_ptr + offsets, mask=in_tree, other=0.0)
    tl.store(accept_index_ptr + b * NUM_SPEC, last.to(tl.int32), mask=lead)
    row = row_start  # target_probs row (flat) of the last accepted node: the parent of the nodes scanned
    coin = pick(coins, lanes, 0)
    prob_acc = tl.zeros((), dtype=tl.float32)
    num_accepted = 0
    # Draft tokens rejected among the children of the last accepted node, in visiting order; -1: none.
    rejected = tl.full((BLOCK_N,), -1, dtype=tl.int64)
    num_rejected = 0
    steps = 0
    # One iteration per visited node: either accept it and descend, or move to its next sibling.
    # The step bound is never reached unless a sibling list is cyclic (where the CUDA kernel spins forever).
    while (cur != -1) & (steps < N * NUM_SPEC):
        token = pick(candidates, lanes, cur)
        prob = tl.load(target_probs_ptr + row * VOCAB + token)
        prob_acc += prob
        hit = (prob > 0) & ((coin < tl.math.div_rn(prob_acc, threshold_acc)) | (prob >= threshold_single))
        draft_index = pick(retrieve_index, lanes, cur)
        tl.store(predicts_ptr + last, token.to(tl.int32), mask=hit & lead)
        num_accepted += hit.to(tl.int32)
        tl.store(accept_index_ptr + b * NUM_SPEC + num_accepted, draft_index.to(tl.int32), mask=hit & lead)
        last = tl.where(hit, draft_index, last)
        row = tl.where(hit, row_start + cur, row)
        coin = tl.where(hit, pick(coins, lanes, cur), coin)
        prob_acc = tl.where(hit, 0.0, prob_acc)
        rejected = tl.where(hit, -1, tl.where(lanes == num_rejected, token, rejected))
        num_rejected = tl.where(hit, 0, num_rejected + 1)
        child = tl.where(num_accepted < NUM_SPEC - 1, pick(next_token, lanes, cur), -1)
        cur = tl.where(hit, child, pick(next_sibling, lanes, cur))
        steps += 1
    tl.store(accept_token_num_ptr + b, num_accepted, mask=lead)
    rec = b * record
    tl.store(scratch_ptr + rec, (row - row_start).to(tl.int32), mask=lead)
    tl.store(scratch_ptr + rec + 1, last.to(tl.int32), mask=lead)
    tl.store(scratch_ptr + rec + 2, num_rejected, mask=lead)
    tl.store(scratch_ptr + rec + 3 + lanes, rejected.to(tl.int32), mask=lead)

    # This slice's share of the correction token's residual r = relu(target_probs[row]), rejected tokens zeroed.
    total = tl.zeros((BLOCK_V,), dtype=tl.float32)
    last_positive = tl.full((BLOCK_V,), -1, dtype=tl.int32)
    start = s * slice_len
    end = tl.minimum(start + slice_len, VOCAB)
    while start < end:
        r = _residual_chunk(target_probs_ptr + row * VOCAB, start, end, rejected, lanes, num_rejected, BLOCK_N,
                            BLOCK_V)
        total += r
        last_positive = tl.maximum(last_positive, tl.where(r > 0, start + tl.arange(0, BLOCK_V), -1))
        start += BLOCK_V
    tl.store(fscratch_ptr + rec + 3 + BLOCK_N + s, tl.sum(total, axis=0))
    tl.store(scratch_ptr + rec + 3 + BLOCK_N + split + s, tl.max(last_positive, axis=0))


@triton.jit(do_not_specialize=["record", "split"])
def _correction_kernel(
    predicts_ptr,
    uniform_final_ptr,
    target_probs_ptr,
    scratch_ptr,
    fscratch_ptr,
    record,
    split,
    slice_len,
    N: tl.constexpr,
    VOCAB: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_V: tl.constexpr,
    MAX_SPLIT: tl.constexpr,
):
    """Request ``b``'s correction token: the first token whose prefix sum of the residual exceeds
    ``u * sum``, searched from the first slice whose end's prefix sum does."""
    b = tl.program_id(0).to(tl.int64)
    rec = b * record
    row = b * N + tl.load(scratch_ptr + rec)
    last = tl.load(scratch_ptr + rec + 1)
    num_rejected = tl.load(scratch_ptr + rec + 2)
    lanes = tl.arange(0, BLOCK_N)
    rejected = tl.load(scratch_ptr + rec + 3 + lanes).to(tl.int64)
    ids = tl.arange(0, MAX_SPLIT)
    sums = tl.load(fscratch_ptr + rec + 3 + BLOCK_N + ids, mask=ids < split, other=0.0)
    last_positive = tl.max(tl.load(scratch_ptr + rec + 3 + BLOCK_N + split + ids, mask=ids < split, other=-1), axis=0)
    u = tl.load(uniform_final_ptr + b) * tl.sum(sums, axis=0)
    first_slice = tl.min(tl.where(tl.cumsum(sums, axis=0) > u, ids, split), axis=0)
    carry = tl.sum(tl.where(ids < first_slice, sums, 0.0), axis=0)
    sampled = -1
    start = tl.minimum(first_slice * slice_len, VOCAB)  # VOCAB: no slice end exceeds u * sum
    while (sampled < 0) & (start < VOCAB):
        cols = start + tl.arange(0, BLOCK_V)
        r = _residual_chunk(target_probs_ptr + row * VOCAB, start, VOCAB, rejected, lanes, num_rejected, BLOCK_N,
                            BLOCK_V)
        cdf = carry + tl.cumsum(r, axis=0)
        first = tl.min(tl.where((cdf > u) & (r > 0), cols, VOCAB), axis=0)
        sampled = tl.where(first < VOCAB, first, -1)
        carry += tl.sum(r)
        start += BLOCK_V
    # No prefix sum above u (u * sum within rounding of the sum): the last token with r > 0, else V - 1.
    sampled = tl.where(sampled >= 0, sampled, tl.where(last_positive >= 0, last_positive, VOCAB - 1))
    tl.store(predicts_ptr + last, sampled.to(tl.int32))


def tree_speculative_sampling(
    predicts: torch.Tensor,
    accept_index: torch.Tensor,
    accept_token_num: torch.Tensor,
    candidates: torch.Tensor,
    retrieve_index: torch.Tensor,
    retrieve_next_token: torch.Tensor,
    retrieve_next_sibling: torch.Tensor,
    uniform_samples: torch.Tensor,
    uniform_samples_for_final_sampling: torch.Tensor,
    target_probs: torch.Tensor,
    threshold_single: float = 1.0,
    threshold_acc: float = 1.0,
) -> None:
    """Sampled tree verification, in place: per request, descend from the root; among the children of the
    last accepted node (in sibling order) accept the first whose running sum of target probabilities exceeds
    the node's coin; then draw the correction token from the target distribution there, rejected children
    removed. With the default thresholds (1.0) the emitted tokens are distributed as the target model's.

    Same arguments and results as ``sgl_kernel.tree_speculative_sampling_target_only`` (there named
    ``retrive_*``), without its ``draft_probs`` scratch tensor and ``deterministic`` flag;
    ``sgl_eagle_triton.devtools.reference.tree_sampling`` spells out the semantics.

    Outputs (pre-filled by the caller; only the elements below are written):
        predicts         [bs * n] int32: at each accepted position but the last, the next accepted draft token;
                         at the last accepted position, the correction token.
        accept_index     [bs, S + 1] int32: columns ``0 .. m``, accepted flat positions (root first).
        accept_token_num [bs] int32: ``m``, accepted draft tokens (root excluded), at most ``S``.
    Inputs, all contiguous: ``candidates``, ``retrieve_index``, ``retrieve_next_token``,
    ``retrieve_next_sibling`` [bs, n] int64 (-1 = none); ``uniform_samples`` [bs, n] float32 (the coin of each
    node, used for its children); ``uniform_samples_for_final_sampling`` [bs] float32; ``target_probs``
    [bs, n, V] float32 (row ``r``: the target distribution after node ``r``); ``threshold_single``,
    ``threshold_acc`` (accept a draft token when its probability reaches ``threshold_single``, or when the
    coin is below the running sum divided by ``max(threshold_acc, 1e-9)``; 1.0 and 1.0 keep sampling exact).

    Differences from sgl-kernel (0.4.5, the version SGLang 0.5.17 pins):
      * Acceptance is ``q > 0 and (coin < acc / threshold_acc or q >= threshold_single)``, the rule of later
        sgl-kernel releases; 0.4.5 accepts when ``coin <= acc / threshold_acc or q >= threshold_single``,
        which can accept a token of target probability 0 (e.g. coin == 0.0, or ``threshold_single == 0``).
        The two agree unless the coin equals ``acc / threshold_acc`` exactly or a zero-probability
        candidate meets ``threshold_single``.
      * No dense ``draft_probs`` tensor: the (at most n - 1) rejected tokens stay in registers. The residual
        is the same, since sgl-kernel's ``draft_probs`` row holds exactly the target probability at them.
      * Float sums run in another order than CUDA's block reduce / scan, so the correction token can differ
        only when ``u * sum(r)`` lies within rounding distance of a prefix-sum boundary. Where the slice
        sums put ``u * sum(r)`` inside a slice but no prefix sum there exceeds it (rounding), the scan goes
        on into the next chunks instead of stopping there.

    CUDA-graph safe: no host sync; two launches, grids ``(bs, SPLIT)`` and ``(bs,)`` (``SPLIT`` depends on
    ``bs`` and V only); allocates an int32 scratch of ``bs * (3 + BLOCK_N + 2 * SPLIT)`` words. Thresholds are
    baked into a captured graph.
    """
    bs, n = candidates.shape
    vocab_size = target_probs.shape[2]
    tensors = (predicts, accept_index, accept_token_num, candidates, retrieve_index, retrieve_next_token,
               retrieve_next_sibling, uniform_samples, uniform_samples_for_final_sampling, target_probs)
    assert all(t.is_contiguous() for t in tensors)
    assert target_probs.shape[:2] == (bs, n) and target_probs.dtype == torch.float32
    assert uniform_samples.dtype == torch.float32 and uniform_samples_for_final_sampling.dtype == torch.float32
    block_n = triton.next_power_of_2(max(n, 16))
    block_v = min(2048, triton.next_power_of_2(max(vocab_size, 16)))
    split, slice_len = row_slices(bs, vocab_size, block_v, target_probs.device)
    record = 3 + block_n + 2 * split  # int32 words per request (module docstring)
    scratch = torch.empty(bs * record, dtype=torch.int32, device=target_probs.device)
    common = (scratch, scratch.view(torch.float32))
    num_warps = warps(device_info(target_probs.device), 256 if block_v >= 2048 else 128)  # 8 / 4 warps, 4 / 2 waves
    sizes = dict(N=n, VOCAB=vocab_size, BLOCK_N=block_n, BLOCK_V=block_v, num_warps=num_warps)
    _walk_kernel[(bs, split)](
        predicts, accept_index, accept_token_num, candidates, retrieve_index, retrieve_next_token,
        retrieve_next_sibling, uniform_samples, target_probs, *common, float(threshold_single),
        max(float(threshold_acc), 1e-9), record, split, slice_len, NUM_SPEC=accept_index.shape[1], **sizes,
    )
    _correction_kernel[(bs,)](
        predicts, uniform_samples_for_final_sampling, target_probs, *common, record, split, slice_len,
        MAX_SPLIT=MAX_SPLIT, **sizes,
    )
