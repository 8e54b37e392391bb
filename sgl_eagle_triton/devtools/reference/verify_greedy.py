"""Plain-PyTorch twin of sgl-kernel's ``verify_tree_greedy`` (greedy acceptance of an EAGLE draft tree).

A serial Python walk per request that mirrors the CUDA kernel ``VerifyTreeGreedy`` line by line.
"""

import torch


def verify_tree_greedy(
    predicts: torch.Tensor,
    accept_index: torch.Tensor,
    accept_token_num: torch.Tensor,
    candidates: torch.Tensor,
    retrieve_index: torch.Tensor,
    retrieve_next_token: torch.Tensor,
    retrieve_next_sibling: torch.Tensor,
    target_predict: torch.Tensor,
) -> None:
    """Walk each request's draft tree, accepting a child whenever its token equals the target's argmax.

    Writes in place (the caller pre-fills; elements not listed below are left untouched):
        predicts         [bs * n] int32: at every accepted position ``p`` (the root included),
                         ``target_predict.flatten()[p]``, the last one being the bonus token.
        accept_index     [bs, S + 1] int32: columns ``0 .. m``, the accepted flat positions (root first).
        accept_token_num [bs] int32: ``m``, the number of accepted draft tokens (root excluded).

    Reads:
        candidates            [bs, n] int64: draft token of each tree node (node 0 is the root).
        retrieve_index        [bs, n] int64: flat position of each node in ``predicts`` / ``target_predict``.
        retrieve_next_token   [bs, n] int64: first child of each node, -1 if none.
        retrieve_next_sibling [bs, n] int64: next sibling of each node, -1 if none.
        target_predict        [bs, n] int64: target model argmax at each node, indexed by flat position.

    At most ``S = accept_index.shape[1] - 1`` levels are walked.
    """
    bs, _ = candidates.shape
    num_speculative_tokens = accept_index.shape[1]
    target_flat = target_predict.flatten()
    for b in range(bs):
        last = int(retrieve_index[b, 0])
        accept_index[b, 0] = last
        num_accepted = 0
        cur = 0
        for _ in range(1, num_speculative_tokens):
            cur = int(retrieve_next_token[b, cur])
            while cur != -1:
                draft_index = int(retrieve_index[b, cur])
                draft_token = int(candidates[b, cur])
                target_token = int(target_flat[last])
                if draft_token == target_token:
                    predicts[last] = target_token
                    num_accepted += 1
                    accept_index[b, num_accepted] = draft_index
                    last = draft_index
                    break
                cur = int(retrieve_next_sibling[b, cur])
            if cur == -1:
                break
        accept_token_num[b] = num_accepted
        predicts[last] = target_flat[last]
