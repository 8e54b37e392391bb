"""EAGLE draft-tree construction: a parallel Triton port of sgl-kernel's ``build_tree_kernel_efficient``.

Node 0 of request ``b`` is the root (bonus token); node ``r >= 1`` is the draft token
``selected_index[b, r - 1]``. Its parent is the root when ``selected_index // topk == 0``,
otherwise the node whose ``selected_index`` equals ``parent_list[b, selected_index // topk]``.

Parallel algorithm (grid ``(bs, FILL_SPLIT)``; program ``(b, 0)`` builds request ``b``'s tree
with one lane per node, ``BLOCK_N = next_pow2(max(n, 16))`` lanes):

1. ``par[r]`` = first column ``c`` of the ``[BLOCK_N, BLOCK_N]`` equality ``selected[c] == target[r]``.
2. ``next_token[p]`` = min ``r`` with ``par[r] == p``; ``next_sibling[r]`` = min ``r' > r`` with
   ``par[r'] == par[r]`` (both masked min-reductions over ``[BLOCK_N, BLOCK_N]`` tiles). This is
   what CUDA's serial linking loop (``r`` from ``n - 1`` down to 1) leaves behind.
3. Ancestor closure by repeated squaring of the 0/1 matrix ``A = I + parent`` with ``tl.dot``:
   ``log2(BLOCK_N)`` rounds cover any chain, so ``A[r, c]`` = "c is r or an ancestor of r".
   Tree mask row ``r`` = ``A[r] | (c == 0)``, and ``positions[r] = seq_len + sum_{c >= 1} A[r, c]``.
4. For FULL_MASK with ``fill_prefix``, the ``FILL_SPLIT`` programs of request ``b`` share the
   ``True`` fill of its ``[n, seq_len]`` prefix columns in ``[BLOCK_N, BLOCK_L]`` tiles.

A node whose parent token was not selected (CUDA warns: "invalid eagle tree") stays unlinked and
its ancestor walk stops at it; nothing is read or written out of bounds.
"""

import math

import torch
import triton
import triton.language as tl

FULL_MASK, QLEN_ONLY, QLEN_ONLY_BITPACKING = 0, 1, 2
PACKED_DTYPES = {1: torch.uint8, 2: torch.uint16, 4: torch.uint32}
_STORE_DTYPES = {1: torch.uint8, 2: torch.int16, 4: torch.int32}  # same bits, Triton-friendly
FILL_SPLIT, BLOCK_L, BLOCK_B = 8, 128, 128


def packed_mask_dtype(draft_token_num: int) -> torch.dtype:
    """Integer dtype holding one bit-packed mask row of ``draft_token_num`` bits."""
    if draft_token_num > 32:
        raise ValueError(f"QLEN_ONLY_BITPACKING supports draft_token_num <= 32, got {draft_token_num}")
    return PACKED_DTYPES[1 if draft_token_num <= 8 else 2 if draft_token_num <= 16 else 4]


