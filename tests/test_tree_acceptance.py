"""The tree acceptance estimate behind tree candidates of the cost-aware adaptive policy (sgl_eagle_triton/adaptive.py,
docs/adaptive.md): the expected tokens of the tree SGLang keeps, and the per-depth, per-sibling-rank rates learned
from what verification reached and accepted."""

import random

import numpy as np
import pytest

from bench.tree_shape import tree
from sgl_eagle_triton.adaptive import DepthAcceptance, TreeAcceptance, chain_tokens, tree_tokens
from sgl_eagle_triton.simulated_acceptance import PROFILES


def test_a_chain_is_chain_tokens_and_a_small_tree_counts_its_kept_nodes():
    rng = random.Random(0)
    for steps in (1, 3, 7):
        rates = [rng.uniform(0.2, 0.95) for _ in range(steps)]
        chain = tree_tokens(lambda d, r, rates=rates: rates[d - 1], steps, 1, steps + 1)
        assert chain == pytest.approx(chain_tokens(rates))
    table = {1: [0.8, 0.1], 2: [0.5, 0.2]}
    # level 1: 0.8, 0.1; level 2: 0.4, 0.16 (under 0.8), 0.05, 0.02 (under 0.1); the 3 best: 0.8 + 0.4 + 0.16
    assert tree_tokens(lambda d, r: table[d][r], 2, 2, 4) == pytest.approx(2.36)
    # the frontier keeps topk nodes: at topk 1 the 0.1 branch is never expanded
    assert tree_tokens(lambda d, r: table[d][0], 2, 1, 3) == pytest.approx(1 + 0.8 + 0.4)


def test_chain_evidence_gives_depth_acceptances_rates():
    rng = random.Random(1)
    tree_est, depth_est = TreeAcceptance(7, 8), DepthAcceptance(7)
    for steps in (3, 3, 5, 1, 7, 3):
        for _ in range(30):
            correct = [rng.randint(0, steps) for _ in range(4)]
            tree_est.observe_chain(steps, correct)
            depth_est.observe(steps, correct)
        for d in range(1, 8):
            assert tree_est.rate(d, 0) == pytest.approx(depth_est.rate(d)), (steps, d)
            assert tree_est.expected_tokens(d) == pytest.approx(depth_est.expected_tokens(d))


def simulated_visits(paths, rate, rng):
    """The nodes one greedy verify of the kept ``paths`` reaches (``(depth, kept children, accepted rank or -1)``)
    when the target's token after a node at depth d - 1 is that node's rank-r candidate with ``rate(d, r)``
    (one draw over all ranks: a rank that was not kept is a rejection)."""
    kept, visits, node = set(paths), [], ()
    while True:
        depth = len(node) + 1
        children = sum(1 for p in kept if len(p) == depth and p[:-1] == node)
        if not children:
            return visits
        u, rank, cum = rng.random(), -1, 0.0
        for r in range(16):
            cum += rate(depth, r)
            if u < cum:
                rank = r
                break
        accepted = rank if 0 <= rank < children else -1
        visits.append((depth, children, accepted))
        if accepted < 0:
            return visits
        node = node + (accepted,)


# Measured over the 1500 verifies below: largest |estimate - profile| among depths 1-3 and ranks 0-2 0.015 / 0.015
# (rank 0 / ranks 1-2) at seed 0, 0.026 / 0.013 at seed 1, 0.005 / 0.005 at seed 2; rank 0 at depth 3 has ~1100
# trials, a standard error of 0.012. Bound 0.04 (over 3 standard errors). Counting only the accepted rank as tried
# (ignoring rejections) estimates rank 0 at 0.999 and rank 1 at 0.96 (shown by hand) and fails.
RATE_TOLERANCE = 0.04


def test_depth_and_rank_rates_are_recovered_from_tree_verifies():
    profile = PROFILES["llama31-8b-eagle3"]

    def rate(d, r):
        return profile["rank_probs"][r] * profile["depth_decay"] ** (d - 1) if r < len(profile["rank_probs"]) else 0.0

    est, rng, np_rng = TreeAcceptance(5, 8, decay=1.0), random.Random(0), np.random.default_rng(0)
    for _ in range(1500):
        paths = tree(np_rng, 5, 8, 32, logit_std=5.0, vocab=1000)
        est.observe_nodes(simulated_visits(paths, rate, rng))
    errors = {(d, r): abs(est.rate(d, r) - rate(d, r)) for d in (1, 2, 3) for r in (0, 1, 2)}
    assert max(errors.values()) < RATE_TOLERANCE, errors
    # a tree not in force is predicted from the same rates (an 8-deep tree commits more than the 5-deep one)
    assert est.expected_tokens(8, 8, 64) > est.expected_tokens(5, 8, 32) > est.expected_tokens(5, 1, 6)


def test_untried_sibling_ranks_take_the_rest_of_rank_zeros_chance():
    est = TreeAcceptance(4, 4)
    for _ in range(200):
        est.observe_chain(4, [4, 3])  # only rank 0 tried: its rate rises, the other ranks' priors shrink
    r0 = est.rate(1, 0)
    assert r0 > 0.9
    assert est.rate(1, 1) == pytest.approx((1 - r0) * 0.35) and est.rate(1, 2) == pytest.approx((1 - r0) * 0.175)
    assert est.rate(1, 4) == 0.0  # beyond the ranks it tracks
    assert sum(est.rate(1, r) for r in range(4)) <= 1.0
