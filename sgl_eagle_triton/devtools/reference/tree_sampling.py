"""Plain-PyTorch twin of sgl-kernel's ``tree_speculative_sampling_target_only`` (sampled acceptance of an
EAGLE draft tree against the target model's probabilities).

A serial Python walk per request that mirrors the CUDA kernel ``TreeSpeculativeSamplingTargetOnly``, with the
same two deliberate differences as ``sgl_eagle_triton.kernels.tree_sampling``: a zero-probability token is
never accepted (later sgl-kernel releases' rule), and the rejected tokens are kept in a list instead of a dense
``draft_probs`` tensor. All arithmetic is float32, as in the kernels.
"""

import torch


def _f32(x) -> torch.Tensor:
    return torch.tensor(x, dtype=torch.float32)


def tree_speculative_sampling(
    predicts: torch.Tensor,
    accept_index: torch.Tensor,
    accept_token_num: torch.Tensor,
    candidates: torch.Tensor,
    retrieve_index: torch.Tensor,
    retrieve_next_token: torch.Tensor,
    retrieve_next_sibling: torch.Tensor,
    uniform_samples: torch.Tensor,
    uniform_samples_for_final_sampling: torch.Tensor,
    target_probs: torch.Tensor,
    threshold_single: float = 1.0,
    threshold_acc: float = 1.0,
) -> None:
    """Walk each request's draft tree, accepting children by sampling, then draw the correction token.

    Writes in place (the caller pre-fills; elements not listed below are left untouched):
        predicts         [bs * n] int32: at every accepted position ``p`` (the root included) the token that
                         follows it: the next accepted draft token, or at the last one the correction token.
        accept_index     [bs, S + 1] int32: columns ``0 .. m``, the accepted flat positions (root first).
        accept_token_num [bs] int32: ``m``, the number of accepted draft tokens (root excluded).

    Reads:
        candidates            [bs, n] int64: draft token of each tree node (node 0 is the root).
        retrieve_index        [bs, n] int64: flat position of each node in ``predicts``.
        retrieve_next_token   [bs, n] int64: first child of each node, -1 if none.
        retrieve_next_sibling [bs, n] int64: next sibling of each node, -1 if none.
        uniform_samples       [bs, n] float32: coin of each node, used to accept one of its children.
        uniform_samples_for_final_sampling [bs] float32: coin of the correction token.
        target_probs          [bs, n, V] float32: target distribution after each node (row = node, not
                              flat position).

    At most ``S = accept_index.shape[1] - 1`` levels are walked. Among the children of the last accepted
    node, in sibling order, the running sum ``acc`` of their target probabilities grows; the first child of
    probability ``q > 0`` with ``coin < acc / max(threshold_acc, 1e-9)`` or ``q >= threshold_single`` is
    accepted (the walk descends to it, ``acc`` restarts at 0 and its coin replaces the coin). When no child
    is accepted, or after S levels, the correction token is drawn by inverse CDF with coin ``u`` from
    ``r = relu(target row of the last accepted node)`` with the rejected children's tokens zeroed: the first
    token whose inclusive prefix sum of ``r`` exceeds ``u * sum(r)``; if rounding leaves none, the last token
    with ``r > 0``; if ``r`` is all zero, ``V - 1``.
    """
    bs, _ = candidates.shape
    num_speculative_tokens = accept_index.shape[1]
    vocab_size = target_probs.shape[2]
    single = _f32(threshold_single)
    acc_divisor = _f32(max(threshold_acc, 1e-9))
    for b in range(bs):
        node = 0  # last accepted node: its target row is the one the children are checked against
        coin = uniform_samples[b, 0]
        prob_acc = _f32(0.0)
        last = int(retrieve_index[b, 0])
        accept_index[b, 0] = last
        num_accepted = 0
        rejected = []  # draft tokens rejected among the children of `node`
        cur = 0
        for _ in range(1, num_speculative_tokens):
            cur = int(retrieve_next_token[b, cur])
            while cur != -1:
                draft_token = int(candidates[b, cur])
                prob = target_probs[b, node, draft_token]
                prob_acc = prob_acc + prob
                if prob > 0 and (coin < prob_acc / acc_divisor or prob >= single):
                    draft_index = int(retrieve_index[b, cur])
                    predicts[last] = draft_token
                    num_accepted += 1
                    accept_index[b, num_accepted] = draft_index
                    last = draft_index
                    node = cur
                    coin = uniform_samples[b, cur]
                    prob_acc = _f32(0.0)
                    rejected = []
                    break
                rejected.append(draft_token)
                cur = int(retrieve_next_sibling[b, cur])
            if cur == -1:
                break
        accept_token_num[b] = num_accepted

        residual = target_probs[b, node].clamp(min=0)
        residual[rejected] = 0
        u = uniform_samples_for_final_sampling[b] * residual.sum()
        above = ((residual.cumsum(0) > u) & (residual > 0)).nonzero()
        positive = (residual > 0).nonzero()
        if len(above) > 0:
            token = int(above[0])
        elif len(positive) > 0:
            token = int(positive[-1])
        else:
            token = vocab_size - 1
        predicts[last] = token
