"""Triton ``tree_speculative_sampling`` against its PyTorch twin (and sgl-kernel's CUDA op when present).

Exact parity needs identical float arithmetic, which different summation orders (Triton's chunked
reduce / scan, torch's, CUDA's block reduce / scan) do not give in general. So the random target
probabilities are multiples of 2**-20 summing to at most 1: every partial sum is then exact in float32, in
any order, and kernel, twin and sgl-kernel compare the very same numbers. Coins are odd multiples of 2**-24,
never 0 and never equal to a running sum (divided by a threshold of 1 or 0.5), so sgl-kernel 0.4.5's
``coin <= acc`` and our strict ``q > 0 and coin < acc`` cannot disagree on them; the boundary cases where they
do are tested separately.
"""

import json
import math
import os
import random

import numpy as np
import pytest
import torch

from sgl_eagle_triton.devtools.reference.tree_sampling import tree_speculative_sampling as tree_speculative_sampling_ref
from sgl_eagle_triton.kernels.tree_sampling import tree_speculative_sampling
from tests.tree_cases import (
    assert_same_outputs,
    check_against_reference,
    check_graph_replay,
    make_tree,
    poisoned_outputs,
    sgl_kernel_tree_args,
)

QUANTUM = 2.0**-20  # target probabilities are multiples of this (see the module docstring)
ULP_BELOW_ONE = 1.0 - 2.0**-24  # the largest float32 below 1


def quantize(probs):
    """Round down to multiples of ``QUANTUM`` (float64 in, float32 out; exact)."""
    return (torch.floor(torch.as_tensor(probs, dtype=torch.float64) / QUANTUM) * QUANTUM).float()


def coins(gen, shape):
    """Uniforms in (0, 1): odd multiples of 2**-24, never equal to a multiple of ``QUANTUM``."""
    return ((2 * torch.randint(0, 1 << 23, shape, generator=gen) + 1).double() * 2.0**-24).float()


def target_row(np_rng, vocab, child_tokens, mode):
    """One float64 target distribution over ``vocab`` tokens, given the draft tokens of the node's children.

    ``follow``: 95 % of the mass on one child's token (accepted almost surely); ``avoid``: none on any child's
    token (all rejected); ``sparse``: 1 to 4 tokens only (top-k truncated, so most candidates have q == 0);
    ``dense``: a Dirichlet draw.
    """
    row = np_rng.dirichlet(np.full(vocab, np_rng.uniform(0.05, 1.0)))
    if mode == "follow" and child_tokens:
        row = 0.05 * row
        row[np_rng.choice(child_tokens)] += 0.95
    elif mode == "avoid" and child_tokens:
        row[child_tokens] = 0
        if row.sum() == 0:  # the children's tokens had all the mass: all-zero row if they cover the vocab
            row = np.ones(vocab)
            row[child_tokens] = 0
            if row.sum() == 0:
                return row
    elif mode == "sparse":
        keep = np_rng.choice(vocab, size=np_rng.integers(1, 5), replace=False)
        sparse = np.zeros(vocab)
        sparse[keep] = row[keep] + 1e-3
        row = sparse
    return row / row.sum()


