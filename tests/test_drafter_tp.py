"""The fused drafter under tensor parallelism on simulated ranks (processes in a gloo group standing in for SGLang's TP
group):
each rank holds its shards of a random one-layer draft and of the draft KV pool, as SGLang shards them (QKV and
gate/up column-parallel by heads / intermediate columns, o-proj and down row-parallel, embedding and LM head
vocabulary-parallel, norms and EAGLE-1's fc whole, KV heads split), and drafts with
``FusedDrafter(..., tp=TensorParallel(...))``.

Pass: every rank returns the same tree; it is the single-GPU drafter's tree (the same parents, selected nodes and
tokens: the inputs have no near-tie at the rounding difference of a row-parallel sum, checked per case), with
candidate scores within ``SCORE_RTOL``; and no rank sends more than ``topk`` candidates per row across the group
for the LM head (the all-gathers' widest tensor), never logits.
"""

import pytest
import torch

from sgl_eagle_triton.devtools.testing import draft_shard, random_batch, random_draft
from sgl_eagle_triton.drafter import FusedDrafter, TensorParallel, shard_layout_problems

# Row-parallel sums round each rank's product before adding (SGLang's all-reduce of bf16 / fp16 outputs), one
# rounding more than one GPU's. Measured on the CPU (interpreter), fp16, this file's cases: largest relative
# difference of a candidate score (a product of probabilities) from the single-GPU drafter's 0.0137, 0.0105, 0.0096,
# 0.0003; bound about 2x the largest, as tests/test_drafter.py bounds fp16 against the twin (0.03). A group whose
# all-reduce returns each rank's own part (embedding rows and row-parallel sums) fails all four cases (shown once).
SCORE_RTOL = 0.03


def gloo_member(rank: int, size: int, embed_shard, lm_head_shard, gathered_widths: list) -> TensorParallel:
    """This process's rank of a gloo group standing in for SGLang's TP group: all-reduce as a gather of every rank's
    part summed in rank order (deterministic; one rounding to the part's dtype, as an all-reduce of two parts),
    returned, on every other call, as a new tensor with the input overwritten by NaN (SGLang's custom all-reduce
    returns a new tensor; a caller that read its input after the all-reduce would get a rank's part, not the sum),
    and in place otherwise (SGLang's NCCL path: a caller aliasing the result and its output must still be right)."""
    import torch.distributed as dist

    def gather(t):
        parts = [torch.empty_like(t) for _ in range(size)]
        dist.all_gather(parts, t.contiguous())
        return parts

    calls = [0]

    def all_reduce(t):
        parts = gather(t.float().cpu())
        total = parts[0]
        for part in parts[1:]:
            total = total + part
        calls[0] += 1
        if calls[0] % 2:  # in place, as SGLang's NCCL path: the input holds the sum and is returned
            return t.copy_(total.to(t.dtype))
        t.fill_(float("nan"))
        return total.to(t.dtype).to(t.device)

    def all_gather(t):
        gathered_widths.append(t.shape[-1] if t.dim() > 1 else 1)
        return torch.stack(gather(t.cpu())).to(t.device)

    return TensorParallel(size, rank, all_reduce, all_gather, embed_shard, lm_head_shard)


def _case(device, case):
    eagle3, bs, topk, steps, n, seq_lens, seed = case[:7]
    w, gen = random_draft(eagle3, device, seed=seed, dtype=torch.float16, H=64, Hq=4, Hkv=2, D=16, inter=96,
                          vocab=300, draft_vocab=120)
    return w, random_batch(w, bs, topk, steps, seq_lens, gen, device)


