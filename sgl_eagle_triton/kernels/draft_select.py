"""Frontier selection of one draft step: SGLang's ``select_top_k_tokens`` plus the tree bookkeeping that
``organize_draft_results`` later reads, one program per request.

Step 0 takes the draft extend's ``topk_p`` / ``topk_index`` (``[bs, k]``, draft vocabulary, mapped through
``token_map``): the frontier is those ``k`` tokens, every row reads the request's hidden state.
Step ``i >= 1`` takes the previous forward's ``[bs * k, k]`` probabilities and target ids: the ``k^2``
children score ``E[j, c] = scores[j] * p[j, c]``, the frontier is their top ``k`` (descending, the lower
child index first on exact ties), and frontier row ``m`` continues the hidden state of parent row ``c_m // k``.

Tree buffers (``T = k + (S - 1) k^2`` candidates per request, written at the step's offset): ``all_scores``
/ ``all_tokens`` receive the step's ``k`` (step 0) or ``k^2`` candidates; ``parents`` ``[bs, k (S-1) + 1]``
receives ``[-1, 0 .. k-1]`` (step 0) or the frontier's candidate ids ``c_m + k^2 (i - 1) + k``, for steps
``i < S - 1`` only (the last step's frontier is never expanded). Positions: each forward step reads
``positions + i``; the last step leaves ``positions`` advanced by ``S - 1`` (SGLang's contract).
"""

import torch
import triton
import triton.language as tl

from sgl_eagle_triton.kernels.pdl import pdl_args, wait_for_prior


@triton.jit
def _draft_select_kernel(
    p_ptr,
    index_ptr,
    token_map_ptr,
    scores_ptr,
    input_ids_ptr,
    hidden_rows_ptr,
    all_scores_ptr,
    all_tokens_ptr,
    parents_ptr,
    positions_ptr,
    step_positions_ptr,
    STEP: tl.constexpr,
    NUM_STEPS: tl.constexpr,
    K: tl.constexpr,
    MAP_TOKENS: tl.constexpr,
    BLOCK_E: tl.constexpr,
    USE_GDC: tl.constexpr,
):
    wait_for_prior(USE_GDC)
    b = tl.program_id(0).to(tl.int64)
    T: tl.constexpr = K + (NUM_STEPS - 1) * K * K
    P: tl.constexpr = K * (NUM_STEPS - 1) + 1
    lanes = tl.arange(0, BLOCK_E)
    if STEP == 0:
        live = lanes < K
        E = tl.load(p_ptr + b * K + lanes, mask=live, other=0.0)
        tokens = tl.load(index_ptr + b * K + lanes, mask=live, other=0)
        if MAP_TOKENS:
            tokens = tl.load(token_map_ptr + tokens, mask=live, other=0)
        offset = 0
    else:
        live = lanes < K * K
        parent = lanes // K
        prev = tl.load(scores_ptr + b * K + parent, mask=live, other=0.0)
        E = prev * tl.load(p_ptr + b * K * K + lanes, mask=live, other=0.0)
        tokens = tl.load(index_ptr + b * K * K + lanes, mask=live, other=0)
        offset = K + (STEP - 1) * K * K
    tl.store(all_scores_ptr + b * T + offset + lanes, E, mask=live)
    tl.store(all_tokens_ptr + b * T + offset + lanes, tokens, mask=live)

    rows = b * K + lanes
    row_ok = lanes < K
    if STEP < NUM_STEPS - 1:
        tl.store(step_positions_ptr + rows, tl.load(positions_ptr + rows, mask=row_ok) + STEP, mask=row_ok)
    elif STEP > 0:
        tl.store(positions_ptr + rows, tl.load(positions_ptr + rows, mask=row_ok) + STEP, mask=row_ok)
    if STEP < NUM_STEPS - 1:
        if STEP == 0:
            tl.store(parents_ptr + b * P + lanes, lanes - 1, mask=lanes < K + 1)
            tl.store(input_ids_ptr + b * K + lanes, tokens, mask=live)
            tl.store(hidden_rows_ptr + b * K + lanes, b + lanes * 0, mask=live)
            tl.store(scores_ptr + b * K + lanes, E, mask=live)
        else:
            taken = ~live
            ranked = tl.where(E == E, E, -float("inf"))  # a NaN score (a broken request) ranks last
            for m in range(K):
                best = tl.max(tl.where(taken, -float("inf"), ranked), axis=0)
                c = tl.min(tl.where(~taken & (ranked == best), lanes, BLOCK_E), axis=0)
                taken = taken | (lanes == c)
                token = tl.sum(tl.where(lanes == c, tokens, 0), axis=0)
                tl.store(input_ids_ptr + b * K + m, token)
                tl.store(hidden_rows_ptr + b * K + m, b * K + c // K)
                tl.store(scores_ptr + b * K + m, best)
                tl.store(parents_ptr + b * P + K + 1 + (STEP - 1) * K + m, c + K * K * (STEP - 1) + K)


def draft_select(
    step: int,
    num_steps: int,
    p: torch.Tensor,
    index: torch.Tensor,
    scores: torch.Tensor,
    input_ids: torch.Tensor,
    hidden_rows: torch.Tensor,
    all_scores: torch.Tensor,
    all_tokens: torch.Tensor,
    parents: torch.Tensor,
    positions: torch.Tensor,
    step_positions: torch.Tensor,
    token_map: torch.Tensor | None = None,
) -> None:
    """One step's selection, in place.

    p: [bs, k] (step 0) or [bs * k, k] fp32; index: same shape, int64 (draft vocabulary at step 0 when
    ``token_map`` [Vd] int64 is given, else target ids); scores: [bs, k] fp32 (read at steps >= 1, written);
    input_ids: [bs * k] int64; hidden_rows: [bs * k] int64; all_scores: [bs, T] fp32; all_tokens: [bs, T]
    int64; parents: [bs, k (S-1) + 1] int64; positions: [bs * k] int64, the rows' draft-start positions;
    step_positions: [bs * k] int64, receives ``positions + step`` for the step's forward. The last step
    (``S - 1 > 0``) advances ``positions`` by ``S - 1`` in place, as SGLang's draft forward leaves them.
    All contiguous; ``step`` and ``num_steps`` are static.
    """
    bs, k = scores.shape
    assert 0 <= step < num_steps and p.shape == index.shape == ((bs, k) if step == 0 else (bs * k, k))
    _draft_select_kernel[(bs,)](
        p,
        index,
        token_map if token_map is not None else index,
        scores,
        input_ids,
        hidden_rows,
        all_scores,
        all_tokens,
        parents,
        positions,
        step_positions,
        STEP=step,
        NUM_STEPS=num_steps,
        K=k,
        MAP_TOKENS=token_map is not None and step == 0,
        BLOCK_E=triton.next_power_of_2(k * k if step else k + 1),
        **pdl_args(scores.device),
        num_warps=1,
    )
