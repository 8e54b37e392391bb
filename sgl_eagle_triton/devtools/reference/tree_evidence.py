"""Plain-PyTorch twin of :mod:`sgl_eagle_triton.kernels.tree_evidence`: what one verify tells about acceptance per
depth and sibling rank (the cost-aware policy's ``TreeAcceptance`` over tree candidates)."""

import torch


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
    """Adds one verify's reached nodes to the counts, in place.

    Per request, from the root down the accepted path: at every level the walk reached (depth ``d`` = 1 for the
    root's children, up to the accepted drafts + 1 and at most ``S``), each child of sibling rank ``r`` (its place
    in the sibling list) adds 1 to ``tried[d, r]``, and the accepted child (whose flat position is
    ``accept_index[b, d]``) 1 to ``passed[d, r]``; ranks ``>= R`` are not counted.

    tried, passed      [D, R] float32, D >= S + 1 (row 0 unused)
    accept_index       [bs, S + 1] int32: accepted flat positions, root first (the verify's output)
    accept_token_num   [bs] int32: accepted drafts per request (``bonus_included``: drafts + 1, SGLang's accept lengths)
    retrieve_index, retrieve_next_token, retrieve_next_sibling: [bs, n] int64 (the verify's tree rows)
    """
    bs = retrieve_index.shape[0]
    num_spec, ranks = accept_index.shape[1], tried.shape[1]
    for b in range(bs):
        k = int(accept_token_num[b]) - int(bonus_included)
        node = 0
        for depth in range(1, num_spec):
            child, rank, accepted = int(retrieve_next_token[b, node]), 0, -1
            while child != -1:
                hit = depth <= k and int(retrieve_index[b, child]) == int(accept_index[b, depth])
                if rank < ranks:
                    tried[depth, rank] += 1
                    passed[depth, rank] += hit
                if hit:
                    accepted = child
                child = int(retrieve_next_sibling[b, child])
                rank += 1
            if accepted == -1:
                break
            node = accepted
