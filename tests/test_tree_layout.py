"""A draft narrower than the server's topk (an adaptive state of topk k in a server of topk K, e.g. a chain among
trees): :func:`sgl_eagle_triton.drafter.in_tree_layout` hands SGLang's build_tree, called with topk K, a topk-k
tree in K's layout.

Pass: build_tree (our kernel, and its reference twin) at topk K over the mapped draft gives exactly what the twin
gives at topk k over the draft itself (tree mask in every mode, positions, retrieve index / next token / next
sibling, tokens), on trees built without ties (tests: ``draft_tree``); every score keeps its node, the others are 0;
and the fused drafter in a K layout returns exactly the mapped k-drafter's tree, all K position rows advanced.
Mapping frontier rows with k's stride instead of K's (a broken variant, shown once by hand) fails every case with
k > 1.
"""

import pytest
import torch

from sgl_eagle_triton.devtools.reference import build_tree as reference
from sgl_eagle_triton.devtools.testing import draft_tree, random_batch, random_draft
from sgl_eagle_triton.drafter import FusedDrafter, in_tree_layout
from sgl_eagle_triton.kernels import build_tree as kernels

FULL_MASK, QLEN_ONLY, QLEN_ONLY_BITPACKING = 0, 1, 2
# (k, K, steps, n): chains and narrow trees inside wider servers; one level; n at its largest for k
CASES = [(1, 4, 1, 2), (1, 8, 3, 4), (1, 4, 5, 6), (2, 4, 3, 6), (2, 8, 4, 11), (3, 8, 4, 10), (4, 8, 2, 5),
         (3, 4, 3, 13)]


def _tree(bs, k, steps, n, gen):
    """A topk-k draft as the drafter returns it: parents, selected nodes (ascending), tokens, every score."""
    parent_list, selected = draft_tree(bs, k, steps, n, gen)
    tokens = torch.randint(0, 1000, selected.shape, generator=gen)
    scores = torch.rand(bs, k + (steps - 1) * k * k, generator=gen)
    return parent_list, selected, tokens, scores


@pytest.mark.parametrize("mode", [FULL_MASK, QLEN_ONLY, QLEN_ONLY_BITPACKING])
@pytest.mark.parametrize("bs", [1, 3])
@pytest.mark.parametrize(("k", "K", "steps", "n"), CASES)
def test_a_narrow_draft_in_the_servers_layout_builds_the_same_tree(k, K, steps, n, bs, mode, device):
    if mode == QLEN_ONLY_BITPACKING and n > 32:
        pytest.skip("bit-packed masks hold at most 32 tokens")
    gen = torch.Generator().manual_seed(1000 * k + 100 * K + 10 * steps + n + bs)
    parent_list, selected, tokens, scores = _tree(bs, k, steps, n, gen)
    seq_lens = torch.randint(3, 40, (bs,), generator=gen)
    bonus = torch.randint(0, 1000, (bs,), generator=gen)
    wide_parents, wide_selected, wide_tokens, wide_scores = in_tree_layout(parent_list, selected, tokens, scores, k,
                                                                           K, steps)
    assert wide_parents.shape == (bs, K * (steps - 1) + 1 if steps > 1 else 0)
    assert wide_scores.shape == (bs, K + (steps - 1) * K * K) and torch.equal(wide_tokens, tokens)
    assert torch.equal(wide_selected, wide_selected.sort(dim=1).values)  # SGLang's order: ascending
    top = wide_scores.sort(dim=1, descending=True).values  # every score once, zeros for the others
    assert torch.equal(top[:, :scores.shape[1]], scores.sort(dim=1, descending=True).values)
    assert wide_scores.count_nonzero() == scores.count_nonzero()

    def built(impl, parents, chosen, topk, dev="cpu"):
        out = impl.build_tree_kernel_efficient(*(t.to(dev) for t in (bonus, parents, chosen, tokens, seq_lens)),
                                               int(seq_lens.sum()), topk, steps, chosen.shape[1] + 1, mode)
        return [t.cpu() for t in out]

    want = built(reference, parent_list, selected, k)
    for impl, dev in ((reference, "cpu"), (kernels, device)):
        for got, expected in zip(built(impl, wide_parents, wide_selected, K, dev), want, strict=True):
            assert torch.equal(got, expected), impl.__name__
    assert in_tree_layout(parent_list, selected, tokens, None, k, K, steps)[3] is None  # no scores asked


def test_the_first_level_block_and_the_mapped_nodes():
    """One chain by hand: k 1 in K 4, three levels; its nodes are child 0 of row 0 at every level."""
    parent_list = torch.tensor([[-1, 0, 1]])  # level 0's block [-1, 0], level 1's frontier: node 1
    selected = torch.tensor([[0, 1, 2]])
    parents, chosen, _, scores = in_tree_layout(parent_list, selected, selected, torch.tensor([[0.9, 0.8, 0.7]]), 1,
                                                4, 3)
    assert parents.tolist() == [[-1, 0, 1, 2, 3, 4, 4, 4, 4]]  # level 1's frontier node 1 is node 4 in K's list
    assert chosen.tolist() == [[0, 4, 20]]  # K + (i - 1) K^2 for levels 1 and 2
    assert scores[0, [0, 4, 20]].tolist() == pytest.approx([0.9, 0.8, 0.7]) and scores.count_nonzero() == 3


@pytest.mark.parametrize(("eagle3", "k", "K", "steps", "n", "seq_lens"), [
    (True, 1, 4, 3, 4, [5, 17]),
    (False, 2, 4, 3, 6, [9]),
    (True, 1, 8, 1, 2, [4, 11, 6]),
])
def test_the_fused_drafter_in_a_wider_layout_is_the_narrow_drafter(device, eagle3, k, K, steps, n, seq_lens):
    w, gen = random_draft(eagle3, device)
    bs = len(seq_lens)
    batch = random_batch(w, bs, K, steps, seq_lens, gen, device)  # the server's topk-K inputs
    kv = (batch["k_cache"], batch["v_cache"], batch["req_to_token"], batch["k_scale"], batch["v_scale"])
    wide_positions = batch["positions"].clone()
    wide = FusedDrafter(w, k, steps, n, *kv, layout_topk=K).draft(
        batch["topk_p"], batch["topk_index"], batch["hidden"], wide_positions, batch["seq_lens"],
        batch["req_pool_indices"])
    narrow_positions = batch["positions"].view(bs, K)[:, :k].clone().view(-1)
    narrow = FusedDrafter(w, k, steps, n, *kv).draft(
        batch["topk_p"][:, :k].contiguous(), batch["topk_index"][:, :k].contiguous(), batch["hidden"], narrow_positions,
        batch["seq_lens"], batch["req_pool_indices"])
    for got, want in zip(wide, in_tree_layout(*narrow, k, K, steps), strict=True):
        assert torch.equal(got, want)
    assert torch.equal(wide_positions, batch["positions"] + (steps - 1))
    assert torch.equal(narrow_positions, batch["positions"].view(bs, K)[:, :k].reshape(-1) + (steps - 1))
