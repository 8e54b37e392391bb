"""The tree acceptance estimate behind tree candidates of the cost-aware adaptive policy (sgl_eagle_triton/adaptive.py,
docs/adaptive.md): the expected tokens of the tree SGLang keeps, and the per-depth, per-sibling-rank rates learned
from what verification reached and accepted."""

import random
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from bench.tree_shape import tree
from sgl_eagle_triton.adaptive import (
    CostAwarePolicy,
    CycleCost,
    DepthAcceptance,
    TreeAcceptance,
    TreeEvidence,
    chain_tokens,
    tree_tokens,
)
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


class Counts:
    """``tried`` / ``passed`` [depth][rank] as :class:`TreeEvidence` keeps them on the device: before each verify's
    nodes are added the tables decay; every reached node ``(depth, kept children, accepted rank or -1)`` adds a trial
    to each kept rank and a success to the accepted one."""

    def __init__(self, max_depth, ranks, decay=0.98):
        self.decay = decay
        self.tried = [[0.0] * ranks for _ in range(max_depth + 1)]
        self.passed = [[0.0] * ranks for _ in range(max_depth + 1)]

    def verify(self, visits):
        for table in (self.tried, self.passed):
            for row in table:
                row[:] = [x * self.decay for x in row]
        for depth, kept, accepted in visits:
            for r in range(min(kept, len(self.tried[depth]))):
                self.tried[depth][r] += 1
            if 0 <= accepted < len(self.passed[depth]):
                self.passed[depth][accepted] += 1

    def chain(self, steps, correct_per_req):
        """A chain's verify: a request that accepted ``k`` of ``steps`` drafts reached depths 1..min(k + 1, steps),
        one child each."""
        self.verify([visit for k in correct_per_req
                     for visit in [(d, 1, 0) for d in range(1, k + 1)] + ([(k + 1, 1, -1)] if k < steps else [])])

    def into(self, est):
        est.load(self.tried, self.passed)
        return est


def test_chain_evidence_gives_depth_acceptances_rates():
    rng = random.Random(1)
    counts, depth_est = Counts(7, 8), DepthAcceptance(7)
    for steps in (3, 3, 5, 1, 7, 3):
        for _ in range(30):
            correct = [rng.randint(0, steps) for _ in range(4)]
            counts.chain(steps, correct)
            depth_est.observe(steps, correct)
        tree_est = counts.into(TreeAcceptance(7, 8))
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

    counts, rng, np_rng = Counts(5, 8, decay=1.0), random.Random(0), np.random.default_rng(0)
    for _ in range(1500):
        paths = tree(np_rng, 5, 8, 32, logit_std=5.0, vocab=1000)
        counts.verify(simulated_visits(paths, rate, rng))
    est = counts.into(TreeAcceptance(5, 8))
    errors = {(d, r): abs(est.rate(d, r) - rate(d, r)) for d in (1, 2, 3) for r in (0, 1, 2)}
    assert max(errors.values()) < RATE_TOLERANCE, errors
    # a tree not in force is predicted from the same rates (an 8-deep tree commits more than the 5-deep one)
    assert est.expected_tokens(8, 8, 64) > est.expected_tokens(5, 8, 32) > est.expected_tokens(5, 1, 6)


def test_untried_sibling_ranks_take_the_rest_of_rank_zeros_chance():
    counts = Counts(4, 4)
    for _ in range(200):
        counts.chain(4, [4, 3])  # only rank 0 tried: its rate rises, the other ranks' priors shrink
    est = counts.into(TreeAcceptance(4, 4))
    r0 = est.rate(1, 0)
    assert r0 > 0.9
    assert est.rate(1, 1) == pytest.approx((1 - r0) * 0.35) and est.rate(1, 2) == pytest.approx((1 - r0) * 0.175)
    assert est.rate(1, 4) == 0.0  # beyond the ranks it tracks
    assert sum(est.rate(1, r) for r in range(4)) <= 1.0


# --- the cost policy over tree candidates --------------------------------------------------------------------------

def hand_tree(device="cpu"):
    """Root children 1, 2, 3; node 2's children 4, 5 (tests/test_tree_evidence.py): request 0 accepts 2 then 5."""
    return SimpleNamespace(retrieve_next_token=torch.tensor([[1, -1, 4, -1, -1, -1]], device=device),
                           retrieve_next_sibling=torch.tensor([[-1, 2, 3, -1, 5, -1]], device=device),
                           retrieve_index=torch.arange(6, device=device).view(1, 6))


