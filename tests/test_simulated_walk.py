"""The benchmark-only simulated acceptance: ``simulated_walk`` against its twin on random trees and coins (integer
outputs compared exactly), the acceptance it produces against its profile, and its wiring (environment checks,
``eagle_sample`` replaced for ours and wrapped for stock)."""

import random
from types import SimpleNamespace

import pytest
import torch

from sgl_eagle_triton import simulated_acceptance
from sgl_eagle_triton.devtools.reference.simulated_walk import simulated_walk as simulated_walk_ref
from sgl_eagle_triton.glue.call_sites import swapped
from sgl_eagle_triton.kernels.simulated_walk import simulated_walk
from tests import fake_sglang
from tests.tree_cases import check_against_reference, make_tree, poisoned_outputs


def tree_case(rng, bs, n, max_depth, topk):
    """[bs, n] int64 tree rows as SGLang's build_tree links them (tests/tree_cases.make_tree)."""
    rows = [make_tree(rng, n, max_depth, topk)[:2] for _ in range(bs)]
    candidates = torch.tensor([[rng.randrange(1000) for _ in range(n)] for _ in range(bs)])
    retrieve_index = torch.arange(bs * n).view(bs, n)
    return (candidates, retrieve_index, torch.tensor([r[0] for r in rows]), torch.tensor([r[1] for r in rows]))


def random_table(rng, levels, ranks):
    probs = [[rng.random() * 0.5 for _ in range(ranks)] for _ in range(levels)]
    return torch.tensor(probs).cumsum(-1).clamp(max=1.0)


CASES = [  # bs, n, max_depth, topk, spec steps, table levels, table ranks
    (1, 2, 1, 1, 1, 1, 1),  # batch 1, depth 1, one node to draft
    (4, 6, 5, 1, 5, 4, 2),  # chains, fewer table levels than depth
    (3, 16, 5, 4, 5, 16, 8),
    (8, 32, 7, 8, 5, 3, 3),  # trees deeper than the walk, more siblings than table ranks
    (2, 1, 0, 1, 0, 2, 2),  # steps 0: SGLang's one-node tree
]


@pytest.mark.parametrize("case", CASES, ids=lambda c: "bs{}-n{}-depth{}-topk{}-S{}-L{}-K{}".format(*c))
@pytest.mark.parametrize("seed", range(3))
def test_matches_reference(device, case, seed):
    bs, n, max_depth, topk, steps, levels, ranks = case
    rng = random.Random(seed * 100 + n)
    inputs = tree_case(rng, bs, n, max_depth, topk)
    coins = torch.rand(bs, steps + 1, generator=torch.Generator().manual_seed(seed))
    table = random_table(rng, levels, ranks)
    outputs = poisoned_outputs(rng, bs, n, steps + 1)
    expected = check_against_reference(simulated_walk, simulated_walk_ref, outputs, (*inputs, coins, table), device)
    assert (expected[2] <= min(steps, max_depth)).all()


def chain_with_siblings(bs, steps, siblings):
    """[bs, n] tree rows: a chain of ``steps`` rank-0 children, each level also holding a leaf sibling of rank 1
    when ``siblings`` (so the tree holds the chain)."""
    next_token, next_sibling = [-1] * (1 + steps * (1 + siblings)), [-1] * (1 + steps * (1 + siblings))
    parent = 0
    for d in range(steps):
        first = 1 + d * (1 + siblings)
        next_token[parent] = first
        if siblings:
            next_sibling[first] = first + 1
        parent = first
    n = len(next_token)
    return (torch.arange(bs * n).view(bs, n) % 1000, torch.arange(bs * n).view(bs, n),
            torch.tensor([next_token] * bs), torch.tensor([next_sibling] * bs))


def test_accepts_as_the_profile_says(device):
    """A chain of 5 under the Llama-3.1-8B profile commits its expected 3.70 tokens per verify on average; with the
    same coins a tree that adds a rank-1 sibling at every level commits more, never less."""
    bs, steps = (2000 if device != "cpu" else 300), 5
    profile = simulated_acceptance.PROFILES["llama31-8b-eagle3"]
    table = simulated_acceptance.cumulative_probs(**profile).to(device)
    coins = torch.rand(bs, steps + 1, generator=torch.Generator().manual_seed(0)).to(device)

    def tokens(siblings):
        inputs = [t.to(device) for t in chain_with_siblings(bs, steps, siblings)]
        n = inputs[0].shape[1]
        outs = (torch.zeros(bs * n, dtype=torch.int32, device=device),
                torch.full((bs, steps + 1), -1, dtype=torch.int32, device=device),
                torch.zeros(bs, dtype=torch.int32, device=device))
        simulated_walk(*outs, *inputs, coins, table)
        return 1 + outs[2].float()

    chain, tree = tokens(False), tokens(True)
    expected = simulated_acceptance.expected_chain_tokens(profile["rank_probs"], profile["depth_decay"], steps)
    assert expected == pytest.approx(3.70, abs=0.01)
    assert chain.mean().item() == pytest.approx(expected, abs=4 * 1.5 / bs**0.5)  # 4 standard errors
    assert (tree >= chain).all() and tree.mean() > chain.mean() + 0.1  # ~0.2 expected


