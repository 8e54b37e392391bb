"""Triton ``prepare_target_probs`` against its float64 PyTorch twin, SGLang's non-speculative sampler's keep
rule, and (CUDA only) sgl-kernel's ``top_k_renorm_prob`` / ``top_p_renorm_prob``.

The kernel decides ties and thresholds on float32 values, the oracles on float64 (twin) or on their own
float32 sums. Random rows are therefore redrawn until no keep decision lies within rounding distance of its
threshold (``ambiguous``); exact ties are kept in (the kernel and the twin agree on them by definition).
"""

import random

import pytest
import torch

from sgl_eagle_triton.devtools.reference.target_probs import prepare_target_probs as prepare_target_probs_ref
from sgl_eagle_triton.kernels.target_probs import prepare_target_probs

ALL = 1 << 30  # SGLang's top_k for "no top-k"
TOP_KS = [1, 2, 5, 50, ALL]
TOP_PS = [0.1, 0.5, 0.9, 1.0]
MIN_PS = [0.0, 0.05, 0.2]
KINDS = ["spread", "flat", "ties", "peaked"]


def ambiguous(row, temperature, top_k, top_p, min_p, mass_tol=3e-6, rel_tol=1e-5, ties_ok=True):
    """Whether some keep decision of logits ``row`` [V] is within float32 rounding of its threshold:
    relative gap below ``rel_tol`` between the last token kept and the first dropped by top-k, a prefix
    mass within ``mass_tol`` of ``top_p``, a ``p / max(p)`` within ``rel_tol`` of ``min_p``, or
    ``exp(l - max)`` near float32's subnormal range (where GPUs may flush to zero)."""
    logits = row.double() / temperature
    shifted = logits - logits.max()
    if ((shifted > -110) & (shifted < -85)).any():
        return True
    vals, counts = torch.unique_consecutive(torch.softmax(logits, -1).sort(descending=True).values,
                                            return_counts=True)
    if not ties_ok and (counts > 1).any():
        return True
    count_greater = torch.cumsum(counts, 0) - counts
    mass_greater = torch.cumsum(vals * counts, 0) - vals * counts
    first_dropped = int((count_greater < top_k).sum())
    if 0 < first_dropped < len(vals):
        last_kept, dropped = vals[first_dropped - 1], vals[first_dropped]
        if last_kept - dropped <= rel_tol * last_kept:
            return True
    if top_p < 1 and ((mass_greater - top_p).abs() <= mass_tol).any():
        return True
    return min_p > 0 and bool(((vals / vals[0] - min_p).abs() <= rel_tol * min_p).any())


