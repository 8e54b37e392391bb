"""PyTorch twins of the draft's tree selection: SGLang 0.5.17's ``select_top_k_tokens`` (spec_utils.py) and
``organize_draft_results`` (eagle_utils.py), restated with explicit hidden-row indices instead of gathered
hidden states. Oracles for :mod:`sgl_eagle_triton.kernels.draft_select` and ``draft_organize``.

SGLang's ``torch.topk`` leaves the order of exactly tied scores unspecified; the twins (as the kernels) rank
them lower index first, and a NaN score last."""

import torch


def _top(scores: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``(values, indices)`` of each row's ``k`` largest, descending, lower index first on ties, NaN last."""
    ranked = torch.where(scores.isnan(), float("-inf"), scores)
    indices = torch.sort(ranked, dim=-1, descending=True, stable=True).indices[..., :k]
    return scores.gather(-1, indices), indices


def select_step(step: int, p: torch.Tensor, index: torch.Tensor, scores: torch.Tensor | None, k: int):
    """One step's frontier. p, index: [bs, k] (step 0, target ids) or [bs * k, k]; scores: [bs, k] or None.

    Returns ``(input_ids [bs*k], hidden_rows [bs*k], scores [bs, k], cand_scores, cand_tokens, parents)``;
    candidates are [bs, k] (step 0) or [bs, k^2], parents [bs, k + 1] (step 0) or [bs, k].
    """
    if step == 0:
        bs = p.shape[0]
        parents = torch.arange(-1, k, device=p.device).expand(bs, -1)
        return index.flatten(), torch.arange(bs, device=p.device).repeat_interleave(k), p, p, index, parents
    bs = p.shape[0] // k
    expand = (scores[:, :, None] * p.view(bs, k, k)).flatten(1)
    tokens = index.view(bs, k * k)
    new_scores, chosen = _top(expand, k)
    input_ids = tokens.gather(1, chosen).flatten()
    hidden_rows = (chosen // k + torch.arange(bs, device=p.device)[:, None] * k).flatten()
    parents = chosen + k * k * (step - 1) + k
    return input_ids, hidden_rows, new_scores, expand, tokens, parents


def organize(score_list, token_list, parents_list, num_draft_tokens: int):
    """``(parent_list [bs, k(S-1)+1], top_scores_index [bs, n-1], draft_tokens [bs, n-1])`` from the
    per-step candidate scores, tokens and parents (lists of S tensors)."""
    all_scores = torch.cat(score_list, dim=1)
    all_tokens = torch.cat(token_list, dim=1)
    top_scores_index = _top(all_scores, num_draft_tokens - 1)[1].sort(dim=-1).values
    draft_tokens = all_tokens.gather(1, top_scores_index)
    bs = all_scores.shape[0]
    if len(parents_list) > 1:
        parent_list = torch.cat(parents_list[:-1], dim=1)
    else:
        parent_list = torch.empty(bs, 0, dtype=torch.long, device=all_scores.device)
    return parent_list, top_scores_index, draft_tokens