def make_case(rng, bs, n, max_depth, topk, vocab, modes, mode_weights):
    """Random inputs of ``tree_speculative_sampling``: seven CPU tensors, in its argument order."""
    gen = torch.Generator().manual_seed(rng.randrange(1 << 30))
    np_rng = np.random.default_rng(rng.randrange(1 << 30))
    candidates = [[0] * n for _ in range(bs)]
    next_token, next_sibling = [], []
    probs = np.zeros((bs, n, vocab))
    for b in range(bs):
        first, sibling, children = make_tree(rng, n, max_depth, topk)
        next_token.append(first)
        next_sibling.append(sibling)
        candidates[b][0] = rng.randrange(vocab)
        for kids in children:  # siblings get distinct tokens (they come from a top-k) while the vocab allows
            tokens = rng.sample(range(vocab), min(len(kids), vocab))
            tokens += [rng.randrange(vocab) for _ in range(len(kids) - len(tokens))]
            for c, t in zip(kids, tokens, strict=True):
                candidates[b][c] = t
        for p, kids in enumerate(children):
            mode = rng.choices(modes, mode_weights)[0]
            probs[b, p] = target_row(np_rng, vocab, [candidates[b][c] for c in kids], mode)
    retrieve_index = [[b * n + r for r in range(n)] for b in range(bs)]
    trees = tuple(torch.tensor(t) for t in (candidates, retrieve_index, next_token, next_sibling))
    return (*trees, coins(gen, (bs, n)), coins(gen, (bs,)), quantize(probs))


def check(rng, device, spec_steps, inputs, thresholds=(1.0, 1.0)):
    """Run kernel and reference on identical poisoned outputs; all three must match exactly."""
    bs, n = inputs[0].shape
    return check_against_reference(tree_speculative_sampling, tree_speculative_sampling_ref,
                                   poisoned_outputs(rng, bs, n, spec_steps + 1), inputs, device, thresholds)


def random_case(seed):
    """(rng, spec_steps, thresholds, inputs) of random case ``seed``. The seed cycles through chains
    (topk 1), depth 1, trees deeper than S, vocabularies from 16 to 9000 (up to three of the kernel's
    chunks, the last one partial), mostly-accepting / mostly-rejecting / zero-probability-heavy targets
    and both threshold pairs."""
    rng = random.Random(seed)
    spec_steps = rng.randint(1, 10)
    bs, n = rng.randint(1, 8), rng.randint(2, 64)
    max_depth = 1 if seed % 7 == 0 else spec_steps + (2 if seed % 4 == 1 else 0)
    topk = [1, rng.randint(2, 8), rng.randint(1, 8)][seed % 3]
    vocab = rng.choice([16, 33, 64])  # mostly tiny, so that draft tokens are often accepted
    vocab = {3: 1000, 7: 4099, 13: 1000, 17: 4099, 19: 9000}.get(seed % 20, vocab)
    modes = ("follow", "avoid", "sparse", "dense")
    weights = [(6, 1, 1.5, 1.5), (1, 0, 0, 0), (0, 2, 1, 1), (3, 2, 4, 1), (1, 1, 1, 1)][seed % 5]
    thresholds = (0.3, 0.5) if seed % 6 == 5 else (1.0, 1.0)
    return rng, spec_steps, thresholds, make_case(rng, bs, n, max_depth, topk, vocab, modes, weights)


@pytest.mark.parametrize("seed", range(200))
def test_matches_reference(device, seed):
    rng, spec_steps, thresholds, inputs = random_case(seed)
    check(rng, device, spec_steps, inputs, thresholds)


def test_random_cases_cover_all_outcomes():
    """The random cases accept nothing, everything (m == S) and something in between (twin only)."""
    outcomes = set()
    for seed in range(0, 200, 3):
        rng, spec_steps, thresholds, inputs = random_case(seed)
        bs, n = inputs[0].shape
        outputs = poisoned_outputs(rng, bs, n, spec_steps + 1)
        tree_speculative_sampling_ref(*outputs, *inputs, *thresholds)
        outcomes |= {"none" if m == 0 else "all" if m == spec_steps else "some" for m in outputs[2].tolist()}
    assert outcomes == {"none", "some", "all"}