def draw_row(gen, vocab, kind, params, **tol):
    """Random float32 logits [vocab] of ``kind``, redrawn until ``ambiguous`` is False.

    spread: randn * 3 (realistic); flat: randn * 0.5; ties: spread with exact copies of the max and of
    other top values; peaked: one token 300 above the rest (every other probability underflows to 0)."""
    for _ in range(200):
        row = torch.randn(vocab, generator=gen) * (0.5 if kind == "flat" else 3.0)
        if kind == "ties":
            order = row.argsort(descending=True)
            top = order[: min(vocab, 60)]
            for _ in range(max(1, vocab // 8)):
                src = top[torch.randint(len(top), (1,), generator=gen)]
                row[torch.randint(vocab, (1,), generator=gen)] = row[src]
            row[order[-1]] = row[order[0]]  # a tie at the max
        elif kind == "peaked":
            row[torch.randint(vocab, (1,), generator=gen)] += 300.0
        if not ambiguous(row, *params, **tol):
            return row
    raise AssertionError(f"no unambiguous {kind} row for {params}")


def make_batch(rng, vocab, bs, n, params, kinds=KINDS, **tol):
    """Logits [bs * n, vocab] and per-request parameter tensors (temperatures as [bs, 1])."""
    gen = torch.Generator().manual_seed(rng.randrange(1 << 30))
    rows = [draw_row(gen, vocab, rng.choice(kinds), params[b], **tol) for b in range(bs) for _ in range(n)]
    temperatures, top_ks, top_ps, min_ps = zip(*params, strict=True)
    return (torch.stack(rows), torch.tensor(temperatures).view(bs, 1), torch.tensor(top_ks, dtype=torch.int32),
            torch.tensor(top_ps), torch.tensor(min_ps), n)


def random_params(rng):
    """(temperature, top_k, top_p, min_p) of one request; one in six is greedy (T = 1, top_k = 1)."""
    if rng.random() < 1 / 6:
        return (1.0, 1, 1.0, 0.0)
    return (round(rng.uniform(0.3, 2.0), 3), rng.choice(TOP_KS), rng.choice(TOP_PS), rng.choice(MIN_PS))


def to(device, args):
    return tuple(t.to(device) if isinstance(t, torch.Tensor) else t for t in args)


def rel_err(got, expected):
    return float((got.double() - expected.double()).norm() / expected.double().norm())


def check(device, args):
    """Kernel on ``device`` vs the float64 twin: same kept set, relative error < 1e-5, rows sum to 1."""
    got = prepare_target_probs(*to(device, args)).cpu()
    expected = prepare_target_probs_ref(*args)
    assert torch.equal(got > 0, expected > 0), (got > 0).sum(-1).tolist()
    assert rel_err(got, expected) < 1e-5
    assert torch.allclose(got.double().sum(-1), torch.ones(len(got), dtype=torch.float64), atol=1e-5)
    return got


@pytest.mark.parametrize("seed", range(60))
def test_matches_reference(device, seed):
    rng = random.Random(seed)
    vocab = 32000 if seed % 15 == 0 else rng.choice([16, 100, 1000, 4099])
    n = rng.randint(1, 4)
    bs = rng.randint(1, 2) if vocab == 32000 else rng.randint(1, 16 // n)
    if vocab == 32000:
        n = min(n, 2)
    check(device, make_batch(rng, vocab, bs, n, [random_params(rng) for _ in range(bs)]))


@pytest.mark.parametrize("top_k", TOP_KS)
@pytest.mark.parametrize("top_p", TOP_PS)
@pytest.mark.parametrize("min_p", MIN_PS)
def test_every_filter_combination(device, top_k, top_p, min_p):
    rng = random.Random(top_k * 7 + int(top_p * 100) + int(min_p * 1000))
    params = [(0.7, top_k, top_p, min_p), (1.3, top_k, top_p, min_p)]
    check(device, make_batch(rng, 1000, 2, 3, params))


def test_ties_are_kept_whole(device):
    """Top-k and top-p keep every token tied with the last one kept; equal logits get equal probability."""
    probs = torch.tensor([0.3, 0.15, 0.15, 0.15, 0.1, 0.1, 0.05])
    logits = probs.log()[torch.tensor([4, 1, 0, 5, 2, 6, 3])].repeat(3, 1)  # shuffled
    # top-k 2: the 0.15s rank 2nd to 4th, all kept. top-p 0.4: the mass above the 0.15s is 0.3 <= 0.4, all
    # kept; above the 0.1s 0.75. min-p 0.4: 0.15 >= 0.4 * 0.3 kept, 0.1 dropped.
    args = (logits, torch.ones(3), torch.tensor([2, ALL, ALL], dtype=torch.int32), torch.tensor([1.0, 0.4, 1.0]),
            torch.tensor([0.0, 0.0, 0.4]), 1)
    got = check(device, args)
    expected = torch.tensor([0.0, 0.2, 0.4, 0.0, 0.2, 0.0, 0.2])
    assert torch.allclose(got, expected.expand(3, 7))


def test_boundaries_are_inclusive(device):
    """A token whose strictly-larger mass equals top_p exactly, or whose p / max(p) equals min_p exactly, is
    kept (SGLang's sampler keeps ``cumsum - p <= top_p``; flashinfer's top-p would drop it). Exact only where
    float32 exp(-ln 2) rounds to 0.5, as numpy's does under the interpreter."""
    if device != "cpu":
        pytest.skip("needs exactly rounded float32 exp (the interpreter's)")
    half = torch.tensor(0.5).log()
    assert torch.exp(half) == 0.5
    row = torch.full((8,), float("-inf"))
    row[[1, 6]] = 0.0
    row[[0, 2, 3, 5]] = half  # e = 1, 1, 0.5 x 4, 0 x 2: sum 4; mass above the 0.5s is 2 = 0.5 * 4
    args = (row.repeat(2, 1), torch.ones(2), torch.tensor([ALL, ALL], dtype=torch.int32),
            torch.tensor([0.5, 1.0]), torch.tensor([0.0, 0.5]), 1)
    got = prepare_target_probs(*args)
    expected = torch.tensor([0.125, 0.25, 0.125, 0.125, 0.0, 0.125, 0.25, 0.0])
    assert torch.equal(got, expected.expand(2, 8))


def test_greedy_rows_are_one_hot(device):
    """T = 1, top_k = 1: one-hot at the first argmax (torch.argmax), ties included. Mixed with sampled requests."""
    gen = torch.Generator().manual_seed(0)
    n, vocab = 3, 4099
    logits = torch.randn(3 * n, vocab, generator=gen) * 3
    logits[1, [7, 2000, 4098]] = logits[1].max() + 1.0  # three-way tie at the max
    logits[2, 5] = 1e4  # peaked
    temperatures = torch.tensor([1.0, 0.8, 1.0])
    top_ks = torch.tensor([1, 50, 1], dtype=torch.int32)
    top_ps, min_ps = torch.tensor([1.0, 0.9, 1.0]), torch.zeros(3)
    got = prepare_target_probs(*to(device, (logits, temperatures, top_ks, top_ps, min_ps, n))).cpu()
    for r in [*range(n), *range(2 * n, 3 * n)]:
        assert torch.equal(got[r], torch.zeros(vocab).index_fill_(0, logits[r].argmax(), 1.0)), r
    assert got[1, 7] == 1.0
    assert ((got[n:2 * n] > 0).sum(-1) > 1).all()


def test_in_place(device):
    rng = random.Random(5)
    args = to(device, make_batch(rng, 4099, 3, 2, [random_params(rng) for _ in range(3)]))
    expected = prepare_target_probs(*args)
    logits = args[0].clone()
    assert prepare_target_probs(logits, *args[1:], out=logits) is logits
    assert torch.equal(logits, expected)


def test_underflow_and_masked_tokens(device):
    """Tokens whose probability underflows to 0, or whose logit is -inf (grammar masks), get 0 whatever the
    filters: with top_p = 1 and top_k past them they are 'kept' at probability 0."""
    gen = torch.Generator().manual_seed(1)
    logits = torch.randn(6, 1000, generator=gen) * 3
    logits[:3, 10] += 300.0
    logits[3:, ::3] = float("-inf")
    params = [(1.0, ALL, 1.0, 0.0), (0.5, 50, 1.0, 0.0), (2.0, ALL, 0.5, 0.05)]
    for b, (temperature, top_k, top_p, min_p) in enumerate(params):
        args = (logits[[b, b + 3]], torch.tensor([temperature]), torch.tensor([top_k], dtype=torch.int32),
                torch.tensor([top_p]), torch.tensor([min_p]), 2)
        got = check(device, args)
        assert torch.equal(got[0], torch.zeros(1000).index_fill_(0, torch.tensor([10]), 1.0))
        assert (got[1, ::3] == 0).all() and (got[1] > 0).sum() > 1


@pytest.mark.parametrize("top_k, min_p", [(900, 0.0), (900, 1e-15), (ALL, 1e-15)])
def test_threshold_below_search_floor(device, top_k, min_p):
    """Kept tokens with e = exp(l - max) below 2**-32, where the search starts, make it look lower."""
    gen = torch.Generator().manual_seed(top_k)
    params = (1.0, top_k, 1.0, min_p)
    rows = []
    while len(rows) < 4:
        row = torch.randn(1000, generator=gen) * 10  # the 900th largest e is near 1e-19
        if not ambiguous(row, *params):
            rows.append(row)
    args = (torch.stack(rows), torch.ones(2), torch.tensor([top_k] * 2, dtype=torch.int32), torch.ones(2),
            torch.tensor([min_p] * 2), 2)
    got = check(device, args)
    assert ((got > 0) & (got < 2.0**-32)).any()


@pytest.mark.parametrize("vocab", [64, 12288])
def test_search_that_needs_every_pass(device, vocab):
    """The top-k boundary between two logits one float32 ulp apart, at e = exp(l - max) below 2**-32: the
    search goes below its floor, then narrows the bracket down to one key. Under the interpreter's exactly
    rounded exp this takes all ``MAX_PASSES`` passes (one fewer keeps both tokens). 12288 tokens: the row is
    split over programs, one launch per pass. The keys are 16 apart: GPU exp may merge them."""
    if device != "cpu":
        pytest.skip("needs exactly rounded float32 exp (the interpreter's)")
    l1 = torch.tensor(-24.11)
    cols = [5, 7000, 11, 9000, 3000, 12000, 63, 6144, 12286] if vocab > 64 else list(range(9))
    row = torch.full((vocab,), -60.0)
    row[cols] = torch.tensor([0.0, -1.0, -1.8, -2.6, -3.4, -4.2, -5.0, l1, torch.nextafter(l1, torch.tensor(-30.0))])
    args = (row.repeat(2, 1), torch.ones(2), torch.tensor([8, 8], dtype=torch.int32), torch.ones(2), torch.zeros(2), 1)
    got = check(device, args)
    assert (got > 0).sum(-1).tolist() == [8, 8]


@pytest.mark.parametrize("vocab", [200, 12288])
@pytest.mark.parametrize("drop", [1, 3])
def test_near_flat_rows_at_their_smallest_tokens(device, vocab, drop):
    """Near-flat rows (every e = exp(l - max) far above 2**-32, split over programs at 12288 tokens): top-k drops
    exactly the ``drop`` smallest tokens (a search cut short, e.g. at two passes, keeps them)."""
    gen = torch.Generator().manual_seed(vocab + drop)
    top_k, top_p = vocab - drop, 1.0
    params = (1.0, top_k, top_p, 0.0)
    rows = []
    for _ in range(200):
        if len(rows) == 2:
            break
        row = torch.randn(vocab, generator=gen) * 0.05
        if not ambiguous(row, *params, ties_ok=False):
            rows.append(row)
    assert len(rows) == 2, "no unambiguous near-flat rows"
    args = (torch.stack(rows), torch.ones(2), torch.tensor([top_k] * 2, dtype=torch.int32), torch.tensor([top_p] * 2),
            torch.zeros(2), 1)
    got = check(device, args)
    assert (got > 0).sum(-1).tolist() == [vocab - drop] * 2
    smallest = torch.stack(rows).argsort(-1)[:, :drop]
    assert (got.gather(1, smallest) == 0).all()


def test_rows_split_over_programs(device):
    """Rows of 12288 tokens, split over three programs: the first argmax across slices, a slice of -inf
    logits only, min-p only (one settling pass) and keep-all rows, and searched rows."""
    vocab = 12288
    params = [(1.0, 1, 1.0, 0.0), (0.9, ALL, 0.9, 0.0), (0.7, 50, 1.0, 0.05), (1.2, ALL, 1.0, 0.1),
              (1.0, ALL, 1.0, 0.0), (0.8, 20, 0.8, 0.02)]
    gen = torch.Generator().manual_seed(3)
    rows = []
    for b, (temperature, top_k, top_p, min_p) in enumerate(params):
        while True:
            row = torch.randn(vocab, generator=gen) * 3
            if b == 0:
                row[[5000, 9000, 12000]] = row.max() + 1.0  # tied maxima in the second and third slices
            if b == 1:
                row[:4096] = float("-inf")  # the whole first slice masked
            if not ambiguous(row, temperature, top_k, top_p, min_p):
                break
        rows.append(row)
    temperatures, top_ks, top_ps, min_ps = zip(*params, strict=True)
    args = (torch.stack(rows), torch.tensor(temperatures), torch.tensor(top_ks, dtype=torch.int32),
            torch.tensor(top_ps), torch.tensor(min_ps), 1)
    got = check(device, args)
    assert torch.equal(got[0], torch.zeros(vocab).index_fill_(0, torch.tensor([5000]), 1.0))
    assert (got[1, :4096] == 0).all() and (got[4] > 0).all()


def sglang_nonspec_keep(probs, top_ks, top_ps, min_ps):
    """The tokens SGLang's ``top_k_top_p_min_p_sampling_from_probs_torch`` (sglang/srt/layers/sampler.py,
    need_min_p_sampling=True) leaves non-zero: its masking lines, verbatim, on sorted probabilities."""
    probs_sort, probs_idx = probs.sort(dim=-1, descending=True)
    probs_sum = torch.cumsum(probs_sort, dim=-1)
    probs_sort[torch.arange(0, probs.shape[-1], device=probs.device).view(1, -1) >= top_ks.view(-1, 1)] = 0.0
    probs_sort[(probs_sum - probs_sort) > top_ps.view(-1, 1)] = 0.0
    min_p_thresholds = probs_sort[:, 0] * min_ps
    probs_sort[probs_sort < min_p_thresholds.view(-1, 1)] = 0.0
    return torch.zeros_like(probs_sort, dtype=torch.bool).scatter(-1, probs_idx, probs_sort > 0)


@pytest.mark.parametrize("seed", range(12))
def test_matches_sglang_nonspeculative_sampler(device, seed):
    """Same kept sets as SGLang's torch sampler on tie-free rows (it cuts ties by sort order)."""
    rng = random.Random(100 + seed)
    bs, n = 4, 2
    params = [random_params(rng) for _ in range(bs)]
    logits, temperatures, top_ks, top_ps, min_ps, _ = make_batch(
        rng, rng.choice([1000, 4099]), bs, n, params, kinds=["spread", "flat"], mass_tol=1e-5, ties_ok=False)
    got = prepare_target_probs(*to(device, (logits, temperatures, top_ks, top_ps, min_ps, n))).cpu()

    def per_row(t):
        return t.view(-1).repeat_interleave(n)

    probs = torch.softmax(logits / per_row(temperatures)[:, None], dim=-1)
    keep = sglang_nonspec_keep(probs, per_row(top_ks).long(), per_row(top_ps), per_row(min_ps))
    assert torch.equal(got > 0, keep)


# sgl-kernel (CUDA). sgl_kernel.top_k_renorm_prob / top_p_renorm_prob are flashinfer's (0.6.15 for SGLang
# 0.5.17): top-k keeps p >= the k-th largest p (ties kept), as we do. top-p keeps p >= v for the largest v
# with sum(p > v) < top_p * sum(p) (radix "AIR" kernel, V >= 2048) or sum(p > v) < top_p (ternary search,
# V < 2048); ties at v kept. Ours: <= instead of <, equal unless a prefix sum hits top_p exactly; on the
# rows used here every prefix sum is >= 3e-6 away from top_p.
CUDA_VOCABS = [100, 4099, 32000, 128256]


def sgl_kernel_case(seed, vocab, params, bs=4, n=2, kinds=("spread", "flat")):
    rng = random.Random(seed)
    args = make_batch(rng, vocab, bs, n, params, kinds=kinds)
    logits, temperatures, top_ks, top_ps, min_ps, _ = to("cuda", args)

    def per_row(t):
        return torch.repeat_interleave(t, n, dim=0)

    probs = torch.softmax(logits / per_row(temperatures), dim=-1)  # as SGLang's eagle_sample
    return args, probs, per_row(top_ks), per_row(top_ps)


@pytest.mark.gpu
@pytest.mark.parametrize("vocab", CUDA_VOCABS)
def test_matches_sgl_kernel_top_k_renorm(vocab):
    sgl_kernel = pytest.importorskip("sgl_kernel")
    params = [(0.7, 1, 1.0, 0.0), (1.0, 5, 1.0, 0.0), (1.5, 50, 1.0, 0.0), (0.5, 2000, 1.0, 0.0)]
    args, probs, top_ks, _ = sgl_kernel_case(vocab, vocab, params)
    got = prepare_target_probs(*to("cuda", args))
    expected = sgl_kernel.top_k_renorm_prob(probs, top_ks)
    assert torch.equal(got > 0, expected > 0)
    assert rel_err(got, expected) < 1e-5


@pytest.mark.gpu
@pytest.mark.parametrize("vocab", CUDA_VOCABS)
def test_matches_sgl_kernel_top_p_renorm(vocab):
    sgl_kernel = pytest.importorskip("sgl_kernel")
    params = [(0.7, ALL, 0.1, 0.0), (1.0, ALL, 0.5, 0.0), (1.5, ALL, 0.9, 0.0), (0.5, ALL, 0.95, 0.0)]
    kinds = ("spread", "flat")
    if vocab > 32000:  # flat rows put a prefix sum within float32 rounding of any top_p: colder spread rows
        params, kinds = [(0.6 * t, k, p, m) for t, k, p, m in params], ("spread",)
    args, probs, _, top_ps = sgl_kernel_case(vocab + 1, vocab, params, kinds=kinds)
    got = prepare_target_probs(*to("cuda", args))
    expected = sgl_kernel.top_p_renorm_prob(probs, top_ps)
    assert torch.equal(got > 0, expected > 0)
    assert rel_err(got, expected) < 1e-5


@pytest.mark.gpu
def test_cuda_graph_replay():
    """Captured once, the launch computes fresh logits and parameters copied into the captured buffers."""
    rng = random.Random(7)
    bs, n, vocab = 4, 3, 32000
    buffers = to("cuda", make_batch(rng, vocab, bs, n, [random_params(rng) for _ in range(bs)]))
    out = torch.empty_like(buffers[0])
    prepare_target_probs(*buffers, out=out)  # compile outside the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        prepare_target_probs(*buffers, out=out)
    for _ in range(3):
        fresh = make_batch(rng, vocab, bs, n, [random_params(rng) for _ in range(bs)])
        for dst, src in zip(buffers[:5], fresh[:5], strict=True):
            dst.copy_(src)
        graph.replay()
        expected = prepare_target_probs_ref(*fresh)
        assert torch.equal(out.cpu() > 0, expected > 0)
        assert rel_err(out.cpu(), expected) < 1e-5
