"""Triton draft selection (``draft_select`` per step, ``draft_organize`` at the end) against SGLang's
semantics restated in :mod:`sgl_eagle_triton.devtools.reference.draft_select`, on tie-free random draft outputs."""

import pytest
import torch

from sgl_eagle_triton.devtools.reference import draft_select as ref
from sgl_eagle_triton.kernels.draft_organize import draft_organize
from sgl_eagle_triton.kernels.draft_select import draft_select


def run_tree(device, bs, k, steps, n, vocab=1000, draft_vocab=300, seed=0):
    """Selects a whole draft tree from random step outputs with both implementations; compares everything."""
    gen = torch.Generator().manual_seed(seed)
    token_map = torch.randperm(vocab, generator=gen)[:draft_vocab].to(device)

    def step_outputs(rows):
        # Distinct probabilities per row (descending, as a top-k returns them); products stay tie-free.
        p = torch.rand(rows, k, generator=gen, dtype=torch.float64).sort(dim=-1, descending=True).values
        return (p * 0.9 + 0.05).float().to(device), torch.randint(vocab, (rows, k), generator=gen).to(device)

    T = k + (steps - 1) * k * k
    scores = torch.zeros(bs, k, device=device)
    input_ids = torch.zeros(bs * k, dtype=torch.long, device=device)
    hidden_rows = torch.zeros_like(input_ids)
    all_scores = torch.zeros(bs, T, device=device)
    all_tokens = torch.zeros(bs, T, dtype=torch.long, device=device)
    parents = torch.full((bs, k * (steps - 1) + 1), -7, dtype=torch.long, device=device)
    start = torch.randint(1, 5000, (bs,), generator=gen).repeat_interleave(k).to(device)
    positions, step_positions = start.clone(), torch.zeros_like(start)

    p0, index0 = step_outputs(bs)
    index0 = index0 % draft_vocab
    ref_scores, score_list, token_list, parents_list = None, [], [], []
    for step in range(steps):
        p, index = (p0, index0) if step == 0 else step_outputs(bs * k)
        draft_select(step, steps, p, index, scores, input_ids, hidden_rows, all_scores, all_tokens, parents,
                     positions, step_positions, token_map=token_map)
        ref_index = token_map[index0] if step == 0 else index
        selected = ref.select_step(step, p, ref_index, ref_scores, k)
        ids, rows, ref_scores, cand_scores, cand_tokens, cand_parents = selected
        score_list.append(cand_scores)
        token_list.append(cand_tokens)
        parents_list.append(cand_parents)
        if step < steps - 1:
            assert torch.equal(input_ids, ids) and torch.equal(hidden_rows, rows)
            assert torch.equal(scores, ref_scores)
            assert torch.equal(step_positions, start + step)
    assert torch.equal(positions, start + steps - 1)

    top_scores_index = torch.empty(bs, n - 1, dtype=torch.long, device=device)
    draft_tokens = torch.empty_like(top_scores_index)
    draft_organize(all_scores, all_tokens, top_scores_index, draft_tokens)
    parent_list, ref_top, ref_tokens = ref.organize(score_list, token_list, parents_list, n)
    assert torch.equal(all_scores, torch.cat(score_list, dim=1))
    assert torch.equal(parents[:, : parent_list.shape[1]], parent_list)
    assert torch.equal(top_scores_index, ref_top)
    assert torch.equal(draft_tokens, ref_tokens)


@pytest.mark.parametrize("bs", [1, 3])
@pytest.mark.parametrize(
    "k,steps,n",
    [(1, 1, 2), (1, 5, 6), (4, 1, 4), (2, 2, 5), (4, 3, 16), (8, 5, 32), (3, 4, 20), (8, 8, 64)],
)
def test_draft_tree_selection(device, bs, k, steps, n):
    run_tree(device, bs, k, steps, n, seed=bs * 100 + k * 10 + steps)


def test_keep_all_candidates(device):
    """``n - 1 == T``: every candidate is kept, in order."""
    run_tree(device, 2, 2, 3, 2 + 2 * 4 + 1)


@pytest.mark.gpu
@pytest.mark.parametrize("bs", [1, 32, 160])
@pytest.mark.parametrize("k,steps,n", [(8, 5, 32), (8, 8, 64), (10, 6, 128), (1, 3, 4)])
def test_cuda_batches(bs, k, steps, n):
    run_tree("cuda", bs, k, steps, n, vocab=128256, draft_vocab=32000, seed=bs + k)


def test_nan_scores_stay_in_bounds(device):
    """A request whose draft produced NaN (a broken hidden state) ranks its NaN candidates last and keeps
    exactly n - 1 nodes; neighbouring requests' rows are not touched."""
    bs, k, steps, n = 2, 2, 2, 4
    T = k + k * k
    p = torch.tensor([[0.6, 0.4], [0.7, 0.3]], device=device)
    index = torch.tensor([[1, 2], [3, 4]], device=device)
    scores = torch.zeros(bs, k, device=device)
    ids, rows, steps_pos = (torch.zeros(bs * k, dtype=torch.long, device=device) for _ in range(3))
    all_scores = torch.zeros(bs, T, device=device)
    all_tokens = torch.zeros(bs, T, dtype=torch.long, device=device)
    parents = torch.zeros(bs, k + 1, dtype=torch.long, device=device)
    positions = torch.zeros(bs * k, dtype=torch.long, device=device)
    tree = (scores, ids, rows, all_scores, all_tokens, parents, positions, steps_pos)
    draft_select(0, steps, p, index, *tree)
    child_p = torch.full((bs * k, k), float("nan"), device=device)
    child_p[k:] = torch.tensor([[0.5, 0.2], [0.9, 0.1]], device=device)
    draft_select(1, steps, child_p, torch.arange(bs * k * k, device=device).view(bs * k, k), *tree)
    top = torch.full((bs, n - 1), -5, dtype=torch.long, device=device)
    tokens = torch.full_like(top, -5)
    draft_organize(all_scores, all_tokens, top, tokens)
    assert top[0].tolist() == [0, 1, 2]  # the finite step-0 candidates first, then the lowest NaN index
    assert torch.equal(top[1], ref.organize([all_scores[1:]], [all_tokens[1:]], [parents[1:]], n)[1][0])