@pytest.mark.parametrize("n, spec_steps, vocab", [(2, 1, 16), (11, 10, 33), (40, 10, 1000), (64, 15, 64)])
def test_chain_full_and_zero_acceptance(device, n, spec_steps, vocab):
    """A chain whose every target row puts all its mass on the next draft token accepts min(S, n - 1) tokens;
    one whose rows put none there accepts 0."""
    rng = random.Random(n)
    bs = 3
    full = make_case(rng, bs, n, n - 1, 1, vocab, ("follow",), (1,))
    probs = torch.zeros_like(full[-1])
    for b in range(bs):
        for r in range(n - 1):
            probs[b, r, full[0][b, r + 1]] = 1.0
    full = (*full[:-1], probs)
    _, accept_index, accept_token_num = check(rng, device, spec_steps, full)
    m = min(spec_steps, n - 1)
    assert (accept_token_num == m).all()
    assert torch.equal(accept_index[:, : m + 1], full[1][:, : m + 1].int())
    zero = make_case(rng, bs, n, n - 1, 1, vocab, ("avoid",), (1,))
    assert (check(rng, device, spec_steps, zero)[2] == 0).all()


@pytest.mark.parametrize("seed", range(10))
def test_retrieve_index_outside_own_row(device, seed):
    """Outputs go to the flat positions ``retrieve_index`` names, even in another request's row; the target
    rows stay indexed by node."""
    rng = random.Random(1000 + seed)
    bs, n, spec_steps = 4, 24, 6
    inputs = make_case(rng, bs, n, spec_steps, 3, 16, ("follow", "dense"), (0.7, 0.3))
    retrieve_index = torch.tensor(rng.sample(range(bs * n), bs * n)).view(bs, n)
    check(rng, device, spec_steps, (inputs[0], retrieve_index, *inputs[2:]))


@pytest.mark.parametrize("seed", range(4))
def test_no_speculative_step(device, seed):
    """S = 0 (accept_index has one column): nothing is walked; the root row is sampled in full."""
    rng = random.Random(2000 + seed)
    check(rng, device, 0, make_case(rng, 3, 5, 2, 2, 33, ("dense", "sparse"), (1, 1)))


@pytest.mark.parametrize("bs", [1, 4])
def test_single_node_tree(device, bs):
    """Speculation off (adaptive steps 0: SGLang's one-node verify tree): the root row is sampled in full."""
    rng = random.Random(3000 + bs)
    check(rng, device, 0, make_case(rng, bs, 1, 0, 1, 33, ("dense", "sparse"), (1, 1)))


# ----------------------------------------------------------------------------------------------------------
# Hand-built requests: a root (node 0) with two leaf children, nodes 1 and 2.


def two_children_case(vocab, child_tokens, root_row, root_coin, final_coin):
    """One request: root row ``root_row`` (float32, given as a tensor or list), children tokens as given."""
    candidates = torch.tensor([[0, *child_tokens]])
    retrieve_index = torch.tensor([[0, 1, 2]])
    next_token = torch.tensor([[1, -1, -1]])
    next_sibling = torch.tensor([[-1, 2, -1]])
    probs = torch.zeros(1, 3, vocab)
    probs[0, 0] = torch.as_tensor(root_row, dtype=torch.float32)
    probs[0, 1:] = 1.0 / vocab
    uniforms = torch.tensor([[root_coin, 0.5, 0.5]])
    return candidates, retrieve_index, next_token, next_sibling, uniforms, torch.tensor([final_coin]), probs


@pytest.mark.parametrize("vocab", [16, 1000, 4099, 9000])
@pytest.mark.parametrize("final_coin", [ULP_BELOW_ONE, 1.0])
def test_final_coin_near_one_takes_last_positive_token(device, vocab, final_coin):
    """With ``u * sum(r)`` at (or within rounding of) ``sum(r)``, the correction token is the last one with
    r > 0 (the scan's fallback), skipping the rejected tokens V - 1 and V - 3 after it."""
    gen = torch.Generator().manual_seed(vocab)
    row = torch.zeros(vocab, dtype=torch.float64)
    row[: vocab - 4] = torch.rand(vocab - 4, generator=gen, dtype=torch.float64) * (
        torch.rand(vocab - 4, generator=gen) < 0.5
    )
    row[vocab - 5] = 0.05 * row.sum() + 0.01
    row = 0.98 * row / row.sum()
    row[vocab - 3] = row[vocab - 1] = 0.01
    inputs = two_children_case(vocab, (vocab - 1, vocab - 3), row, 0.999, final_coin)
    predicts, _, accept_token_num = check(random.Random(vocab), device, 2, inputs)
    assert accept_token_num.item() == 0
    assert predicts[0].item() == vocab - 5


