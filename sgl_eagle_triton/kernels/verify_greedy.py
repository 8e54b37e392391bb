"""Greedy verification of an EAGLE draft tree: Triton port of sgl-kernel's ``verify_tree_greedy``.

One program per request. The request's tree rows are loaded once as ``BLOCK_N``-lane vectors and the walk
runs in registers: reading node ``cur`` of a row is a one-hot reduction, not a dependent global load. The
CUDA kernel's level loop and sibling loop are fused into one ``while`` loop with one iteration per visited node.
"""

import torch
import triton
import triton.language as tl

from sgl_eagle_triton.kernels.tree_rows import load_tree, pick


@triton.jit
def _target_at(target_predict_ptr, target_row, lanes, row_start, pos, needed, N: tl.constexpr):
    """``target_predict.flatten()[pos]``: from this request's row in registers when ``pos`` lies in it,
    else (never for trees built by SGLang) from global memory, loaded only if ``needed``."""
    in_row = (pos >= row_start) & (pos < row_start + N)
    from_memory = tl.load(target_predict_ptr + pos, mask=needed & ~in_row, other=0)
    return tl.where(in_row, pick(target_row, lanes, pos - row_start), from_memory)


@triton.jit
def _verify_tree_greedy_kernel(
    predicts_ptr,
    accept_index_ptr,
    accept_token_num_ptr,
    candidates_ptr,
    retrieve_index_ptr,
    retrieve_next_token_ptr,
    retrieve_next_sibling_ptr,
    target_predict_ptr,
    N: tl.constexpr,
    NUM_SPEC: tl.constexpr,
    BLOCK_N: tl.constexpr,
):
    b = tl.program_id(0).to(tl.int64)
    row_start = b * N
    lanes, in_tree, offsets, candidates, retrieve_index, next_token, next_sibling, last, cur = load_tree(
        candidates_ptr, retrieve_index_ptr, retrieve_next_token_ptr, retrieve_next_sibling_ptr, row_start, N,
        NUM_SPEC, BLOCK_N)
    target_row = tl.load(target_predict_ptr + offsets, mask=in_tree, other=0)
    tl.store(accept_index_ptr + b * NUM_SPEC, last.to(tl.int32))
    target = _target_at(target_predict_ptr, target_row, lanes, row_start, last, True, N)
    num_accepted = 0
    steps = 0
    # One iteration per visited node: either accept it and descend, or move to its next sibling.
    # The step bound is never reached unless a sibling list is cyclic (where the CUDA kernel spins forever).
    while (cur != -1) & (steps < N * NUM_SPEC):
        # -2: node `cur` matches the target; else its next sibling (-1: none left, the walk ends).
        step = pick(tl.where(candidates == target, -2, next_sibling), lanes, cur)
        hit = step == -2
        draft_index = pick(retrieve_index, lanes, cur)
        tl.store(predicts_ptr + last, target.to(tl.int32), mask=hit)
        num_accepted += hit.to(tl.int32)
        tl.store(accept_index_ptr + b * NUM_SPEC + num_accepted, draft_index.to(tl.int32), mask=hit)
        last = tl.where(hit, draft_index, last)
        draft_target = _target_at(target_predict_ptr, target_row, lanes, row_start, draft_index, hit, N)
        target = tl.where(hit, draft_target, target)
        child = tl.where(num_accepted < NUM_SPEC - 1, pick(next_token, lanes, cur), -1)
        cur = tl.where(hit, child, step)
        steps += 1

    tl.store(accept_token_num_ptr + b, num_accepted)
    tl.store(predicts_ptr + last, target.to(tl.int32))


def verify_tree_greedy(
    predicts: torch.Tensor,
    accept_index: torch.Tensor,
    accept_token_num: torch.Tensor,
    candidates: torch.Tensor,
    retrieve_index: torch.Tensor,
    retrieve_next_token: torch.Tensor,
    retrieve_next_sibling: torch.Tensor,
    target_predict: torch.Tensor,
) -> None:
    """Greedy tree verification, in place: per request, descend from the root, at each level accepting the
    first child (in sibling order) whose draft token equals the target argmax at the last accepted node.

    Same positional arguments and results as ``sgl_kernel.verify_tree_greedy`` (there named ``retrive_*``);
    ``sgl_eagle_triton.devtools.reference.verify_greedy`` spells out the semantics.

    Outputs (pre-filled by the caller; only the elements below are written):
        predicts         [bs * n] int32: ``target_predict.flatten()[p]`` at every accepted position ``p``.
        accept_index     [bs, S + 1] int32: columns ``0 .. m``, accepted flat positions (root first).
        accept_token_num [bs] int32: ``m``, accepted draft tokens (root excluded), at most ``S``.
    Inputs, all [bs, n] int64 and contiguous: ``candidates``, ``retrieve_index``, ``retrieve_next_token``,
    ``retrieve_next_sibling`` (-1 = none) and ``target_predict``.

    CUDA-graph safe: no host sync, no allocation, grid ``(bs,)``.
    """
    bs, n = candidates.shape
    tensors = (predicts, accept_index, accept_token_num, candidates, retrieve_index, retrieve_next_token,
               retrieve_next_sibling, target_predict)
    assert all(t.is_contiguous() for t in tensors)
    _verify_tree_greedy_kernel[(bs,)](
        *tensors,
        N=n,
        NUM_SPEC=accept_index.shape[1],
        BLOCK_N=triton.next_power_of_2(max(n, 16)),
        num_warps=1,
    )
