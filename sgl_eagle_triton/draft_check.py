"""Draft check mode: every draft runs twice, ours then SGLang's, and the two trees are compared.

Enabled by ``SGLANG_EAGLE_TRITON_DRAFT_CHECK=<file.jsonl>`` (eager only: the comparison syncs with the
host, so :mod:`sgl_eagle_triton.config` requires ``--disable-cuda-graph`` with it). Trees are compared
as sets of root-to-node token paths: bf16 logits tie exactly quite often, and ``torch.topk`` orders tied
siblings its own way, which permutes candidate ids without changing the tree. One JSON line per draft:
requests with identical trees (as path sets) and with identical candidate ids, the largest relative
difference of the scores of common paths, the median and largest relative difference of the first
forward's child scores (one forward's numerics, before any divergence), and for each differing request
the smallest relative gap between two of SGLang's candidate scores (a bf16 near-tie is below ``NEAR_TIE``).
"""

from __future__ import annotations

import json
import os

import torch

from sgl_eagle_triton.config import DRAFT_CHECK_ENV

NEAR_TIE = 1e-2


def check_file() -> str | None:
    return os.environ.get(DRAFT_CHECK_ENV) or None


def _paths(parent_list, top_scores_index, draft_tokens, topk: int) -> dict:
    """``{token path from the root: candidate id}`` of one request's selected nodes (host lists)."""
    token_of = dict(zip(top_scores_index, draft_tokens, strict=True))
    memo: dict = {}

    def path(c):
        if c not in memo:
            tb = c // topk
            memo[c] = (path(parent_list[tb]) if tb > 0 else ()) + (token_of.get(c, -1),)
        return memo[c]

    return {path(c): c for c in top_scores_index}


def _min_rel_gap(scores: torch.Tensor) -> float:
    s = scores.double().sort(descending=True).values
    gaps = (s[:-1] - s[1:]) / s[:-1].abs().clamp_min(1e-30)
    return gaps.min().item() if gaps.numel() else float("inf")


def _first_forward_diff(ours_scores: torch.Tensor, stock_scores: torch.Tensor | None, topk: int):
    """``([median, max], worst)``: relative difference of the first draft forward's child scores and, for the
    request holding the max, both sides' sorted child scores ``[topk, topk]``; ``(None, None)`` without scores.

    The step-1 candidates ``scores[j] * p[j, c]`` follow one forward from the same input frontier in both
    drafts (nothing upstream can have diverged), so this isolates one forward's numerics; children are
    compared sorted within each parent, since tied tokens may be listed in either order."""
    width = topk + topk * topk
    if stock_scores is None or stock_scores.shape[1] < width:
        return None, None
    ours = ours_scores[:, topk:width].reshape(-1, topk, topk).sort(dim=-1).values
    theirs = stock_scores[:, topk:width].reshape(-1, topk, topk).sort(dim=-1).values
    rel = (ours - theirs).abs() / theirs.abs().clamp_min(1e-30)
    worst = divmod(int(rel.flatten().argmax()), topk * topk)[0]  # the request holding the largest difference
    return [rel.median().item(), rel.max().item()], {"request": worst, "ours": ours[worst].tolist(),
                                                     "stock": theirs[worst].tolist()}


def record(path: str, ours, stock, stock_scores: torch.Tensor | None, topk: int) -> dict:
    """Compare ``ours`` = (parent_list, top_scores_index, draft_tokens, all_scores) with SGLang's
    ``stock`` = (parent_list, top_scores_index, draft_tokens, ...) and its candidate scores [bs, T]
    (None on SGLang's topk-1 path, which keeps none); append the summary line to ``path``."""
    ours_host = [t.tolist() for t in ours[:3]]
    stock_host = [t.tolist() for t in stock[:3]]
    bs = len(ours_host[2])
    line = {"bs": bs, "same_tree": 0, "same_ids": 0, "max_rel_score_diff": None, "differing_min_rel_gap": []}
    errors = []
    for b in range(bs):
        mine = _paths(ours_host[0][b], ours_host[1][b], ours_host[2][b], topk)
        theirs = _paths(stock_host[0][b], stock_host[1][b], stock_host[2][b], topk)
        line["same_ids"] += all(o[b] == s[b] for o, s in zip(ours_host, stock_host, strict=True))
        if mine.keys() == theirs.keys():
            line["same_tree"] += 1
            if stock_scores is not None:
                errors += [abs(ours[3][b, mine[p]].item() / stock_scores[b, theirs[p]].item() - 1) for p in mine]
        elif stock_scores is not None:
            line["differing_min_rel_gap"].append(_min_rel_gap(stock_scores[b]))
    line["max_rel_score_diff"] = max(errors, default=None)
    line["first_forward_rel_p_diff"], line["first_forward_worst"] = _first_forward_diff(ours[3], stock_scores, topk)
    with open(path, "a") as f:
        f.write(json.dumps(line) + "\n")
    return line