@pytest.mark.parametrize("final_coin", [ULP_BELOW_ONE, 1.0])
def test_final_coin_near_one_exact_sums(device, final_coin):
    """Sums exact: with u = 1.0 no prefix sum exceeds u * sum(r), so the fallback picks the last r > 0."""
    vocab = 33
    row = torch.zeros(vocab)
    row[[3, 7, 11, 20, 30]] = torch.tensor([0.125, 0.25, 0.125, 0.25, 0.25])
    inputs = two_children_case(vocab, (20, 30), row, 0.75, final_coin)  # coin 0.75 > 0.25 + 0.25: rejected
    predicts, _, accept_token_num = check(random.Random(0), device, 1, inputs)
    assert accept_token_num.item() == 0
    assert predicts[0].item() == 11


@pytest.mark.parametrize("vocab", [16, 4099])
def test_all_zero_residual_samples_last_token(device, vocab):
    """All the mass on two children, both rejected (the coin, 1 - 2**-24, is above their sum, 1 - 2**-20):
    the residual is all zero and the correction token is V - 1. Same for an all-zero row after an accept."""
    row = torch.zeros(vocab)
    row[[2, 5]] = torch.tensor([0.5, 0.5 - QUANTUM])
    inputs = two_children_case(vocab, (2, 5), row, ULP_BELOW_ONE, 0.3)
    predicts, _, accept_token_num = check(random.Random(1), device, 2, inputs)
    assert accept_token_num.item() == 0
    assert predicts[0].item() == vocab - 1

    row = torch.zeros(vocab)
    row[5] = 1.0
    candidates, retrieve_index, next_token, next_sibling, uniforms, final, probs = two_children_case(
        vocab, (2, 5), row, 0.5, 0.3
    )
    probs[0, 2] = 0  # node 2 (token 5) is accepted; its own row is all zero
    predicts, accept_index, accept_token_num = check(
        random.Random(2), device, 2, (candidates, retrieve_index, next_token, next_sibling, uniforms, final, probs)
    )
    assert accept_token_num.item() == 1 and accept_index[0, :2].tolist() == [0, 2]
    assert predicts[[0, 2]].tolist() == [5, vocab - 1]