def test_tree_evidence_decays_adds_and_hands_the_host_a_copy(device):
    evidence = TreeEvidence(3, 4, device, decay=0.5)
    accept_index = torch.tensor([[0, 2, 5, -1]], dtype=torch.int32, device=device)
    accept_lens = torch.tensor([3], dtype=torch.int32, device=device)
    evidence.add(accept_index, accept_lens, hand_tree(device))
    evidence.add(accept_index, accept_lens, hand_tree(device))  # 0.5 x the first + the second
    one_node = SimpleNamespace(retrieve_next_token=torch.full((1, 1), -1, device=device),
                               retrieve_next_sibling=torch.full((1, 1), -1, device=device),
                               retrieve_index=torch.zeros(1, 1, dtype=torch.int64, device=device))
    evidence.add(torch.tensor([[0, -1, -1, -1]], dtype=torch.int32, device=device),
                 torch.tensor([1], dtype=torch.int32, device=device), one_node)
    evidence.snapshot()  # on a GPU the first copy is in flight (the host reads the one finished last)
    if device == "cuda":
        torch.cuda.synchronize()
    tried, passed = evidence.snapshot()  # steps 0 neither added nor decayed
    assert tried[1] == [1.5, 1.5, 1.5, 0.0] and tried[2] == [1.5, 1.5, 0.0, 0.0]
    assert passed[1] == [0.0, 1.5, 0.0, 0.0] and passed[2] == [0.0, 1.5, 0.0, 0.0]


PROFILE = PROFILES["llama31-8b-eagle3"]
TREES = {1: (8, 2), 3: (8, 8), 5: (8, 32)}
# ms per cycle (graph replay) at batch 1 and 64: deep wide trees cost little more alone, much more in a crowd
TREE_COSTS = {(0, 1): 7.0, (1, 1): 7.3, (3, 1): 8.0, (5, 1): 9.5, (0, 64): 8.0, (1, 64): 10.0, (3, 64): 20.0,
              (5, 64): 70.0}


class ProfileEvidence:
    """Device counts as if many verifies had run under the benchmark profile: 1000 trials per depth and rank."""

    def snapshot(self):
        tried = [[1000.0] * 8 for _ in range(6)]
        passed = [[1000.0 * PROFILE["rank_probs"][r] * PROFILE["depth_decay"] ** (d - 1) for r in range(8)]
                  for d in range(6)]
        return tried, passed


def test_the_policy_predicts_trees_by_rank_and_picks_by_value():
    policy = CostAwarePolicy([0, 1, 3, 5], 3, update_interval=1, settle=0, trees=TREES, evidence=ProfileEvidence())
    policy.set_costs(CycleCost(TREE_COSTS))
    policy._refresh_trees()  # a decision's first step: the device counts into the estimate (no verify observed yet)
    assert policy.efficiency == {} and policy.efficiency_of(5) == 1.0
    def profile_rate(d, r):
        return PROFILE["rank_probs"][r] * PROFILE["depth_decay"] ** (d - 1)

    assert policy.expected_tokens(5) == pytest.approx(tree_tokens(profile_rate, 5, 8, 32), rel=0.02)
    assert policy.best(1) == 5 and policy.best(64) == 1
    report = policy.report()
    assert report["rank_rates"][0][:2] == [pytest.approx(0.82, abs=0.01), pytest.approx(0.06, abs=0.01)]
    assert set(report["expected_tokens"]) == {"0", "1", "3", "5"} and report["expected_tokens"]["0"] == 1.0