def test_a_walk_that_forgets_the_sibling_rank_is_caught(device):
    """The parity test sees a plausible bug: every sibling judged by the first rank's threshold."""
    def broken(*args):
        *rest, table = args[:9]
        simulated_walk_ref(*rest, table[:, :1].expand_as(table).contiguous())

    rng = random.Random(5)
    inputs = tree_case(rng, 8, 32, 5, 8)
    coins = torch.rand(8, 6, generator=torch.Generator().manual_seed(5))
    table = random_table(rng, 16, 8)
    with pytest.raises(AssertionError):
        check_against_reference(simulated_walk, broken, poisoned_outputs(rng, 8, 32, 6), (*inputs, coins, table),
                                device)


def test_environment_checks(monkeypatch):
    for var in (simulated_acceptance.PROFILE_ENV, simulated_acceptance.BENCHMARK_ENV, "SGLANG_SIMULATE_ACC_LEN"):
        monkeypatch.delenv(var, raising=False)
    assert simulated_acceptance.misconfigured() is None and not simulated_acceptance.active()
    monkeypatch.setenv(simulated_acceptance.PROFILE_ENV, "llama31-8b-eagle3")
    assert "without SGLANG_EAGLE_TRITON_BENCHMARK=1" in simulated_acceptance.misconfigured()
    monkeypatch.setenv(simulated_acceptance.BENCHMARK_ENV, "1")
    assert simulated_acceptance.active()
    monkeypatch.setenv("SGLANG_SIMULATE_ACC_LEN", "3")
    assert "one acceptance model at a time" in simulated_acceptance.misconfigured()
    monkeypatch.delenv("SGLANG_SIMULATE_ACC_LEN")
    monkeypatch.setenv(simulated_acceptance.PROFILE_ENV, "nope")
    assert "profiles: llama31-8b-eagle3" in simulated_acceptance.misconfigured()


def test_eagle_sample_is_replaced_for_ours_and_wrapped_for_stock(device, monkeypatch):
    from sglang.srt.speculative import eagle_utils, eagle_worker_common

    from sgl_eagle_triton import plugin, verify, worker

    monkeypatch.setenv(simulated_acceptance.PROFILE_ENV, "llama31-8b-eagle3")
    monkeypatch.setenv(simulated_acceptance.BENCHMARK_ENV, "1")
    bs, n = 3, 6
    candidates, retrieve_index, next_token, next_sibling = (t.to(device) for t in
                                                            tree_case(random.Random(1), bs, n, 5, 1))
    verify_input = SimpleNamespace(draft_token_num=n, draft_token=candidates.flatten(), retrieve_index=retrieve_index,
                                   retrieve_next_token=next_token, retrieve_next_sibling=next_sibling,
                                   max_tree_depth=6, tree_topk=1)
    batch = SimpleNamespace(forward_mode=fake_sglang.ForwardMode(), seq_lens=torch.tensor([5, 6, 7], device=device),
                            sampling_info=fake_sglang.sampling_info(bs, greedy=True, device=device), device=device)
    logits = SimpleNamespace(next_token_logits=torch.randn(bs * n, 50, device=device))
    ours = worker.our_eagle_sample()
    assert ours.sgl_eagle_triton_simulated and ours.__wrapped__ is verify.eagle_sample
    with swapped(eagle_utils, "verify_tree_greedy_func", verify.verify_tree_greedy_func):
        predict, accept_lens, accept_index = ours(verify_input, batch, logits)
    # the simulated walk's outputs: the bonus token at each request's last accepted position
    last = accept_index.gather(1, (accept_lens - 1).long().view(bs, 1)).view(bs).long()
    assert (predict[last] == 100).all() and accept_lens.dtype == torch.int32
    monkeypatch.setattr(eagle_worker_common, "eagle_sample", eagle_utils.eagle_sample)
    plugin._simulate_stock_acceptance()
    wrapped = eagle_worker_common.eagle_sample
    assert wrapped.sgl_eagle_triton_simulated and wrapped.__wrapped__ is eagle_utils.eagle_sample
    plugin._simulate_stock_acceptance()  # idempotent
    assert eagle_worker_common.eagle_sample is wrapped
    predict, accept_lens, accept_index = wrapped(verify_input, batch, logits)
    last = accept_index.gather(1, (accept_lens - 1).long().view(bs, 1)).view(bs).long()
    assert (predict[last] == 100).all()
    monkeypatch.delenv(simulated_acceptance.BENCHMARK_ENV)  # outside benchmark mode: ours as it is
    assert worker.our_eagle_sample() is verify.eagle_sample
