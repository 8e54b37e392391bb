"""Statistical losslessness of sampled verification, through the whole draft -> verify path.

A tiny vocabulary (32 tokens) and a known bigram target model: after token ``t`` the target's
logits are ``TARGET[t]``; a different, correlated bigram draft (``DRAFT``) proposes trees exactly
as SGLang's EAGLE drafter does (top-k per frontier node, global top-k by cumulative score, final
top-(n-1) prune). Each draw builds the tree (build_tree), prepares the target probabilities with
the request's sampling parameters (target_probs) and runs tree speculative sampling with fresh
coins. The first emitted token, and the first two as a pair (a second cycle supplies the second
token when the first cycle accepted nothing), must follow the target distribution: chi-squared
p > 1e-3, and no token outside the top-k / top-p / min-p support ever emitted. A deliberately
broken rule (the correction token drawn from the plain target row instead of the residual) must
fail the same test.

On a GPU the Triton kernels run 10^5 draws per case; on the CPU the PyTorch twins (bit-identical to
the kernels, tests/test_*.py) run 2*10^4 draws on a subset of cases.
"""

from __future__ import annotations

import pytest
import torch
from scipy.stats import chi2

from sgl_eagle_triton.devtools.reference import build_tree as build_tree_ref
from sgl_eagle_triton.devtools.reference import target_probs as target_probs_ref
from sgl_eagle_triton.devtools.reference import tree_sampling as tree_sampling_ref
from sgl_eagle_triton.kernels import build_tree as build_tree_kernels
from sgl_eagle_triton.kernels import target_probs as target_probs_kernels
from sgl_eagle_triton.kernels import tree_sampling as tree_sampling_kernels

ON_GPU = torch.cuda.is_available()
DEVICE = "cuda" if ON_GPU else "cpu"
DRAWS = 100_000 if ON_GPU else 20_000
VOCAB, ROOT, PREFIX_LEN, P_MIN = 32, 3, 10, 1e-3
ALL = 1 << 30
_gen = torch.Generator().manual_seed(0)
TARGET = torch.randn(VOCAB, VOCAB, generator=_gen) * 2.0
DRAFT = TARGET + torch.randn(VOCAB, VOCAB, generator=_gen)  # correlated: trees often hold the target's picks

SETTINGS = {  # temperature, top_k, top_p, min_p
    "plain": (1.0, ALL, 1.0, 0.0),
    "top_p": (0.7, ALL, 0.9, 0.0),
    "top_k": (1.3, 5, 1.0, 0.0),
    "min_p": (1.0, ALL, 1.0, 0.1),
    "all": (0.8, 8, 0.8, 0.05),
}
SHAPES = [(1, 1, 2), (3, 1, 4), (3, 2, 6), (5, 4, 16), (0, 1, 1)]  # steps, topk, draft tokens; 0: no draft
CPU_CASES = {("plain", (3, 2, 6)), ("all", (5, 4, 16)), ("top_k", (1, 1, 2)), ("min_p", (0, 1, 1))}


def draft_tree(root: int, topk: int, steps: int, n: int):
    """``(parent_list, top_scores_index, draft_tokens)`` of SGLang's drafter on the bigram draft."""
    probs = lambda token: torch.softmax(DRAFT[token].double(), -1).topk(topk)  # noqa: E731
    scores, tokens = probs(root)
    score_list, token_list, parents = [scores], [tokens], [torch.arange(-1, topk)]
    frontier = tokens
    for i in range(1, steps):
        child_p, child_tokens = (torch.stack(x) for x in zip(*(probs(t) for t in frontier.tolist()), strict=True))
        expanded = (scores[:, None] * child_p).flatten()
        scores, chosen = expanded.topk(topk)
        score_list.append(expanded)
        token_list.append(child_tokens.flatten())
        parents.append(chosen + topk * topk * (i - 1) + topk)
        frontier = child_tokens.flatten()[chosen]
    selected = torch.cat(score_list).topk(n - 1).indices.sort().values
    parent_list = torch.cat(parents[:-1]) if steps > 1 else torch.empty(0, dtype=torch.long)
    return parent_list, selected, torch.cat(token_list)[selected]


