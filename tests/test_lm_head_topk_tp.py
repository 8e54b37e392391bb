"""The LM head's top-k under tensor parallelism, with simulated ranks: each rank's ``lm_head_topk_shard`` over its
vocabulary shard against its twin, and ``merge_shards`` of all ranks against ``lm_head_topk`` over the whole
vocabulary on one GPU: the same ids in the same order (ties across ranks: the lower id first), ``p`` within fp32
rounding. Shards as SGLang's vocabulary-parallel LM head cuts them: equal, padded at the end.

Inputs are exact (tests/test_lm_head_topk.make_case: every summation order gives the same logits), so ids
compare exactly.
"""

import pytest
import torch

from sgl_eagle_triton.devtools.reference import lm_head_topk as twin
from sgl_eagle_triton.kernels.lm_head_topk import lm_head_topk, lm_head_topk_shard, merge_shards
from tests.test_lm_head_topk import make_case, row_errors


def shards(weight: torch.Tensor, tp: int):
    """SGLang's vocabulary-parallel cut: the vocabulary padded to a multiple of ``tp`` rows (zeros), rank ``r``
    holding rows ``r * size ..`` of which ``valid`` are real. Returns ``(size, [(shard, offset, valid)])``."""
    V, H = weight.shape
    size = -(-V // tp)
    padded = torch.cat([weight, torch.zeros(size * tp - V, H, dtype=weight.dtype, device=weight.device)])
    return size, [(padded[r * size:(r + 1) * size].contiguous(), r * size, max(0, min(size, V - r * size)))
                  for r in range(tp)]


def tp_topk(x, weight, topk, tp, norm_weight=None, token_map=None, shard_fn=lm_head_topk_shard,
            merge_fn=merge_shards):
    size, parts = shards(weight, tp)
    summaries = [shard_fn(x, w, topk, norm_weight, 1e-6, off, valid) for w, off, valid in parts]
    keys = torch.stack([k for k, _ in summaries])
    sums = torch.stack([s for _, s in summaries])
    return merge_fn(keys, sums, size, topk, token_map), summaries, parts


CASES = [  # R, V, H, topk, norm, token_map, tp
    (1, 200, 32, 1, False, False, 2),
    (3, 333, 64, 8, True, True, 2),  # 167-row shards: not a multiple of the 64-id tile; the last one padded
    (5, 300, 32, 4, False, True, 4),  # 75-row shards
    (2, 130, 32, 8, True, False, 8),  # 17-row shards, fewer candidates per shard than topk
    (40, 333, 64, 8, True, True, 2),  # cuBLAS logits per shard (from 33 rows)
    (4, 100, 32, 16, False, True, 8),  # 13-row shards, the last of 9 real rows
]


@pytest.mark.parametrize("case", CASES, ids=lambda c: "R{}-V{}-H{}-k{}-norm{}-map{}-tp{}".format(*c))
def test_ranks_merged_equal_one_gpu(device, case):
    R, V, H, topk, norm, mapped, tp = case
    gen = torch.Generator().manual_seed(V + tp)
    x, weight, norm_weight, token_map = (t.to(device) if t is not None else None
                                         for t in make_case(gen, R, V, H, norm, mapped))
    (p, index), summaries, parts = tp_topk(x, weight, topk, tp, norm_weight, token_map)
    one_p, one_index = lm_head_topk(x, weight, topk, norm_weight, token_map=token_map)
    assert torch.equal(index, one_index)
    assert row_errors(p.cpu(), one_p.cpu()).max() < 1e-6
    cpu = [t.cpu() if t is not None else None for t in (x, norm_weight)]
    for (keys, total), (w, offset, valid) in zip(summaries, parts, strict=True):
        ref_keys, ref_total = twin.lm_head_topk_shard(cpu[0], w.cpu(), topk, cpu[1], 1e-6, offset, valid)
        assert torch.equal(keys.cpu(), ref_keys)
        assert torch.allclose(total.cpu(), ref_total, rtol=1e-5)
    ref = twin.merge_shards(torch.stack([k for k, _ in summaries]).cpu(),
                            torch.stack([s for _, s in summaries]).cpu(), parts[0][0].shape[0], topk,
                            token_map.cpu() if token_map is not None else None)
    assert torch.equal(ref[1], index.cpu()) and row_errors(ref[0], p.cpu()).max() < 1e-6


@pytest.mark.parametrize("tp", [2, 4])
def test_ties_across_ranks_go_to_the_lower_id(device, tp):
    """Every rank holds the same rows: equal logits on every rank, ranked by id as on one GPU."""
    gen = torch.Generator().manual_seed(tp)
    x, block, _, _ = make_case(gen, 3, 32, 32, False, False)
    weight = block.repeat(tp, 1).to(device)
    (p, index), _, _ = tp_topk(x.to(device), weight, 8, tp)
    one_p, one_index = lm_head_topk(x.to(device), weight, 8)
    assert torch.equal(index, one_index)
    assert (index[:, 0] < 32).all()  # the best logit's copies: rank 0's id first


def test_a_shard_of_padding_only(device):
    """tp 4 over 49 rows: 13-row shards, the last of 10 real rows; a fifth rank with no real row at all adds
    nothing (its keys are KEY_MIN, its sum 0) and does not disturb the merge."""
    gen = torch.Generator().manual_seed(7)
    x, weight, _, _ = make_case(gen, 2, 49, 32, False, False)
    x, weight = x.to(device), weight.to(device)
    size, parts = shards(weight, 4)
    summaries = [lm_head_topk_shard(x, w, 4, vocab_offset=off, valid=valid) for w, off, valid in parts]
    empty_keys, empty_sum = lm_head_topk_shard(x, parts[0][0], 4, vocab_offset=4 * size, valid=0)
    assert (empty_keys == twin.KEY_MIN).all() and (empty_sum == 0).all()
    keys = torch.stack([k for k, _ in summaries] + [empty_keys])
    sums = torch.stack([s for _, s in summaries] + [empty_sum])
    p, index = merge_shards(keys, sums, size, 4)
    one_p, one_index = lm_head_topk(x, weight, 4)
    assert torch.equal(index, one_index) and row_errors(p.cpu(), one_p.cpu()).max() < 1e-6


@pytest.mark.parametrize("V, tp", [(300, 4), (333, 8), (320, 2)])
def test_sglangs_own_vocabulary_split(device, V, tp):
    """Shards exactly as SGLang's vocabulary-parallel LM head holds them (its ``_get_indices``: the vocabulary padded
    to a multiple of 64, split evenly; 333 over 8 ranks leaves rank 7 no real row), read through
    ``drafter.vocab_shard``, merged: one GPU's result."""
    from types import SimpleNamespace

    from sglang.srt.layers.vocab_parallel_embedding import VocabParallelEmbedding, pad_vocab_size

    from sgl_eagle_triton.drafter import vocab_shard

    padded = pad_vocab_size(V)
    rows = padded // tp
    gen = torch.Generator().manual_seed(V)
    x, weight, _, token_map = (t.to(device) if t is not None else None for t in make_case(gen, 3, V, 32, False, True))
    full = torch.cat([weight, torch.zeros(padded - V, 32, dtype=weight.dtype, device=device)])
    summaries = []
    for rank in range(tp):
        layer = SimpleNamespace(shard_indices=VocabParallelEmbedding._get_indices(padded, padded, V, V, rank, tp))
        offset, valid = vocab_shard(layer)
        assert offset == rank * rows and 0 <= valid <= rows
        summaries.append(lm_head_topk_shard(x, full[offset:offset + rows].contiguous(), 8, vocab_offset=offset,
                                            valid=valid))
    assert sum(vocab_shard(SimpleNamespace(shard_indices=VocabParallelEmbedding._get_indices(
        padded, padded, V, V, r, tp)))[1] for r in range(tp)) == V
    p, index = merge_shards(torch.stack([k for k, _ in summaries]), torch.stack([s for _, s in summaries]), rows, 8,
                            token_map)
    one_p, one_index = lm_head_topk(x, weight, 8, token_map=token_map)
    assert torch.equal(index, one_index) and row_errors(p.cpu(), one_p.cpu()).max() < 1e-6


def test_a_merge_that_drops_a_ranks_sum_is_caught(device):
    """The parity check above fails for a merge that forgets the other ranks' sums (a plausible bug)."""
    def broken_merge(keys, sums, size, topk, token_map=None):
        sums = sums.clone()
        sums[1:] = 0
        return merge_shards(keys, sums, size, topk, token_map)

    gen = torch.Generator().manual_seed(3)
    x, weight, _, _ = make_case(gen, 3, 200, 32, False, False)
    (p, index), _, _ = tp_topk(x.to(device), weight.to(device), 4, 2, merge_fn=broken_merge)
    one_p, one_index = lm_head_topk(x.to(device), weight.to(device), 4)
    assert torch.equal(index, one_index) and row_errors(p.cpu(), one_p.cpu()).max() > 1e-3
