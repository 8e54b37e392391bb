"""Triton ``tree_evidence`` (what a verify tells about acceptance per depth and sibling rank) against its PyTorch
twin on random trees verified by the greedy twin, and on a hand-built tree."""

import random

import pytest
import torch

from sgl_eagle_triton.devtools.reference.tree_evidence import tree_evidence as tree_evidence_ref
from sgl_eagle_triton.devtools.reference.verify_greedy import verify_tree_greedy as verify_tree_greedy_ref
from sgl_eagle_triton.kernels.tree_evidence import tree_evidence
from tests.test_verify_greedy import make_case
from tests.tree_cases import poisoned_outputs

CASES = [  # bs, n, max depth, topk, spec steps, ranks counted, target follows a child with
    (1, 2, 1, 1, 1, 4, 1.0),  # batch 1, depth 1, one draft token
    (4, 6, 5, 1, 5, 2, 0.8),  # chains
    (3, 16, 5, 4, 5, 4, 0.7),
    (8, 32, 7, 8, 5, 3, 0.9),  # trees deeper than the walk, more siblings than ranks counted
    (5, 24, 4, 6, 4, 8, 0.0),  # nothing accepted: only depth 1 reached
    (6, 40, 6, 3, 6, 4, 1.0),  # ragged: random trees of different shapes per request
]


def verified(rng, bs, n, max_depth, topk, steps, p_follow):
    """Random trees and the greedy twin's accept results: ``(accept_index, accept_token_num, retrieve_index,
    next_token, next_sibling)``."""
    candidates, retrieve_index, next_token, next_sibling, target = make_case(rng, bs, n, max_depth, topk, 16,
                                                                             p_follow)
    predicts, accept_index, accepted = poisoned_outputs(rng, bs, n, steps + 1)
    accept_index.fill_(-1)
    verify_tree_greedy_ref(predicts, accept_index, accepted, candidates, retrieve_index, next_token, next_sibling,
                           target)
    return accept_index, accepted, retrieve_index, next_token, next_sibling


def poison_past_accepted(accept_index, accepted, retrieve_index, next_token, next_sibling):
    """Past each request's accepted drafts, the first child of its last accepted node where SGLang leaves -1: a walk
    that read one draft too many would count that child as passed."""
    for b in range(accept_index.shape[0]):
        k = int(accepted[b])
        if k + 1 >= accept_index.shape[1]:
            continue
        last = (retrieve_index[b] == accept_index[b, k]).nonzero()[0, 0]
        child = int(next_token[b, last])
        if child != -1:
            accept_index[b, k + 1] = retrieve_index[b, child]


@pytest.mark.parametrize("bonus_included", [False, True], ids=["drafts", "accept-lens"])
@pytest.mark.parametrize("case", CASES, ids=lambda c: "bs{}-n{}-depth{}-topk{}-S{}-R{}-p{}".format(*c))
def test_matches_twin(device, case, bonus_included):
    """Accepted drafts, or SGLang's accept lengths (drafts + 1, as the policy passes them): the same counts."""
    bs, n, max_depth, topk, steps, ranks, p_follow = case
    rng = random.Random(hash(case) & 0xFFFF)
    inputs = list(verified(rng, bs, n, max_depth, topk, steps, p_follow))
    poison_past_accepted(*inputs)
    start = torch.rand(steps + 1, ranks).round() * 3  # counts accumulate onto what is there
    expected = [start.clone(), start.clone()]
    tree_evidence_ref(*expected, *inputs)
    if bonus_included:
        inputs[1] = inputs[1] + 1
    got = [start.clone().to(device), start.clone().to(device)]
    tree_evidence(*got, *(t.to(device) for t in inputs), bonus_included=bonus_included)
    for name, g, e in zip(("tried", "passed"), got, expected, strict=True):
        assert torch.equal(g.cpu(), e), name
    assert expected[0][1].sum() > start[1].sum()  # every request reaches depth 1


def test_counts_every_sibling_of_a_reached_level(device):
    """Root children 1, 2, 3 (ranks 0-2); node 2's children 4, 5. Request 0 accepts 2 then 5: depth 1 tried ranks
    0-2, passed rank 1; depth 2 tried ranks 0-1, passed rank 1. Request 1 accepts nothing: depth 1 tried only."""
    next_token = torch.tensor([[1, -1, 4, -1, -1, -1]] * 2)
    next_sibling = torch.tensor([[-1, 2, 3, -1, 5, -1]] * 2)
    retrieve_index = torch.arange(12).view(2, 6)
    accept_index = torch.tensor([[0, 2, 5], [6, -1, -1]], dtype=torch.int32)
    accepted = torch.tensor([2, 0], dtype=torch.int32)
    tried, passed = torch.zeros(3, 4, device=device), torch.zeros(3, 4, device=device)
    tree_evidence(tried, passed, *(t.to(device) for t in (accept_index, accepted, retrieve_index, next_token,
                                                          next_sibling)))
    assert tried.tolist() == [[0, 0, 0, 0], [2, 2, 2, 0], [1, 1, 0, 0]]
    assert passed.tolist() == [[0, 0, 0, 0], [0, 1, 0, 0], [0, 1, 0, 0]]