def test_chains_among_trees_are_predicted_at_their_own_topk():
    """Mixed topk (config entries [k, n]): a chain candidate is predicted as a chain (under this profile as much as
    the best 4 nodes of a tree of 8 would commit: its price is what differs, measured per state), so in a crowd the
    cheap 3-step chain wins and alone the 5-step tree of 8."""
    mixed = {1: (1, 2), 3: (1, 4), 5: (8, 32)}
    costs = {**TREE_COSTS, (3, 64): 12.0}  # a chain verifies 4 tokens a request, the 3-step tree 8
    policy = CostAwarePolicy([0, 1, 3, 5], 3, update_interval=1, settle=0, trees=mixed, evidence=ProfileEvidence())
    policy.set_costs(CycleCost(costs))
    policy._refresh_trees()

    def profile_rate(d, r):
        return PROFILE["rank_probs"][r] * PROFILE["depth_decay"] ** (d - 1)

    assert policy.expected_tokens(3) == pytest.approx(tree_tokens(profile_rate, 3, 1, 4), rel=0.02)
    assert policy.expected_tokens(3) < tree_tokens(profile_rate, 3, 8, 8)  # the tree of 8 would commit more
    assert policy.best(1) == 5 and policy.best(64) == 3


def test_a_tree_committing_less_than_predicted_lowers_every_trees_prediction():
    policy = CostAwarePolicy([0, 1, 3, 5], 5, update_interval=1, settle=0, trees=TREES, evidence=ProfileEvidence())
    policy.set_costs(CycleCost(TREE_COSTS))
    policy._refresh_trees()
    raw = {s: policy._tree_prediction(s) for s in TREES}
    assert policy.best(64) == 1
    for _ in range(20):  # the 5-step tree in force commits 2 tokens per verify, about half its prediction
        policy.on_verify_complete([1] * 8, 1)
    assert policy.efficiency == {5: pytest.approx(0.5, abs=0.02)}
    assert policy.expected_tokens(3) == pytest.approx(raw[3] * policy.efficiency[5])  # the nearest tree's
    # alone the deep tree still commits most per ms; in a crowd no speculation now beats the one-step tree
    assert policy.current == 5 and policy.best(64) == 0


def test_a_tree_never_in_force_takes_the_nearest_trees_efficiency():
    policy = CostAwarePolicy([0, 1, 3, 5, 7], 3, trees={1: (8, 2), 3: (8, 8), 5: (8, 32), 7: (8, 64)})
    policy.efficiency = {1: 0.9, 5: 0.6}
    assert [policy.efficiency_of(s) for s in (1, 3, 5, 7)] == [0.9, 0.9, 0.6, 0.6]  # a tie: the shallower's


def test_a_batch_size_decision_credits_the_tokens_so_far_to_the_tree_that_committed_them():
    """At a switch at a batch-size change the tokens counted so far are the old tree's: divided by the new tree's
    prediction at the next refresh they would give it a wrong efficiency (5 -> 1: the ceiling 1.2)."""
    policy = CostAwarePolicy([0, 1, 3, 5], 5, update_interval=8, settle=0, trees=TREES, evidence=ProfileEvidence())
    policy.set_costs(CycleCost(TREE_COSTS))
    policy._refresh_trees()
    policy.get_steps_for_batch(1)
    for _ in range(8):  # the 5-step tree at batch 1, committing about 5 tokens a request
        policy.on_verify_complete([4] * 8, 1)
    for _ in range(4):  # more, after the last regular decision
        policy.on_verify_complete([4] * 8, 1)
    policy.get_steps_for_batch(64)
    assert policy.get_steps_for_batch(64) == 1  # decided in a crowd
    assert set(policy.efficiency) == {5} and policy._observed == [0.0, 0]  # the 4 verifies went to the 5-step tree


def test_rates_and_predictions_follow_every_load():
    """The rates, tried depths and tree predictions a decision reuses are dropped at each load: after new counts
    every answer is a fresh estimator's (a stale memo would keep the first counts' answers)."""
    rng = random.Random(5)

    def counts():
        tried = [[0.0] * 8] + [[rng.choice((0.0, rng.random() * 40)) for _ in range(8)] for _ in range(7)]
        return tried, [[t * rng.random() for t in row] for row in tried]

    reused = TreeAcceptance(7, 8)
    for _ in range(3):
        tried, passed = counts()
        reused.load(tried, passed)
        fresh = TreeAcceptance(7, 8)
        fresh.load(tried, passed)
        for steps, topk, n in ((1, 8, 2), (3, 8, 8), (5, 8, 32), (7, 8, 64), (3, 1, 4)):
            assert reused.expected_tokens(steps, topk, n) == fresh.expected_tokens(steps, topk, n)
        assert [[reused.rate(d, r) for r in range(8)] for d in range(1, 8)] == [
            [fresh.rate(d, r) for r in range(8)] for d in range(1, 8)]
