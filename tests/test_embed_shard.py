"""Triton ``embed_shard`` (a tensor-parallel rank's masked embedding lookup) against its PyTorch twin: a copy of
rows, so equal bit for bit; the ranks' outputs summed give the whole embedding's rows."""

import pytest
import torch

from sgl_eagle_triton.devtools.reference.embed_shard import embed_shard as embed_shard_ref
from sgl_eagle_triton.kernels.embed_shard import embed_shard


def _table(rows, H, dtype, seed):
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(rows, H, generator=gen).to(dtype)


@pytest.mark.parametrize("R, H, vocab, ranks", [(1, 64, 300, 2), (7, 96, 300, 4), (33, 1000, 1001, 2),
                                               (5, 2048, 130, 4)])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
def test_every_rank_matches_the_twin_and_the_ranks_sum_to_the_embedding(device, R, H, vocab, ranks, dtype):
    """Ids spread over every rank's shard (row counts not multiples of 64, e.g. 80 and 48; the last rank's padding
    rows, ``valid`` < its row count, and a rank of padding only): each rank's rows equal the twin's exactly; summed
    over the ranks, the whole table's rows. H not a multiple of the block (96, 1000); batch 1."""
    per_rank = -(-vocab // 64) * 64 // ranks  # SGLang pads the vocabulary to a multiple of 64, then splits it
    full = _table(vocab, H, dtype, seed=R * H)
    gen = torch.Generator().manual_seed(vocab + R)
    ids = torch.randint(0, vocab, (R,), generator=gen)
    ids[0] = vocab - 1  # the last real row: the last rank's, before its padding
    total = torch.zeros(R, H, dtype=torch.float32)
    for rank in range(ranks):
        offset = rank * per_rank
        valid = max(0, min(per_rank, vocab - offset))
        table = torch.zeros(per_rank, H, dtype=dtype)
        table[:valid] = full[offset:offset + valid]
        table[valid:] = 7.0  # padding rows: never read
        out = embed_shard(ids.to(device), table.to(device), offset, valid,
                          torch.full((R, H), float("nan"), dtype=dtype, device=device))
        assert torch.equal(out.cpu(), embed_shard_ref(ids, table, offset, valid)), rank
        total += out.cpu().float()
    assert torch.equal(total, full[ids].float())


def test_ids_outside_the_shard_give_zero_rows(device):
    table = _table(64, 32, torch.bfloat16, seed=1).to(device)
    ids = torch.tensor([-1, 0, 63, 64, 200, 40], dtype=torch.int64, device=device)  # offset 0, valid 41
    out = embed_shard(ids, table, 0, 41, torch.empty(6, 32, dtype=torch.bfloat16, device=device))
    zero = torch.zeros(32, dtype=torch.bfloat16, device=device)
    assert [bool(torch.equal(row, zero)) for row in out] == [True, False, True, True, True, False]
    assert torch.equal(out[1], table[0]) and torch.equal(out[5], table[40])