def expected_probs(context: torch.Tensor, setting) -> torch.Tensor:
    """Target distribution [len(context), VOCAB] after each context token, by the reference twin."""
    temperature, top_k, top_p, min_p = setting
    m = len(context)
    return target_probs_ref.prepare_target_probs(
        TARGET[context].float(), torch.full((m,), temperature), torch.full((m,), top_k, dtype=torch.int32),
        torch.full((m,), top_p), torch.full((m,), min_p), 1,
    ).double()


def one_node_trees(roots: torch.Tensor):
    """Speculation off (adaptive steps 0): SGLang's one-node verify tree per root, as its
    ``_build_trivial_verify_input`` makes it: ``(retrieve_index, next_token, next_sibling, candidates)``."""
    b = len(roots)
    none = torch.full((b, 1), -1, device=DEVICE)
    return torch.arange(b, device=DEVICE).view(b, 1), none, none.clone(), roots.view(b, 1).to(DEVICE)


def spec_cycle(roots: torch.Tensor, setting, shape, impls, gen: torch.Generator):
    """One draft -> verify cycle per root token (shape ``(0, 1, 1)``: no draft, the one-node tree); returns
    ``(predicts [B, n], accept_index, m [B])``."""
    build_tree, target_probs, tree_sampling = impls
    steps, topk, n = shape
    b = len(roots)
    to = lambda *ts: [t.to(DEVICE) for t in ts]  # noqa: E731
    if steps == 0:
        index, next_token, next_sibling, candidates = one_node_trees(roots)
    else:
        trees = [draft_tree(r, topk, steps, n) for r in range(VOCAB)]
        parent_list, selected, draft_tokens = (torch.stack([t[i] for t in trees])[roots] for i in range(3))
        _, _, index, next_token, next_sibling, candidates = build_tree.build_tree_kernel_efficient(
            *to(roots, parent_list, selected, draft_tokens, torch.full((b,), PREFIX_LEN)),
            b * PREFIX_LEN, topk, steps, n, 1,
        )
    candidates = candidates.view(b, n)
    temperature, top_k, top_p, min_p = setting
    probs = target_probs.prepare_target_probs(
        TARGET.to(DEVICE)[candidates.flatten()].contiguous(),
        *to(torch.full((b,), temperature), torch.full((b,), top_k, dtype=torch.int32),
            torch.full((b,), top_p), torch.full((b,), min_p)),
        n,
    )
    predicts = torch.zeros(b * n, dtype=torch.int32, device=DEVICE)
    accept_index = torch.full((b, steps + 1), -1, dtype=torch.int32, device=DEVICE)
    accepted = torch.empty(b, dtype=torch.int32, device=DEVICE)
    coins = torch.rand(b, n, generator=gen).to(DEVICE)
    final_coins = torch.rand(b, generator=gen).to(DEVICE)
    tree_sampling.tree_speculative_sampling(
        predicts, accept_index, accepted, candidates, index, next_token, next_sibling, coins, final_coins,
        probs.view(b, n, VOCAB),
    )
    return predicts.view(b, n).cpu().long(), accept_index.cpu().long(), accepted.cpu().long()


