"""Random EAGLE draft trees shaped exactly as SGLang's drafter shapes them (test and benchmark inputs)."""

import torch


def draft_tree(bs: int, topk: int, steps: int, n: int, gen: torch.Generator):
    """``(parent_list, selected_index)`` as SGLang's EAGLE draft makes them.

    Re-implements ``select_top_k_tokens`` (one step per draft forward) and
    ``organize_draft_results`` on random draft probabilities. Scores are cumulative products of
    probabilities in (0, 1) in float64, so they are tie-free and a child always scores below
    its parent: every selected node's parent is selected too (asserted).
    """

    def probs(*shape):
        return torch.rand(*shape, generator=gen, dtype=torch.float64) * 0.9 + 0.05

    scores = probs(bs, topk)
    score_list = [scores[:, None, :]]
    parents_list = [torch.arange(-1, topk).expand(bs, -1)]
    for i in range(1, steps):
        expand_scores = scores[:, :, None] * probs(bs, topk, topk)
        scores, cs_index = expand_scores.flatten(1).topk(topk, dim=-1)
        score_list.append(expand_scores)
        parents_list.append(cs_index + topk * topk * (i - 1) + topk)
    all_scores = torch.cat(score_list, dim=1).flatten(1)
    selected_index = all_scores.topk(n - 1, dim=-1).indices.sort(dim=-1).values
    if steps > 1:
        parent_list = torch.cat(parents_list[:-1], dim=1)
    else:
        parent_list = torch.empty(bs, 0, dtype=torch.long)
    assert parent_list.shape[1] in (0, topk * (steps - 1) + 1)
    for parents, selected in zip(parent_list.tolist(), selected_index.tolist()):
        assert all(s // topk == 0 or parents[s // topk] in selected for s in selected)
    return parent_list, selected_index
