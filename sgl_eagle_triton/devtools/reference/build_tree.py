"""Plain-PyTorch twin of :mod:`sgl_eagle_triton.kernels.build_tree` (oracle only).

A serial loop per request that mirrors sgl-kernel's CUDA ``build_tree_efficient``:
node 0 is the root (bonus token), node ``r >= 1`` is draft ``selected_index[b, r - 1]``.
A node whose parent token was not selected is "invalid": it is left out of the
next-token / next-sibling links, and walking up its ancestors stops there (CUDA has
undefined behaviour in that case; this is the semantics the Triton kernel reproduces).
"""

import torch

FULL_MASK, QLEN_ONLY, QLEN_ONLY_BITPACKING = 0, 1, 2
PACKED_DTYPES = {1: torch.uint8, 2: torch.uint16, 4: torch.uint32}


def packed_mask_dtype(draft_token_num: int) -> torch.dtype:
    """Integer dtype holding one bit-packed mask row of ``draft_token_num`` bits."""
    if draft_token_num > 32:
        raise ValueError(f"QLEN_ONLY_BITPACKING supports draft_token_num <= 32, got {draft_token_num}")
    return PACKED_DTYPES[1 if draft_token_num <= 8 else 2 if draft_token_num <= 16 else 4]


def tree_parents(parent_list: list, selected: list, topk: int) -> list:
    """Parent node of every node of one request (-1 for the root and invalid nodes)."""
    parents = [-1]
    for sel in selected:
        tb = sel // topk
        if tb == 0:
            parents.append(0)
        else:
            target = parent_list[tb]
            parents.append(1 + selected.index(target) if target in selected else -1)
    return parents


def build_tree_(
    parent_list: torch.Tensor,
    selected_index: torch.Tensor,
    verified_seq_len: torch.Tensor,
    tree_mask: torch.Tensor,
    positions: torch.Tensor,
    retrieve_index: torch.Tensor,
    retrieve_next_token: torch.Tensor,
    retrieve_next_sibling: torch.Tensor,
    topk: int,
    depth: int,
    draft_token_num: int,
    tree_mask_mode: int,
    fill_prefix: bool = False,
) -> None:
    """Same contract as :func:`sgl_eagle_triton.kernels.build_tree.build_tree_`."""
    n, mode, bs = draft_token_num, int(tree_mask_mode), selected_index.shape[0]
    seq_lens = verified_seq_len.tolist()
    mask = [[[c == 0 for c in range(n)] for _ in range(n)] for _ in range(bs)]  # [bs][r][c]
    pos = [[seq_len] * n for seq_len in seq_lens]
    next_token = [[-1] * n for _ in range(bs)]
    next_sibling = [[-1] * n for _ in range(bs)]
    for b in range(bs):
        parents = tree_parents(parent_list[b].tolist(), selected_index[b].tolist(), topk)
        # CUDA links children from the last node down: the head is the smallest child.
        for r in range(n - 1, 0, -1):
            p = parents[r]
            if p >= 0:
                next_sibling[b][r] = next_token[b][p]
                next_token[b][p] = r
        for r in range(n):
            c = r
            while c > 0:  # walk up to the root, or to an invalid node
                mask[b][r][c] = True
                pos[b][r] += 1
                c = parents[c]

    device = positions.device
    positions.copy_(torch.tensor(pos, device=device).flatten())
    retrieve_index.copy_(torch.arange(bs * n, device=device).view(bs, n))
    retrieve_next_token.copy_(torch.tensor(next_token, device=device))
    retrieve_next_sibling.copy_(torch.tensor(next_sibling, device=device))

    cells = torch.tensor(mask, device=device)  # [bs, n, n] bool
    if mode == FULL_MASK:
        start = 0
        for b, seq_len in enumerate(seq_lens):
            rows = tree_mask[start : start + n * (seq_len + n)].view(n, seq_len + n)
            if fill_prefix:
                rows[:, :seq_len] = True
            rows[:, seq_len:] = cells[b]
            start += n * (seq_len + n)
    elif mode == QLEN_ONLY:
        tree_mask[: bs * n * n] = cells.flatten()
    elif mode == QLEN_ONLY_BITPACKING:
        width = tree_mask.element_size()
        if width != packed_mask_dtype(n).itemsize:
            raise ValueError(f"tree_mask needs {packed_mask_dtype(n)} for draft_token_num={n}")
        bits = (cells.long() << torch.arange(n, device=device)).sum(-1).flatten()  # [bs * n]
        little_endian = (bits[:, None] >> 8 * torch.arange(width, device=device)) & 0xFF
        tree_mask.view(torch.uint8).view(-1, width)[: bs * n] = little_endian
    else:
        raise ValueError(f"unknown tree_mask_mode {tree_mask_mode}")


def build_tree_kernel_efficient(
    bonus_tokens: torch.Tensor,
    parent_list: torch.Tensor,
    top_scores_index: torch.Tensor,
    draft_tokens: torch.Tensor,
    seq_lens: torch.Tensor,
    seq_lens_sum: int,
    topk: int,
    spec_steps: int,
    num_verify_tokens: int,
    tree_mask_mode: int = FULL_MASK,
    tree_mask_buf: torch.Tensor | None = None,
    fill_prefix_mask: bool = True,
):
    """SGLang 0.5.17's ``eagle_utils.build_tree_kernel_efficient``: same fills, same buffers."""
    draft_tokens = torch.cat((bonus_tokens.unsqueeze(1), draft_tokens), dim=1).flatten()
    n, mode, bs = num_verify_tokens, int(tree_mask_mode), seq_lens.numel()
    if mode == QLEN_ONLY_BITPACKING:
        init, size, dtype = 0, n * bs, packed_mask_dtype(n)
    elif mode == QLEN_ONLY:
        init, size, dtype = True, n * n * bs, torch.bool
    else:
        init, size, dtype = True, seq_lens_sum * n + n * n * bs, torch.bool
    device = seq_lens.device
    tree_mask = tree_mask_buf if tree_mask_buf is not None else torch.empty(size, dtype=dtype, device=device)
    if mode != FULL_MASK or fill_prefix_mask:
        tree_mask.view(torch.uint8).fill_(init)
    retrieve_index, retrieve_next_token, retrieve_next_sibling = torch.full((3, bs, n), -1, device=device)
    positions = torch.empty(bs * n, dtype=torch.long, device=device)
    build_tree_(
        parent_list, top_scores_index, seq_lens, tree_mask, positions, retrieve_index,
        retrieve_next_token, retrieve_next_sibling, topk, spec_steps, n, mode,
    )
    return tree_mask, positions, retrieve_index, retrieve_next_token, retrieve_next_sibling, draft_tokens