def test_correction_token_across_slices(device):
    """Rows of 20000 tokens, whose residual sums and prefix scans are split over five programs of 4096
    tokens: both children (0.25 each, in two slices) rejected, the correction token drawn with final coins
    landing in each slice, and with ``u * sum(r)`` exactly the prefix sum at a slice's end (``sum(r)`` is
    0.5), where it is the first positive token of the next slice."""
    vocab, slice_len, children = 20000, 4096, (4100, 15000)
    gen = torch.Generator().manual_seed(0)
    row = torch.rand(vocab, generator=gen, dtype=torch.float64)
    row[list(children)] = 0
    row[8192:8200] = 0  # the slice after the second boundary starts with zeros
    row = quantize(0.5 * row / row.sum()).double()
    row[7] += 0.5 - row.sum()  # exact multiples of 2**-20: r sums to 0.5, every prefix sum is exact
    row[list(children)] = 0.25
    residual = row.clone()
    residual[list(children)] = 0
    prefix = residual.cumsum(0)
    ends = [slice_len * (s + 1) - 1 for s in range(4)]
    final_coins = [2 * prefix[end].item() for end in ends] + [0.1, 0.3, 0.5, 0.7, 0.9, ULP_BELOW_ONE]
    cases = [two_children_case(vocab, children, row, 0.75, coin) for coin in final_coins]
    inputs = [torch.cat(parts) for parts in zip(*cases, strict=True)]
    inputs[1] += 3 * torch.arange(len(cases))[:, None]  # retrieve_index: each request its own flat positions
    predicts, _, accept_token_num = check(random.Random(4), device, 2, tuple(inputs))
    assert (accept_token_num == 0).all()
    for b, end in enumerate(ends):
        assert predicts[3 * b].item() == end + 1 + int((residual[end + 1:] > 0).int().argmax())
    assert len({predicts[3 * b].item() // slice_len for b in range(len(cases))}) == 5


# Acceptance boundaries where sgl-kernel 0.4.5 (`coin <= acc / threshold_acc || q >= threshold_single`) and the
# strict rule (`q > 0 && (coin < acc / threshold_acc || q >= threshold_single)`) differ:
# (name, children's probabilities, root coin, (threshold_single, threshold_acc), child accepted by the strict rule).
BOUNDARY_CASES = [
    ("coin equals the running sum", (0.25, 0.25), 0.5, (1.0, 1.0), None),  # 0.4.5 accepts child 2
    ("coin equals sum / threshold_acc", (0.125, 0.125), 0.5, (1.0, 0.5), None),  # 0.4.5 accepts child 2
    ("zero coin, zero-probability child", (0.0, 0.5), 0.0, (1.0, 1.0), 2),  # 0.4.5 accepts child 1
    ("threshold_single 0, zero-probability child", (0.0, 0.25), 0.9, (0.0, 1.0), 2),  # 0.4.5 accepts child 1
    ("threshold_acc 0 (capped at 1e-9)", (0.0, QUANTUM), 0.5, (1.0, 0.0), 2),  # both accept child 2
    ("coin just below the running sum", (0.25, 0.25), 0.5 - 2.0**-24, (1.0, 1.0), 2),  # both accept child 2
]


def boundary_inputs(child_probs, coin):
    vocab = 16
    row = torch.full((vocab,), 0.0)
    row[[4, 9]] = torch.tensor(child_probs)
    row[12] = 1.0 - sum(child_probs)
    return two_children_case(vocab, (4, 9), row, coin, 0.5)


@pytest.mark.parametrize("case", BOUNDARY_CASES, ids=[c[0] for c in BOUNDARY_CASES])
def test_strict_acceptance_rule(device, case):
    _, child_probs, coin, thresholds, accepted = case
    inputs = boundary_inputs(child_probs, coin)
    predicts, accept_index, accept_token_num = check(random.Random(3), device, 2, inputs, thresholds)
    if accepted is None:
        assert accept_token_num.item() == 0
        assert predicts[0].item() == 12  # the only token left in the residual
    else:
        assert accept_token_num.item() == 1
        assert accept_index[0, :2].tolist() == [0, accepted]
        assert predicts[0].item() == inputs[0][0, accepted].item()


# ----------------------------------------------------------------------------------------------------------
# Statistics (twin only): the first emitted token is distributed as the target.


def chi_square_ok(observed, probs):
    """Pearson's chi-square goodness of fit at p > 1e-3 (scipy), or a generous bound without scipy."""
    expected = probs * observed.sum()
    stat = float(((observed - expected) ** 2 / expected).sum())
    df = len(probs) - 1
    try:
        from scipy.stats import chi2
    except ImportError:
        return stat < df + 10 * math.sqrt(2 * df)
    return chi2.sf(stat, df) > 1e-3


def test_first_token_follows_target_distribution():
    """Root with children tokens 1, 4, 2 (node 1 with children of its own), S = 2: over 20000 coin draws the
    token emitted right after the root is distributed as the root's target row. Not zeroing the rejected
    tokens in the residual (resampling the full row when nothing is accepted) must fail the same check."""
    draws, vocab, n = 20000, 6, 6
    root_probs = torch.tensor([0.1, 0.3, 0.15, 0.05, 0.25, 0.15])
    candidates = torch.tensor([[0, 1, 4, 2, 0, 3]]).expand(draws, n).contiguous()
    retrieve_index = torch.arange(draws * n).view(draws, n)
    next_token = torch.tensor([[1, 4, -1, -1, -1, -1]]).expand(draws, n).contiguous()
    next_sibling = torch.tensor([[-1, 2, 3, -1, 5, -1]]).expand(draws, n).contiguous()
    probs = torch.full((n, vocab), 1.0 / vocab)
    probs[0] = root_probs
    probs[1] = torch.tensor([0.4, 0.0, 0.1, 0.2, 0.2, 0.1])
    probs = probs.expand(draws, n, vocab).contiguous()
    gen = torch.Generator().manual_seed(0)
    uniforms, final = torch.rand(draws, n, generator=gen), torch.rand(draws, generator=gen)
    predicts = torch.zeros(draws * n, dtype=torch.int32)
    accept_index = torch.full((draws, 3), -1, dtype=torch.int32)
    accept_token_num = torch.zeros(draws, dtype=torch.int32)
    tree_speculative_sampling_ref(
        predicts, accept_index, accept_token_num, candidates, retrieve_index, next_token, next_sibling,
        uniforms, final, probs,
    )
    first = predicts.view(draws, n)[:, 0].long()
    assert chi_square_ok(torch.bincount(first, minlength=vocab).double(), root_probs.double())
    assert 0 < (accept_token_num == 0).sum() < draws  # both paths (accept a child / correct at the root) ran

    full_row_sample = torch.searchsorted(root_probs.cumsum(0), final * root_probs.sum(), right=True)
    broken = torch.where(accept_token_num == 0, full_row_sample.clamp(max=vocab - 1), first)
    assert not chi_square_ok(torch.bincount(broken, minlength=vocab).double(), root_probs.double())


# ----------------------------------------------------------------------------------------------------------
# CUDA only: sgl-kernel's op, CUDA graphs.


def sgl_kernel_outputs(sgl_kernel, outputs, inputs, thresholds):
    """Run sgl-kernel's ``tree_speculative_sampling_target_only`` in place on ``outputs``."""
    candidates, retrieve_index, next_token, next_sibling, uniforms, final, probs = inputs
    sgl_kernel.tree_speculative_sampling_target_only(
        **sgl_kernel_tree_args(outputs, candidates, retrieve_index, next_token, next_sibling),
        uniform_samples=uniforms,
        uniform_samples_for_final_sampling=final,
        target_probs=probs,
        draft_probs=torch.zeros_like(probs),
        threshold_single=thresholds[0],
        threshold_acc=thresholds[1],
        deterministic=True,
    )


def matches_sgl_kernel(rng, spec_steps, inputs, thresholds):
    sgl_kernel = pytest.importorskip("sgl_kernel")
    inputs = [t.cuda() for t in inputs]
    bs, n = inputs[0].shape
    ours = [t.cuda() for t in poisoned_outputs(rng, bs, n, spec_steps + 1)]
    theirs = [t.clone() for t in ours]
    tree_speculative_sampling(*ours, *inputs, *thresholds)
    sgl_kernel_outputs(sgl_kernel, theirs, inputs, thresholds)
    assert_same_outputs(ours, theirs)


@pytest.mark.gpu
@pytest.mark.parametrize("seed", range(60))
def test_matches_sgl_kernel(seed):
    """Integers identical: the inputs make every float operation exact and no coin tie a running sum."""
    rng, spec_steps, thresholds, inputs = random_case(seed)
    matches_sgl_kernel(rng, spec_steps, inputs, thresholds)


@pytest.mark.gpu
@pytest.mark.parametrize("bs", [1, 6])
def test_full_vocab_matches_reference_and_sgl_kernel(bs):
    """Llama-3's 128256 tokens, the correction token's residual split over 32 programs per request."""
    rng = random.Random(bs)
    inputs = make_case(rng, bs, 8, 4, 2, 128256, ("follow", "avoid", "sparse", "dense"), (1, 1, 1, 1))
    check(rng, "cuda", 4, inputs)
    matches_sgl_kernel(rng, 4, inputs, (1.0, 1.0))


@pytest.mark.gpu
@pytest.mark.parametrize("final_coin", [ULP_BELOW_ONE, 1.0])
def test_edge_cases_match_sgl_kernel(final_coin):
    """The exact-sum fallback and the all-zero residual, as sgl-kernel does them."""
    row = torch.zeros(33)
    row[[3, 7, 11, 20, 30]] = torch.tensor([0.125, 0.25, 0.125, 0.25, 0.25])
    matches_sgl_kernel(random.Random(0), 1, two_children_case(33, (20, 30), row, 0.75, final_coin), (1.0, 1.0))
    row = torch.zeros(4099)
    row[[2, 5]] = torch.tensor([0.5, 0.5 - QUANTUM])
    matches_sgl_kernel(random.Random(1), 2, two_children_case(4099, (2, 5), row, ULP_BELOW_ONE, 0.3), (1.0, 1.0))


@pytest.mark.gpu
@pytest.mark.parametrize("case", BOUNDARY_CASES, ids=[c[0] for c in BOUNDARY_CASES])
def test_boundary_cases_vs_sgl_kernel(case, record_property):
    """Records what the installed sgl-kernel does at the acceptance boundaries (asserting nothing about it)
    and checks that our kernel follows the strict rule there."""
    sgl_kernel = pytest.importorskip("sgl_kernel")
    name, child_probs, coin, thresholds, accepted = case
    inputs = [t.cuda() for t in boundary_inputs(child_probs, coin)]
    ours = [t.cuda() for t in (torch.zeros(3, dtype=torch.int32), torch.full((1, 3), -1, dtype=torch.int32),
                               torch.zeros(1, dtype=torch.int32))]
    theirs = [t.clone() for t in ours]
    tree_speculative_sampling(*ours, *inputs, *thresholds)
    sgl_kernel_outputs(sgl_kernel, theirs, inputs, thresholds)
    accepted_by_sgl_kernel = theirs[1][0, 1].item() if theirs[2].item() > 0 else None
    record_property("sgl_kernel_accepted_child", accepted_by_sgl_kernel)
    print(f"{name}: sgl-kernel accepts child {accepted_by_sgl_kernel}, strict rule child {accepted}")
    if os.environ.get("E2E_REPORT_DIR"):  # the GPU run's record of the installed sgl-kernel's rule
        with open(os.path.join(os.environ["E2E_REPORT_DIR"], "sgl-kernel-boundary.jsonl"), "a") as f:
            f.write(json.dumps({"case": name, "sgl_kernel": accepted_by_sgl_kernel, "strict": accepted}) + "\n")
    assert (ours[1][0, 1].item() if ours[2].item() > 0 else None) == accepted
    if accepted is not None:
        assert ours[0][0].item() == inputs[0][0, accepted].item()


@pytest.mark.gpu
@pytest.mark.parametrize("vocab", [1000, 20000])
def test_cuda_graph_replay(vocab):
    """Captured once, the launches verify fresh inputs copied into the captured buffers (20000 tokens: rows
    split over programs)."""
    rng = random.Random(0)
    bs, n, spec_steps = 4, 16, 5
    modes, weights = ("follow", "sparse", "dense"), (0.6, 0.2, 0.2)
    def fresh():
        return make_case(rng, bs, n, spec_steps, 4, vocab, modes, weights), poisoned_outputs(rng, bs, n, spec_steps + 1)

    inputs, outputs = ([t.cuda() for t in ts] for ts in fresh())
    check_graph_replay(tree_speculative_sampling, tree_speculative_sampling_ref, inputs, outputs, fresh)
