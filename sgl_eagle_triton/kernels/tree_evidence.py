"""What one verify tells about acceptance per depth and sibling rank: counts for the cost-aware policy's
``TreeAcceptance`` over tree candidates (sgl_eagle_triton/adaptive.py), accumulated on the device.

One program per request walks its tree rows (held in registers, as verify_greedy) down the accepted path; every
sibling of a reached level adds to ``tried``, the accepted one to ``passed`` (atomics: requests share the table).
"""

import torch
import triton
import triton.language as tl

from sgl_eagle_triton.kernels.tree_rows import load_tree, pick


@triton.jit
def _tree_evidence_kernel(
    tried_ptr,
    passed_ptr,
    accept_index_ptr,
    accept_token_num_ptr,
    retrieve_index_ptr,
    retrieve_next_token_ptr,
    retrieve_next_sibling_ptr,
    N: tl.constexpr,
    NUM_SPEC: tl.constexpr,
    RANKS: tl.constexpr,
    ACCEPT_OFFSET: tl.constexpr,
    BLOCK_N: tl.constexpr,
):
    b = tl.program_id(0).to(tl.int64)
    lanes, _, _, _, retrieve_index, next_token, next_sibling, _, cur = load_tree(
        retrieve_index_ptr, retrieve_index_ptr, retrieve_next_token_ptr, retrieve_next_sibling_ptr, b * N, N,
        NUM_SPEC, BLOCK_N)
    accepted_drafts = tl.load(accept_token_num_ptr + b) - ACCEPT_OFFSET
    depth = 1
    rank = 0
    accepted = tl.full((), -1, tl.int64)  # loop-carried with the int64 node ids (compiled Triton checks the type)
    steps = 0
    # One iteration per reached node: count it at (depth, rank); at the end of a sibling list descend into the
    # accepted child, if any. The step bound only guards against a cyclic sibling list.
    while (cur != -1) & (steps < N * NUM_SPEC):
        on_path = depth <= accepted_drafts
        want = tl.load(accept_index_ptr + b * NUM_SPEC + depth, mask=on_path, other=-1)
        hit = on_path & (pick(retrieve_index, lanes, cur) == want)
        counted = rank < RANKS
        tl.atomic_add(tried_ptr + depth * RANKS + rank, 1.0, mask=counted)
        tl.atomic_add(passed_ptr + depth * RANKS + rank, 1.0, mask=counted & hit)
        accepted = tl.where(hit, cur, accepted)
        sibling = pick(next_sibling, lanes, cur)
        end_of_level = sibling == -1
        child = tl.where((accepted != -1) & (depth < NUM_SPEC - 1), pick(next_token, lanes, accepted), -1)
        cur = tl.where(end_of_level, child, sibling)
        depth = tl.where(end_of_level, depth + 1, depth)
        rank = tl.where(end_of_level, 0, rank + 1)
        accepted = tl.where(end_of_level, -1, accepted)
        steps += 1


def tree_evidence(
    tried: torch.Tensor,
    passed: torch.Tensor,
    accept_index: torch.Tensor,
    accept_token_num: torch.Tensor,
    retrieve_index: torch.Tensor,
    retrieve_next_token: torch.Tensor,
    retrieve_next_sibling: torch.Tensor,
    *,
    bonus_included: bool = False,
) -> None:
    """Adds one verify's reached nodes to ``tried`` / ``passed`` in place (semantics:
    ``sgl_eagle_triton.devtools.reference.tree_evidence``).

    tried, passed      [D, R] float32, contiguous, D >= S + 1 (row 0 unused; ranks >= R not counted)
    accept_index       [bs, S + 1] int32, accept_token_num [bs] int32: the verify's outputs (accepted drafts, or
                       with ``bonus_included`` SGLang's accept lengths: drafts + 1)
    retrieve_index, retrieve_next_token, retrieve_next_sibling: [bs, n] int64, contiguous (its tree rows)

    CUDA-graph safe: no host sync, no allocation, grid ``(bs,)``.
    """
    bs, n = retrieve_index.shape
    tensors = (tried, passed, accept_index, accept_token_num, retrieve_index, retrieve_next_token,
               retrieve_next_sibling)
    assert all(t.is_contiguous() for t in tensors) and tried.shape == passed.shape
    assert tried.shape[0] >= accept_index.shape[1]
    _tree_evidence_kernel[(bs,)](
        *tensors,
        N=n,
        NUM_SPEC=accept_index.shape[1],
        RANKS=tried.shape[1],
        ACCEPT_OFFSET=int(bonus_included),
        BLOCK_N=triton.next_power_of_2(max(n, 16)),
        num_warps=1,
    )
