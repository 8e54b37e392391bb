"""Triton ``verify_tree_greedy`` against its PyTorch twin (and sgl-kernel's CUDA op when present)."""

import random

import pytest
import torch

from sgl_eagle_triton.devtools.reference.verify_greedy import verify_tree_greedy as verify_tree_greedy_ref
from sgl_eagle_triton.kernels.verify_greedy import verify_tree_greedy
from tests.tree_cases import (
    assert_same_outputs,
    check_against_reference,
    check_graph_replay,
    make_tree,
    poisoned_outputs,
    sgl_kernel_tree_args,
)


def make_case(rng, bs, n, max_depth, topk, vocab, p_follow):
    """Random draft trees linked as SGLang's build_tree links them: five [bs, n] int64 CPU tensors.

    Trees from :func:`tree_cases.make_tree`. The draft tokens come from ``vocab`` ids; ``target_predict`` at
    a node is the token of one of its children with probability ``p_follow``, else a random id, and an
    out-of-vocab id (never accepted) when ``p_follow == 0``.
    """
    candidates = [[rng.randrange(vocab) for _ in range(n)] for _ in range(bs)]
    next_token, next_sibling = [], []
    target_predict = [[vocab] * n for _ in range(bs)]
    for b in range(bs):
        first, sibling, children = make_tree(rng, n, max_depth, topk)
        next_token.append(first)
        next_sibling.append(sibling)
        for p, kids in enumerate(children):
            if kids and rng.random() < p_follow:
                target_predict[b][p] = candidates[b][rng.choice(kids)]
            elif p_follow > 0:
                target_predict[b][p] = rng.randrange(vocab)
    retrieve_index = [[b * n + r for r in range(n)] for b in range(bs)]
    return tuple(torch.tensor(t) for t in (candidates, retrieve_index, next_token, next_sibling, target_predict))


def check(rng, device, bs, n, spec_steps, inputs):
    """Run kernel and reference on identical poisoned outputs; all three must match exactly."""
    return check_against_reference(verify_tree_greedy, verify_tree_greedy_ref,
                                   poisoned_outputs(rng, bs, n, spec_steps + 1), inputs, device)


def random_config(rng, seed):
    """Shape and tree statistics of one random case. The seed cycles through chains (topk 1), depth 1,
    trees deeper than S (the walk stops after S levels) and full / zero / partial acceptance."""
    spec_steps = rng.randint(1, 10)
    return dict(
        bs=rng.randint(1, 8),
        n=rng.randint(2, 64),
        spec_steps=spec_steps,
        max_depth=1 if seed % 7 == 0 else spec_steps + (2 if seed % 4 == 1 else 0),
        topk=[1, rng.randint(2, 8), rng.randint(1, 8)][seed % 3],
        vocab=rng.randint(4, 8),
        p_follow=[0.7, 1.0, 0.0, 0.9, rng.random()][seed % 5],
    )


def random_case(seed):
    """(rng, config, inputs) of random case ``seed``."""
    rng = random.Random(seed)
    cfg = random_config(rng, seed)
    return rng, cfg, make_case(rng, cfg["bs"], cfg["n"], cfg["max_depth"], cfg["topk"], cfg["vocab"], cfg["p_follow"])


@pytest.mark.parametrize("seed", range(200))
def test_matches_reference(device, seed):
    rng, cfg, inputs = random_case(seed)
    check(rng, device, cfg["bs"], cfg["n"], cfg["spec_steps"], inputs)


@pytest.mark.parametrize("n, spec_steps", [(2, 1), (11, 10), (100, 10), (128, 15)])
def test_chain_full_and_zero_acceptance(device, n, spec_steps):
    """A chain (topk 1, n - 1 deep) whose every target matches accepts min(S, n - 1) tokens; none matching, 0."""
    rng = random.Random(n)
    bs = 3
    full = make_case(rng, bs, n, n - 1, 1, 5, 1.0)
    _, accept_index, accept_token_num = check(rng, device, bs, n, spec_steps, full)
    m = min(spec_steps, n - 1)
    assert (accept_token_num == m).all()
    assert torch.equal(accept_index[:, : m + 1], full[1][:, : m + 1].int())
    zero = make_case(rng, bs, n, n - 1, 1, 5, 0.0)
    assert (check(rng, device, bs, n, spec_steps, zero)[2] == 0).all()


@pytest.mark.parametrize("bs", [1, 5])
def test_single_node_tree_is_a_plain_decode(device, bs):
    """Speculation off (adaptive steps 0, SGLang's one-node verify tree): the root is accepted, nothing else,
    and the target's token at the root is the prediction."""
    rng = random.Random(bs)
    candidates = torch.tensor([[rng.randrange(9)] for _ in range(bs)])
    target_predict = torch.tensor([[rng.randrange(9)] for _ in range(bs)])
    none = torch.full((bs, 1), -1)
    retrieve_index = torch.arange(bs).view(bs, 1)
    predicts, accept_index, accept_token_num = check(rng, device, bs, 1, 0, (candidates, retrieve_index, none, none,
                                                                             target_predict))
    assert (accept_token_num == 0).all() and torch.equal(accept_index, retrieve_index.int())
    assert torch.equal(predicts, target_predict.view(-1).int())


@pytest.mark.parametrize("seed", range(10))
def test_retrieve_index_outside_own_row(device, seed):
    """``target_predict`` is read at the flat position that ``retrieve_index`` names, even in another row."""
    rng = random.Random(1000 + seed)
    bs, n, spec_steps = 4, 24, 6
    candidates, _, next_token, next_sibling, target_predict = make_case(rng, bs, n, spec_steps, 3, 4, 0.8)
    retrieve_index = torch.tensor(rng.sample(range(bs * n), bs * n)).view(bs, n)
    check(rng, device, bs, n, spec_steps, (candidates, retrieve_index, next_token, next_sibling, target_predict))


@pytest.mark.gpu
@pytest.mark.parametrize("seed", range(50))
def test_matches_sgl_kernel(seed):
    sgl_kernel = pytest.importorskip("sgl_kernel")
    rng, cfg, inputs = random_case(seed)
    candidates, retrieve_index, next_token, next_sibling, target_predict = (t.cuda() for t in inputs)
    ours = [t.cuda() for t in poisoned_outputs(rng, cfg["bs"], cfg["n"], cfg["spec_steps"] + 1)]
    theirs = [t.clone() for t in ours]
    verify_tree_greedy(*ours, candidates, retrieve_index, next_token, next_sibling, target_predict)
    sgl_kernel.verify_tree_greedy(**sgl_kernel_tree_args(theirs, candidates, retrieve_index, next_token, next_sibling),
                                  target_predict=target_predict)
    assert_same_outputs(ours, theirs)


@pytest.mark.gpu
def test_cuda_graph_replay():
    """Captured once, the launch verifies fresh inputs copied into the captured buffers."""
    rng = random.Random(0)
    bs, n, spec_steps = 4, 16, 5
    def fresh():
        return make_case(rng, bs, n, spec_steps, 4, 6, 0.7), poisoned_outputs(rng, bs, n, spec_steps + 1)

    inputs, outputs = ([t.cuda() for t in ts] for ts in fresh())
    check_graph_replay(verify_tree_greedy, verify_tree_greedy_ref, inputs, outputs, fresh)
