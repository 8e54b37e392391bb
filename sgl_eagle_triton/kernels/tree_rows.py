"""Helpers shared by the kernels: device helpers of those that walk a draft tree held in registers
(verify_greedy, tree_sampling), and how target_probs and tree_sampling split vocabulary rows over programs."""

import torch
import triton
import triton.language as tl

from sgl_eagle_triton.kernels.device import VOCAB_MAX_SPLIT, VOCAB_MIN_SLICE, VOCAB_PROGRAMS_PER_SM, device_info

MAX_SPLIT = VOCAB_MAX_SPLIT  # programs per vocabulary row at most (the kernels' static bound)


def chain_tree(n: int, requests: int, device) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Tree rows of ``requests`` chains of ``n`` nodes (the root, then node ``i`` the only child of ``i - 1``), every
    draft token 0, laid out as serving lays them out, for compiling the verify kernels before serving:
    ``(candidates [requests, n], retrieve_index, retrieve_next_token, retrieve_next_sibling)``, the last three
    [requests, n] int64 views of one ``[3, requests, n]`` buffer as ``build_tree_kernel_efficient`` returns them
    (so ``retrieve_next_token`` is 16-byte aligned only when ``requests * n`` is even: Triton compiles a pointer
    argument apart by that), candidates int64 (the tree's draft tokens); for ``n == 1`` (steps 0's one-node tree)
    SGLang's own rows, allocated apart, with its int32 bonus tokens as candidates."""
    if n == 1:
        index = torch.arange(requests, device=device)[:, None]
        return (torch.zeros(requests, 1, dtype=torch.int32, device=device), index, torch.full_like(index, -1),
                torch.full_like(index, -1))
    index = torch.arange(requests * n, dtype=torch.int64, device=device).view(requests, n)
    rows = torch.empty(3, requests, n, dtype=torch.int64, device=device)
    rows[0] = index
    rows[1] = torch.where(index % n + 1 < n, index % n + 1, -1)
    rows[2] = -1
    return torch.zeros(requests, n, dtype=torch.int64, device=device), *rows


def start_up_chains(shapes, device):
    """For each distinct ``(draft tokens n, steps)`` in ``shapes``: ``(n, steps, requests, chain_tree(n, requests))``
    for one and two requests, which between them give both alignments serving gives the tree rows (what the
    start-up compiles run the verify kernels on)."""
    for n, steps in sorted(set(shapes)):
        for requests in (1, 2):
            yield n, steps, requests, chain_tree(n, requests, device)


def row_slices(rows: int, vocab: int, block: int, device: torch.device) -> tuple[int, int]:
    """``(split, slice_len)``: programs per row of ``vocab`` tokens, and tokens per program (whole ``block``
    chunks; the last slice may be shorter, none is empty), so that ``rows * split`` fills the GPU at small
    batches (``VOCAB_PROGRAMS_PER_SM`` programs per SM). E.g. on an H100 (132 SMs) 32 slices of 4096 at
    V = 128256 up to 8 rows; one program per row from 264 rows up."""
    chunks = triton.cdiv(vocab, block)
    programs = VOCAB_PROGRAMS_PER_SM * device_info(device).sms
    per_slice = triton.cdiv(chunks, max(1, min(MAX_SPLIT, triton.cdiv(programs, rows), vocab // VOCAB_MIN_SLICE)))
    return triton.cdiv(chunks, per_slice), per_slice * block


def verify_outputs(requests: int, n: int, steps: int, device) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The verify kernels' outputs as SGLang's ``eagle_sample`` allocates them: ``predict [requests * n]``,
    ``accept_index [requests, steps + 1]`` (-1) and the accepted counts ``[requests]``, all int32."""
    ints = dict(dtype=torch.int32, device=device)
    return (torch.zeros(requests * n, **ints), torch.full((requests, steps + 1), -1, **ints),
            torch.empty(requests, **ints))


@triton.jit
def pick(vec, lanes, i):
    """``vec[i]`` for a scalar lane index ``i`` (a one-hot reduction, no memory access)."""
    return tl.sum(tl.where(lanes == i, vec, 0), axis=0)


@triton.jit
def load_tree(candidates_ptr, retrieve_index_ptr, next_token_ptr, next_sibling_ptr, row_start,
              N: tl.constexpr, NUM_SPEC: tl.constexpr, BLOCK_N: tl.constexpr):
    """One request's ``[N]`` tree rows (from flat row ``row_start``) as lane vectors, for a walk from its root.

    Returns ``(lanes, in_tree, offsets, candidates, retrieve_index, next_token, next_sibling, root, first)``:
    the lane ids, which lanes hold a node, their flat offsets, the draft tokens, retrieve indices, first-child
    and next-sibling links (-1 past the tree), the root's retrieve index and the first node to visit (the
    root's first child; -1 when ``NUM_SPEC`` leaves no draft token to accept)."""
    lanes = tl.arange(0, BLOCK_N)
    in_tree = lanes < N
    offsets = row_start + lanes
    candidates = tl.load(candidates_ptr + offsets, mask=in_tree, other=0)
    retrieve_index = tl.load(retrieve_index_ptr + offsets, mask=in_tree, other=0)
    next_token = tl.load(next_token_ptr + offsets, mask=in_tree, other=-1)
    next_sibling = tl.load(next_sibling_ptr + offsets, mask=in_tree, other=-1)
    root = pick(retrieve_index, lanes, 0)
    first = tl.where(NUM_SPEC > 1, pick(next_token, lanes, 0), -1)
    return lanes, in_tree, offsets, candidates, retrieve_index, next_token, next_sibling, root, first
