"""Benchmark-only: a simulated verification walk of an EAGLE draft tree, for targets whose weights accept nothing
(dummy weights at real shapes). One program per request, the walk of ``verify_greedy`` with a coin for a target.

At each level of the walk one coin ``u`` (uniform in [0, 1)) is drawn; the level's children are visited in sibling
order and the child of sibling rank ``r`` (0-based) is accepted when ``u < cum_prob[level, r]`` (the chance that
the target's token is one of the level's first ``r + 1`` draft candidates), so rank ``r`` is accepted with
probability ``cum_prob[level, r] - cum_prob[level, r - 1]`` given no earlier sibling was.
"""

import torch
import triton
import triton.language as tl

from sgl_eagle_triton.kernels.tree_rows import load_tree, pick


@triton.jit
def _simulated_walk_kernel(
    predicts_ptr,
    accept_index_ptr,
    accept_token_num_ptr,
    candidates_ptr,
    retrieve_index_ptr,
    retrieve_next_token_ptr,
    retrieve_next_sibling_ptr,
    coins_ptr,
    cum_prob_ptr,
    bonus_token,
    N: tl.constexpr,
    NUM_SPEC: tl.constexpr,
    LEVELS: tl.constexpr,
    RANKS: tl.constexpr,
    BLOCK_N: tl.constexpr,
):
    b = tl.program_id(0).to(tl.int64)
    row_start = b * N
    lanes, in_tree, offsets, candidates, retrieve_index, next_token, next_sibling, last, cur = load_tree(
        candidates_ptr, retrieve_index_ptr, retrieve_next_token_ptr, retrieve_next_sibling_ptr, row_start, N,
        NUM_SPEC, BLOCK_N)
    tl.store(accept_index_ptr + b * NUM_SPEC, last.to(tl.int32))
    num_accepted = 0
    rank = 0
    steps = 0
    while (cur != -1) & (steps < N * NUM_SPEC):
        level = tl.minimum(num_accepted, LEVELS - 1)
        coin = tl.load(coins_ptr + b * NUM_SPEC + num_accepted)
        threshold = tl.load(cum_prob_ptr + level * RANKS + tl.minimum(rank, RANKS - 1))
        hit = coin < threshold
        draft_index = pick(retrieve_index, lanes, cur)
        tl.store(predicts_ptr + last, pick(candidates, lanes, cur).to(tl.int32), mask=hit)
        num_accepted += hit.to(tl.int32)
        tl.store(accept_index_ptr + b * NUM_SPEC + num_accepted, draft_index.to(tl.int32), mask=hit)
        last = tl.where(hit, draft_index, last)
        child = tl.where(num_accepted < NUM_SPEC - 1, pick(next_token, lanes, cur), -1)
        cur = tl.where(hit, child, pick(next_sibling, lanes, cur))
        rank = tl.where(hit, 0, rank + 1)
        steps += 1

    tl.store(accept_token_num_ptr + b, num_accepted)
    tl.store(predicts_ptr + last, bonus_token)


def simulated_walk(
    predicts: torch.Tensor,
    accept_index: torch.Tensor,
    accept_token_num: torch.Tensor,
    candidates: torch.Tensor,
    retrieve_index: torch.Tensor,
    retrieve_next_token: torch.Tensor,
    retrieve_next_sibling: torch.Tensor,
    coins: torch.Tensor,
    cum_prob: torch.Tensor,
    bonus_token: int = 100,
) -> None:
    """Simulated tree verification, in place, with ``verify_tree_greedy``'s outputs: ``predicts`` [bs * n] int32
    (at each accepted position the accepted child's draft token, at the last one ``bonus_token``),
    ``accept_index`` [bs, S + 1] int32 (columns ``0 .. m``), ``accept_token_num`` [bs] int32 (``m``).

    Inputs: the tree rows as ``verify_tree_greedy``'s ([bs, n] int64, contiguous); ``coins`` [bs, S + 1] fp32 in
    [0, 1) (column ``m``: the coin of level ``m``); ``cum_prob`` [L, K] fp32: row ``min(level, L - 1)``, column
    ``min(rank, K - 1)`` is the chance that the target picks one of the level's first ``rank + 1`` siblings
    (non-decreasing along a row, at most 1). ``sgl_eagle_triton.devtools.reference.simulated_walk`` spells it out.
    CUDA-graph safe: grid ``(bs,)``, no host sync, no allocation.
    """
    bs, n = candidates.shape
    tensors = (predicts, accept_index, accept_token_num, candidates, retrieve_index, retrieve_next_token,
               retrieve_next_sibling, coins, cum_prob)
    assert all(t.is_contiguous() for t in tensors)
    assert coins.shape == accept_index.shape and coins.dtype == cum_prob.dtype == torch.float32
    _simulated_walk_kernel[(bs,)](
        *tensors,
        bonus_token,
        N=n,
        NUM_SPEC=accept_index.shape[1],
        LEVELS=cum_prob.shape[0],
        RANKS=cum_prob.shape[1],
        BLOCK_N=triton.next_power_of_2(max(n, 16)),
        num_warps=1,
    )