def _rank_main(rank, size, init_file, out_file, device, case):
    """One simulated rank (a process): its shards of the case's draft, a draft, its outputs saved."""
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=size)
    try:
        w, batch = _case(device, case)
        topk, steps, n = case[2:5]
        local, embed_shard, head_shard, heads = draft_shard(w, rank, size)
        widths = []
        drafter = FusedDrafter(local, topk, steps, n, batch["k_cache"][:, heads].contiguous(),
                               batch["v_cache"][:, heads].contiguous(), batch["req_to_token"],
                               tp=gloo_member(rank, size, embed_shard, head_shard, widths))
        positions = batch["positions"].clone()
        out = drafter.draft(batch["topk_p"], batch["topk_index"], batch["hidden"], positions, batch["seq_lens"],
                            batch["req_pool_indices"])
        torch.save(dict(out=[t.cpu() for t in out], positions=positions.cpu(), widths=widths), f"{out_file}.{rank}")
    finally:
        dist.destroy_process_group()


def tp_draft(tmp_path, device, case, size=2):
    """Every simulated rank's ``{"out", "positions", "widths"}`` (ranks are processes: the Triton interpreter is not
    thread-safe)."""
    import torch.multiprocessing as mp

    out_file = tmp_path / "rank"
    mp.spawn(_rank_main, args=(size, str(tmp_path / "init"), str(out_file), device, case), nprocs=size)
    return [torch.load(f"{out_file}.{rank}") for rank in range(size)]


CASES = [  # eagle3, bs, topk, steps, n, prefix lengths, seed, ranks
    (True, 1, 4, 3, 8, [9], 0, 2),
    (True, 3, 2, 4, 7, [9, 3, 30], 1, 2),
    (False, 2, 4, 3, 8, [1, 17], 2, 2),
    (True, 1, 1, 3, 4, [7], 3, 2),
    (True, 2, 4, 3, 8, [5, 12], 4, 4),  # 4 ranks, 2 KV heads: each held by two ranks (the trained pair at --tp 4)
]


@pytest.mark.parametrize("case", CASES,
                         ids=lambda c: f"{'eagle3' if c[0] else 'eagle1'}-bs{c[1]}-k{c[2]}-s{c[3]}-tp{c[7]}")
def test_tensor_parallel_draft_is_the_single_gpu_draft(tmp_path, device, case):
    w, batch = _case(device, case)
    topk, steps, n = case[2:5]
    positions = batch["positions"].clone()
    single = FusedDrafter(w, topk, steps, n, batch["k_cache"], batch["v_cache"], batch["req_to_token"]).draft(
        batch["topk_p"], batch["topk_index"], batch["hidden"], positions, batch["seq_lens"], batch["req_pool_indices"])
    ranks = tp_draft(tmp_path, device, case, size=case[7])
    names = ("parent_list", "top_scores_index", "draft_tokens")
    for rank in ranks:  # every rank the same tree, the single-GPU one
        for name, got, want in zip(names, rank["out"][:3], single[:3], strict=True):
            assert torch.equal(got, want.cpu()), name
        assert torch.equal(rank["positions"], positions.cpu())
        assert rank["widths"] and max(rank["widths"]) <= topk  # k candidates per row cross the group, never logits
    scores, want = ranks[0]["out"][3], single[3].cpu()
    rel = ((scores - want).abs() / want.abs().clamp_min(1e-30)).max()
    assert rel < SCORE_RTOL, rel


def test_shard_layouts_that_break_the_drafters_assumptions_are_named():
    """The start-up check of every rank's layout (worker: an object all-gather over the TP group)."""
    good = [((r * 75, 75), (r * 30, 30 if r < 3 else 12), 75, 30, 1, 1) for r in range(4)]
    assert shard_layout_problems(good) == []
    shifted = [*good[:2], ((160, 75), *good[2][1:]), good[3]]
    assert shard_layout_problems(shifted) == ["rank 2's embedding rows start at id 160, not 2 x 75"]
    uneven = [*good[:3], (good[3][0], (90, 30), 75, 31, 1, 1)]
    assert shard_layout_problems(uneven) == [
        "rank 3's LM head rows start at id 90, not 3 x 31",
        "rank 3 holds 75 / 31 vocabulary rows and 1 / 1 heads / KV heads, rank 0 75 / 30 and 1 / 1"]
