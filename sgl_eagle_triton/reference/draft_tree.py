"""Random EAGLE draft trees shaped exactly as SGLang's drafter shapes them (test and benchmark inputs)."""

import torch

from sgl_eagle_triton.reference.draft_select import organize, select_step


def draft_tree(bs: int, topk: int, steps: int, n: int, gen: torch.Generator):
    """``(parent_list, selected_index)`` as SGLang's EAGLE draft makes them.

    Runs the selection twins (``select_top_k_tokens`` per draft step, ``organize_draft_results``) on random
    draft probabilities. Scores are cumulative products of probabilities in (0, 1) in float64, so they are
    tie-free and a child always scores below its parent: every selected node's parent is selected too
    (asserted).
    """

    def probs(*shape):
        return torch.rand(*shape, generator=gen, dtype=torch.float64) * 0.9 + 0.05

    scores, score_list, token_list, parents_list = None, [], [], []
    for step in range(steps):
        p = probs(bs, topk) if step == 0 else probs(bs, topk, topk).view(bs * topk, topk)
        _, _, scores, cand_scores, cand_tokens, parents = select_step(step, p, torch.zeros_like(p, dtype=torch.long),
                                                                      scores, topk)
        score_list.append(cand_scores)
        token_list.append(cand_tokens)
        parents_list.append(parents)
    parent_list, selected_index, _ = organize(score_list, token_list, parents_list, n)
    assert parent_list.shape[1] in (0, topk * (steps - 1) + 1)
    for parents, selected in zip(parent_list.tolist(), selected_index.tolist(), strict=True):
        assert all(s // topk == 0 or parents[s // topk] in selected for s in selected)
    return parent_list, selected_index
