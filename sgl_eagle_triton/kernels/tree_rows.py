"""Device helpers shared by the kernels that walk a draft tree held in registers (verify_greedy,
tree_sampling) or pick from a small register vector (target_probs)."""

import triton
import triton.language as tl


@triton.jit
def pick(vec, lanes, i):
    """``vec[i]`` for a scalar lane index ``i`` (a one-hot reduction, no memory access)."""
    return tl.sum(tl.where(lanes == i, vec, 0), axis=0)


@triton.jit
def load_tree_rows(candidates_ptr, retrieve_index_ptr, next_token_ptr, next_sibling_ptr, offsets, in_tree):
    """One request's ``[n]`` tree rows as lane vectors: draft tokens, retrieve indices, first-child
    and next-sibling links (-1 past the tree)."""
    candidates = tl.load(candidates_ptr + offsets, mask=in_tree, other=0)
    retrieve_index = tl.load(retrieve_index_ptr + offsets, mask=in_tree, other=0)
    next_token = tl.load(next_token_ptr + offsets, mask=in_tree, other=-1)
    next_sibling = tl.load(next_sibling_ptr + offsets, mask=in_tree, other=-1)
    return candidates, retrieve_index, next_token, next_sibling
