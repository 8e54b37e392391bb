"""The draft's final prune, SGLang's ``organize_draft_results``: the ``n - 1`` best of a request's ``T``
candidates, in candidate order, with their tokens. One program per request.

A candidate's rank is the number of candidates scoring above it (the lower index first on exact ties,
where ``torch.topk`` leaves the order unspecified); the kept ones are those ranked below ``n - 1``, and each
lands at the count of kept candidates before it. No sort of the scores.
"""

import torch
import triton
import triton.language as tl

from sgl_eagle_triton.kernels.pdl import pdl_args, wait_for_prior


@triton.jit
def _draft_organize_kernel(
    all_scores_ptr,
    all_tokens_ptr,
    top_scores_index_ptr,
    draft_tokens_ptr,
    T: tl.constexpr,
    KEEP: tl.constexpr,
    BLOCK_T: tl.constexpr,
    CHUNK: tl.constexpr,
    USE_GDC: tl.constexpr,
):
    wait_for_prior(USE_GDC)
    b = tl.program_id(0).to(tl.int64)
    lanes = tl.arange(0, BLOCK_T)
    live = lanes < T
    scores = tl.load(all_scores_ptr + b * T + lanes, mask=live, other=-float("inf"))
    scores = tl.where(scores == scores, scores, -float("inf"))  # NaN ranks last: exactly KEEP are kept
    rank = tl.zeros([BLOCK_T], dtype=tl.int32)
    for c0 in range(0, T, CHUNK):
        others = c0 + tl.arange(0, CHUNK)
        other_scores = tl.load(all_scores_ptr + b * T + others, mask=others < T, other=-float("inf"))
        other_scores = tl.where(other_scores == other_scores, other_scores, -float("inf"))
        above = (other_scores[None, :] > scores[:, None]) | (
            (other_scores[None, :] == scores[:, None]) & (others[None, :] < lanes[:, None])
        )
        rank += tl.sum(above.to(tl.int32), axis=1)
    kept = live & (rank < KEEP)  # ranks form a total order (ties by index), so exactly KEEP lanes
    slot = tl.cumsum(kept.to(tl.int32), axis=0) - 1
    tokens = tl.load(all_tokens_ptr + b * T + lanes, mask=kept, other=0)
    tl.store(top_scores_index_ptr + b * KEEP + slot, lanes.to(tl.int64), mask=kept)
    tl.store(draft_tokens_ptr + b * KEEP + slot, tokens, mask=kept)


def draft_organize(
    all_scores: torch.Tensor, all_tokens: torch.Tensor, top_scores_index: torch.Tensor, draft_tokens: torch.Tensor
) -> None:
    """all_scores: [bs, T] fp32, all_tokens: [bs, T] int64 -> top_scores_index, draft_tokens: [bs, n-1] int64
    (written in place; all contiguous; ``n - 1 <= T``)."""
    bs, T = all_scores.shape
    keep = top_scores_index.shape[1]
    assert keep <= T and draft_tokens.shape == top_scores_index.shape
    block_t = triton.next_power_of_2(T)
    _draft_organize_kernel[(bs,)](
        all_scores,
        all_tokens,
        top_scores_index,
        draft_tokens,
        T=T,
        KEEP=keep,
        BLOCK_T=block_t,
        CHUNK=min(block_t, 32),
        **pdl_args(all_scores.device),
        num_warps=4,
    )