@triton.jit
def _build_tree_kernel(
    parent_ptr,  # [bs, parent_width] int64
    selected_ptr,  # [bs, n - 1] int64
    seq_len_ptr,  # [bs] int
    mask_ptr,  # see build_tree_
    positions_ptr,  # [bs * n] int64
    index_ptr,  # [bs, n] int64, contiguous (as the two below)
    next_token_ptr,
    next_sibling_ptr,
    parent_stride,
    parent_width,
    selected_stride,
    topk,
    n,
    MODE: tl.constexpr,
    FILL_PREFIX: tl.constexpr,
    FILL_SPLIT: tl.constexpr,
    BLOCK_N: tl.constexpr,
    LOG2_BLOCK_N: tl.constexpr,
    BLOCK_L: tl.constexpr,
    BLOCK_B: tl.constexpr,
):
    b = tl.program_id(0).to(tl.int64)
    split = tl.program_id(1)
    lane = tl.arange(0, BLOCK_N)
    rows, cols = lane[:, None], lane[None, :]
    live = lane < n
    seq_len = tl.load(seq_len_ptr + b).to(tl.int64)

    if MODE == 0:  # FULL_MASK: row r of request b starts at n * sum(seq_len[:b]) + n * n * b + r * (seq_len + n)
        # (while loops: the interpreter cannot take tensor bounds in range())
        prefix = tl.zeros([BLOCK_B], tl.int64)
        start = b * 0
        while start < b:
            earlier = start + tl.arange(0, BLOCK_B)
            prefix += tl.load(seq_len_ptr + earlier, mask=earlier < b, other=0).to(tl.int64)
            start += BLOCK_B
        row_start = n * tl.sum(prefix) + n * n * b + lane * (seq_len + n)
        if FILL_PREFIX:
            start = split.to(tl.int64) * BLOCK_L
            while start < seq_len:
                col = start + tl.arange(0, BLOCK_L)
                fill = live[:, None] & (col[None, :] < seq_len)
                tl.store(mask_ptr + row_start[:, None] + col[None, :], 1, mask=fill)
                start += FILL_SPLIT * BLOCK_L

    if split == 0:
        # 1. Parents. Lane r holds node r; its draft index is selected[r - 1].
        node = live & (lane >= 1)
        selected = tl.load(selected_ptr + b * selected_stride + lane - 1, mask=node, other=-1)
        tb = selected // topk
        lookup = node & (tb > 0) & (tb < parent_width)
        target = tl.load(parent_ptr + b * parent_stride + tb, mask=lookup, other=-1)
        match = lookup[:, None] & (selected[None, :] == target[:, None]) & node[None, :]
        first = tl.min(tl.where(match, cols, BLOCK_N), axis=1)
        par = tl.where(tb == 0, 0, tl.where(first < BLOCK_N, first, -1))
        par = tl.where(node, par, -1)  # -1: root, padding, or invalid node

        # 2. Links: smallest child, and smallest later sibling.
        child = par[None, :] == rows  # [p, r]: r is a child of p
        next_token = tl.min(tl.where(child, cols, BLOCK_N), axis=1)
        sibling = (par[None, :] == par[:, None]) & (par[:, None] >= 0) & (cols > rows)
        next_sibling = tl.min(tl.where(sibling, cols, BLOCK_N), axis=1)
        out = b * n + lane
        tl.store(index_ptr + out, out, mask=live)
        tl.store(next_token_ptr + out, tl.where(next_token < BLOCK_N, next_token, -1), mask=live)
        tl.store(next_sibling_ptr + out, tl.where(next_sibling < BLOCK_N, next_sibling, -1), mask=live)

        # 3. Ancestor-or-self closure; 0/1 values are exact in fp16 with fp32 accumulation.
        anc = (cols == rows) | (cols == par[:, None])
        for _ in tl.static_range(LOG2_BLOCK_N):
            a = anc.to(tl.float16)
            anc = tl.dot(a, a, out_dtype=tl.float32) > 0
        depth = tl.sum((anc & (cols >= 1)).to(tl.int32), axis=1)
        tl.store(positions_ptr + out, seq_len + depth, mask=live)

        cell = (anc | (cols == 0)) & (cols < n)
        tile = live[:, None] & (cols < n)
        if MODE == 0:
            tl.store(mask_ptr + row_start[:, None] + seq_len + cols, cell, mask=tile)
        elif MODE == 1:
            tl.store(mask_ptr + b * n * n + rows * n + cols, cell, mask=tile)
        else:
            bits = tl.sum(tl.where(cell, tl.full([1, BLOCK_N], 1, tl.int64) << cols, 0), axis=1)
            tl.store(mask_ptr + out, bits, mask=live)


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
    """In-place twin of sgl-kernel's ``build_tree_kernel_efficient`` (same positional arguments).

    Args:
        parent_list: ``[bs, topk * (depth - 1) + 1]`` int64 (``[bs, 0]`` allowed when ``depth == 1``).
        selected_index: ``[bs, n - 1]`` int64, sorted draft indices; ``n = draft_token_num``.
        verified_seq_len: ``[bs]`` int64 prefix lengths ``L``.
        tree_mask: 1-D output. FULL_MASK: bool/uint8, request ``b`` is ``n`` rows of ``L_b + n``
            cells at ``n * sum(L[:b]) + n * n * b``, tree cells in the last ``n`` columns; the
            prefix columns are set True only when ``fill_prefix``. QLEN_ONLY: bool/uint8
            ``[bs * n * n]``. QLEN_ONLY_BITPACKING: ``[bs * n]`` of :func:`packed_mask_dtype`,
            bit ``c`` of entry ``b * n + r`` is cell ``(r, c)``.
        positions: ``[bs * n]`` int64 output, ``L_b + depth(r)``.
        retrieve_index, retrieve_next_token, retrieve_next_sibling: ``[bs, n]`` int64 contiguous
            outputs, every element written (``torch.empty`` is fine).
        topk, draft_token_num, tree_mask_mode: as in SGLang (``tree_mask_mode`` may be its IntEnum).
        depth: number of draft steps; accepted for signature parity, the closure needs no bound.
    """
    n, mode = draft_token_num, int(tree_mask_mode)
    bs = selected_index.shape[0]
    if mode == QLEN_ONLY_BITPACKING:
        width = packed_mask_dtype(n).itemsize
        if tree_mask.element_size() != width:
            raise ValueError(f"tree_mask needs {packed_mask_dtype(n)} for draft_token_num={n}")
        tree_mask = tree_mask.view(_STORE_DTYPES[width])
    elif mode in (FULL_MASK, QLEN_ONLY):
        if tree_mask.element_size() != 1:
            raise ValueError(f"tree_mask must be bool or uint8, got {tree_mask.dtype}")
        tree_mask = tree_mask.view(torch.uint8)
    else:
        raise ValueError(f"unknown tree_mask_mode {tree_mask_mode}")
    assert retrieve_index.is_contiguous() and retrieve_next_token.is_contiguous()
    assert retrieve_next_sibling.is_contiguous() and positions.is_contiguous()
    if parent_list.numel() == 0:  # depth == 1: never read; avoid passing a null pointer
        parent_list = selected_index
        parent_width = 0
    else:
        parent_width = parent_list.shape[1]
    fill = mode == FULL_MASK and bool(fill_prefix)
    split = FILL_SPLIT if fill else 1
    block_n = triton.next_power_of_2(max(n, 16))
    _build_tree_kernel[(bs, split)](
        parent_list, selected_index, verified_seq_len, tree_mask, positions,
        retrieve_index, retrieve_next_token, retrieve_next_sibling,
        parent_list.stride(0), parent_width, selected_index.stride(0), topk, n,
        MODE=mode, FILL_PREFIX=fill, FILL_SPLIT=split,
        BLOCK_N=block_n, LOG2_BLOCK_N=int(math.log2(block_n)), BLOCK_L=BLOCK_L, BLOCK_B=BLOCK_B,
        num_warps=max(4, block_n // 8),
    )


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
    """Drop-in for SGLang 0.5.17's ``eagle_utils.build_tree_kernel_efficient``, without memsets.

    Shapes: ``bonus_tokens [bs]``, ``draft_tokens [bs, n - 1]``, ``seq_lens [bs]`` int64 with
    ``seq_lens_sum == seq_lens.sum()``; ``n = num_verify_tokens``. ``tree_mask_buf`` is used in
    place when given; FULL_MASK prefix columns are set True only when ``fill_prefix_mask``.

    Returns:
        ``(tree_mask, positions [bs * n], retrieve_index [bs, n], retrieve_next_token [bs, n],
        retrieve_next_sibling [bs, n], draft_tokens [bs * n])``.
    """
    draft_tokens = torch.cat((bonus_tokens.unsqueeze(1), draft_tokens), dim=1).flatten()
    n, mode, bs, device = num_verify_tokens, int(tree_mask_mode), seq_lens.numel(), seq_lens.device
    if tree_mask_buf is not None:
        tree_mask = tree_mask_buf
    elif mode == FULL_MASK:
        tree_mask = torch.empty(seq_lens_sum * n + n * n * bs, dtype=torch.bool, device=device)
    elif mode == QLEN_ONLY:
        tree_mask = torch.empty(n * n * bs, dtype=torch.bool, device=device)
    else:
        tree_mask = torch.empty(n * bs, dtype=packed_mask_dtype(n), device=device)
    retrieve_index, retrieve_next_token, retrieve_next_sibling = torch.empty(
        (3, bs, n), dtype=torch.long, device=device
    )
    positions = torch.empty(bs * n, dtype=torch.long, device=device)
    build_tree_(
        parent_list, top_scores_index, seq_lens, tree_mask, positions, retrieve_index,
        retrieve_next_token, retrieve_next_sibling, topk, spec_steps, n, mode, fill_prefix_mask,
    )
    return tree_mask, positions, retrieve_index, retrieve_next_token, retrieve_next_sibling, draft_tokens
