"""The fused drafter (``FusedDrafter.draft``: the whole draft of a decode cycle) against its PyTorch twin
on random one-layer EAGLE-3 and EAGLE-1 drafts, with a scattered paged KV prefix of ragged lengths."""

import pytest
import torch

from sgl_eagle_triton.drafter import FusedDrafter
from sgl_eagle_triton.reference import drafter as ref
from sgl_eagle_triton.testing import random_batch, random_draft

NEAR_TIE = 0.06  # relative probability gap of two logits one bf16 ulp apart (|logit| <= ~8)


def run_case(device, eagle3, bs, topk, steps, n, seq_lens, seed=0, max_differing=0.5, **dims):
    w, gen = random_draft(eagle3, device, seed=seed, **dims)
    batch = random_batch(w, bs, topk, steps, seq_lens, gen, device)
    drafter = FusedDrafter(w, topk, steps, n, batch["k_cache"], batch["v_cache"], batch["req_to_token"])
    inputs = (batch["topk_p"], batch["topk_index"], batch["hidden"])
    ours_positions = batch["positions"].clone()
    ours = drafter.draft(*inputs, ours_positions, batch["seq_lens"], batch["req_pool_indices"])
    kv = tuple(batch[key] for key in ("k_cache", "v_cache", "req_to_token", "req_pool_indices", "seq_lens"))
    ref_positions = batch["positions"].clone()
    expected = ref.draft(w, topk, steps, n, *inputs, ref_positions, kv)
    same = torch.ones(bs, dtype=torch.bool, device=device)
    for got, want in zip(ours[:3], expected[:3], strict=True):
        same &= (got == want).all(dim=1) if got.numel() else same
    # The attention kernel rounds its softmax weights to bf16 (as flash attention does) where the twin keeps
    # fp32, so a bf16 logit may round to its neighbour: two tokens whose logits are one bf16 ulp apart
    # (probabilities a few % apart) may swap, and any probability may move by such a rounding flip (a few %
    # per step of a cumulative score). A tree may differ only after a near-tie; scores, compared as sets
    # since a swap permutes them, agree to within those flips.
    # (With topk 1 the runner-up token is no candidate, so its near-tie leaves no trace in the scores.)
    for b in (~same).nonzero().flatten().tolist() if topk > 1 else []:
        ref_sorted = expected[3][b].double().sort(descending=True).values
        assert ((ref_sorted[:-1] - ref_sorted[1:]) / ref_sorted[:-1]).min() < NEAR_TIE, f"request {b}: no near-tie"
    assert (~same).sum() <= max(1, max_differing * bs)
    # Every request agrees on its first two steps' candidates (no frontier choice precedes them), the
    # requests with equal trees on all of them.
    first = topk + topk * topk if steps > 1 else topk
    for rows, width in ((same, ours[3].shape[1]), (~same, first)):
        if rows.any():
            ours_sorted = ours[3][rows, :width].sort(dim=-1).values
            ref_sorted = expected[3][rows, :width].sort(dim=-1).values
            rel = (ours_sorted - ref_sorted).abs() / ref_sorted.abs().clamp_min(1e-30)
            assert rel.max() < 0.15 and rel.median() < 1e-2
    assert torch.equal(ours_positions, ref_positions)


@pytest.mark.parametrize("eagle3", [True, False], ids=["eagle3", "eagle1"])
@pytest.mark.parametrize(
    "bs,topk,steps,n,seq_lens",
    [
        (1, 1, 1, 2, [5]),
        (1, 1, 3, 4, [7]),
        (2, 4, 3, 8, [1, 17]),
        (3, 2, 4, 7, [9, 3, 30]),
        (1, 8, 2, 16, [12]),
    ],
)
def test_fused_draft_matches_twin(device, eagle3, bs, topk, steps, n, seq_lens):
    run_case(device, eagle3, bs, topk, steps, n, seq_lens, seed=bs * 10 + topk + steps)


@pytest.mark.gpu
@pytest.mark.parametrize("eagle3", [True, False], ids=["eagle3", "eagle1"])
@pytest.mark.parametrize("bs,topk,steps,n", [(1, 8, 5, 32), (4, 4, 3, 16), (8, 1, 5, 6)])
def test_cuda_llama_like_dims(eagle3, bs, topk, steps, n):
    lens = [100 + 997 * i % 3000 for i in range(bs)]
    run_case("cuda", eagle3, bs, topk, steps, n, lens, max_differing=0.25, H=512, Hq=8, Hkv=2, D=64, inter=1024,
             vocab=4000, draft_vocab=2000)


def test_idle_batch(device):
    w, _ = random_draft(True, device)
    cache = torch.zeros(4, w.num_kv_heads, w.head_dim, dtype=torch.bfloat16, device=device)
    drafter = FusedDrafter(w, 4, 3, 8, cache, cache, torch.zeros(1, 8, dtype=torch.int32, device=device))
    empty = torch.empty(0, 4, device=device)
    no_rows = torch.empty(0, dtype=torch.long, device=device)
    hidden = torch.empty(0, w.hidden_size, dtype=torch.bfloat16, device=device)
    out = drafter.draft(empty, empty.long(), hidden, no_rows, no_rows, no_rows)
    assert [tuple(t.shape) for t in out] == [(0, 9), (0, 7), (0, 7), (0, 36)]