def emitted_pairs(setting, shape, impls, broken: bool = False, next_shape=None):
    """The first two emitted tokens of ``DRAWS`` independent generations after ``ROOT`` (a second cycle, where
    one is needed, drafts ``next_shape``: adaptive speculation switching shapes between cycles)."""
    gen = torch.Generator().manual_seed(1)
    roots = torch.full((DRAWS,), ROOT)
    predicts, accept_index, accepted = spec_cycle(roots, setting, shape, impls, gen)
    first = predicts[:, 0]
    if broken:  # negative control: a rejection's correction token drawn from the target row itself
        rejected = accepted == 0
        row = expected_probs(torch.tensor([ROOT]), setting)[0]
        first = torch.where(rejected, torch.multinomial(row, DRAWS, replacement=True, generator=gen), first)
    n = shape[2]
    if accept_index.shape[1] > 1:
        second_pos = (accept_index[:, 1] - torch.arange(DRAWS) * n).clamp(min=0)
        second = predicts.gather(1, second_pos[:, None])[:, 0]
    else:  # the one-node tree accepts no draft: the second token always comes from the next cycle
        second = torch.zeros_like(first)
    again = accepted == 0
    if again.any():
        second[again] = spec_cycle(first[again], setting, next_shape or shape, impls, gen)[0][:, 0]
    return first, second


def chi2_pvalue(observed: torch.Tensor, expected_p: torch.Tensor) -> float:
    """Pearson chi-squared p-value; cells expected below 5 counts are pooled into one."""
    assert observed[expected_p == 0].sum() == 0, "emitted a token outside the sampling support"
    expected = expected_p * observed.sum()
    small = expected < 5
    obs = torch.cat([observed[~small].double(), observed[small].sum()[None].double()])
    exp = torch.cat([expected[~small], expected[small].sum()[None]])
    keep = exp > 0
    stat = ((obs[keep] - exp[keep]) ** 2 / exp[keep]).sum().item()
    return float(chi2.sf(stat, int(keep.sum()) - 1))


def pvalues(setting, shape, impls, broken=False, next_shape=None):
    first, second = emitted_pairs(setting, shape, impls, broken, next_shape)
    p_first = expected_probs(torch.tensor([ROOT]), setting)[0]
    p_pair = p_first[:, None] * expected_probs(torch.arange(VOCAB), setting)
    return (chi2_pvalue(torch.bincount(first, minlength=VOCAB), p_first),
            chi2_pvalue(torch.bincount(first * VOCAB + second, minlength=VOCAB * VOCAB), p_pair.flatten()))


IMPLS = ((build_tree_kernels, target_probs_kernels, tree_sampling_kernels) if ON_GPU
         else (build_tree_ref, target_probs_ref, tree_sampling_ref))


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "steps{}-topk{}-n{}".format(*s))
@pytest.mark.parametrize("name", SETTINGS)
def test_emitted_tokens_follow_the_target(name, shape):
    if not ON_GPU and (name, shape) not in CPU_CASES:
        pytest.skip("CPU runs a subset (the full grid runs on the GPU)")
    p_first, p_pair = pvalues(SETTINGS[name], shape, IMPLS)
    assert p_first > P_MIN and p_pair > P_MIN, (p_first, p_pair)


SWITCHES = [((3, 1, 4), (5, 4, 16)), ((5, 4, 16), (0, 1, 1)), ((0, 1, 1), (3, 2, 6))]  # first cycle, second


@pytest.mark.parametrize("switch", SWITCHES, ids=lambda s: "{}-to-{}".format(*("{},{},{}".format(*x) for x in s)))
@pytest.mark.parametrize("name", ["plain", "all"])
def test_lossless_when_the_shape_changes_between_cycles(name, switch):
    """Adaptive speculation changes the tree between cycles of one request, through steps 0 (the one-node tree):
    the pair of the first two tokens still follows the target."""
    if not ON_GPU and (name, switch) != ("all", SWITCHES[1]):
        pytest.skip("CPU runs one case (all of them run on the GPU)")
    p_first, p_pair = pvalues(SETTINGS[name], switch[0], IMPLS, next_shape=switch[1])
    assert p_first > P_MIN and p_pair > P_MIN, (p_first, p_pair)


def test_broken_rule_is_detected():
    p_first, _ = pvalues(SETTINGS["plain"], (3, 2, 6), IMPLS, broken=True)
    assert p_first < P_MIN, p_first
