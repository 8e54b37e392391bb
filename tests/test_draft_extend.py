"""The lean draft extend (``FusedDrafter.draft_extend``: the K / V of every row of a chain's verify, then the layer and
LM head of each request's last accepted row alone) against its twin, SGLang's V2 draft extend computed in plain
PyTorch (every row through the whole layer, causal attention over the pool, the last accepted row kept:
``reference.drafter.draft_extend``), on random one-layer EAGLE-3 and EAGLE-1 drafts with a scattered paged pool of
ragged prefix lengths, bf16 and fp16.

Checks: the pool after the extend (every row's K / V at its verify slot, nothing else touched), the next draft's
top-1 id (exactly, unless the twin's two best logits are within ``NEAR_TIE``; ``topk_p`` all ones, SGLang's argmax
path) and the carried hidden state (``HIDDEN_RTOL`` of its largest value)."""

import pytest
import torch

from sgl_eagle_triton.devtools.reference import drafter as ref
from sgl_eagle_triton.devtools.testing import random_batch, random_draft
from sgl_eagle_triton.drafter import FusedDrafter

# Measured on the CPU (Triton interpreter), this file's cases x eagle3 / eagle1 x 3 seeds (the test's, +1000, +2000):
# the pool's written K / V bf16 bit-equal, fp16 at most 0.025 % of the largest value (one ulp); the carried hidden
# state's largest difference over its largest value bf16 0.0068 (about one ulp at the top binade), fp16 0.00065; no
# top-1 id differed (bf16's smallest gap between the two best probabilities 0: equal bf16 logits, where both agreed).
# Bounds: test_drafter.KV_RTOL's for the pool (a RoPE position off by one moves K by tens of percent), about 2x / 3x
# the hidden state's; NEAR_TIE as test_drafter's bf16 / fp16 bounds (one or two ulps of a logit).
KV_RTOL = {torch.bfloat16: 0.008, torch.float16: 0.001}
HIDDEN_RTOL = {torch.bfloat16: 0.014, torch.float16: 0.002}
NEAR_TIE = {torch.bfloat16: 0.14, torch.float16: 0.02}


def extend_case(device, eagle3, dtype, bs, n, seed):
    """``(w, batch, inputs)``: a random draft and pool, and the extend's inputs: ``input_ids`` [bs, n], carried
    ``hidden`` [bs, n, H], ``accept_lens`` [bs] int32 in 1..n (both ends present where bs allows), and
    ``out_cache_loc`` [bs, n] int64, the slots of positions ``seq_lens .. seq_lens + n - 1`` (as SGLang's verify
    holds them)."""
    w, gen = random_draft(eagle3, device, seed=seed, dtype=dtype)
    seq_lens = torch.randint(1, 40, (bs,), generator=gen).tolist()
    batch = random_batch(w, bs, 1, n, seq_lens, gen, device)
    input_ids = torch.randint(0, w.embed.shape[0], (bs, n), generator=gen).to(device)
    hidden = torch.randn(bs, n, w.hidden_size, generator=gen).to(dtype).to(device)
    accept = torch.randint(1, n + 1, (bs,), generator=gen)
    accept[0], accept[-1] = 1, n
    offsets = batch["seq_lens"][:, None] + torch.arange(n, device=device)
    out_cache_loc = batch["req_to_token"][batch["req_pool_indices"][:, None], offsets].long()
    return w, batch, dict(input_ids=input_ids, hidden=hidden, accept_lens=accept.int().to(device),
                          out_cache_loc=out_cache_loc)


def run_ours(w, batch, x, drafter_cls=FusedDrafter):
    """The fused extend on copies of the pool: ``((topk_p, topk_index, hidden), k_cache, v_cache)``."""
    k_cache, v_cache = batch["k_cache"].clone(), batch["v_cache"].clone()
    slots = x["out_cache_loc"].reshape(-1)

    def store_kv(k, v):  # a 16-bit pool: SGLang's set_kv_buffer is a plain index write
        k_cache[slots], v_cache[slots] = k, v

    drafter = drafter_cls(w, 1, 1, 2, k_cache, v_cache, batch["req_to_token"])
    out = drafter.draft_extend(x["input_ids"], x["hidden"], batch["seq_lens"], x["accept_lens"],
                               batch["req_pool_indices"], store_kv, 1)
    return out, k_cache, v_cache


def check_extend(w, batch, x, ours):
    (p, index, hidden), k_cache, v_cache = ours
    twin_k, twin_v = batch["k_cache"].clone(), batch["v_cache"].clone()
    kv = (twin_k, twin_v, batch["req_to_token"], batch["req_pool_indices"])
    margins = []
    twin_p, twin_index, twin_hidden = ref.draft_extend(w, x["input_ids"], x["hidden"], batch["seq_lens"],
                                                       x["accept_lens"], kv, x["out_cache_loc"], 1, margins)
    bs = x["input_ids"].shape[0]
    assert p.shape == index.shape == (bs, 1) and p.dtype == torch.float32 and index.dtype == torch.int64
    assert torch.equal(p, torch.ones_like(p)) and hidden.shape == (bs, w.hidden_size) and hidden.dtype == w.dtype
    for ours_cache, twin_cache in ((k_cache, twin_k), (v_cache, twin_v)):
        assert ours_cache.shape == twin_cache.shape
        error = (ours_cache.float() - twin_cache.float()).abs().max() / twin_cache.float().abs().max()
        assert error <= KV_RTOL[w.dtype], error
        untouched = torch.ones(ours_cache.shape[0], dtype=torch.bool, device=ours_cache.device)
        untouched[x["out_cache_loc"].reshape(-1)] = False
        assert torch.equal(ours_cache[untouched], batch["k_cache" if ours_cache is k_cache else "v_cache"][untouched])
    error = (hidden.float() - twin_hidden.float()).abs().max() / twin_hidden.float().abs().max()
    assert error <= HIDDEN_RTOL[w.dtype], error
    clear = margins[0] > NEAR_TIE[w.dtype]
    assert torch.equal(index[clear], twin_index[clear]), (index.tolist(), twin_index.tolist())
    return int(clear.sum()), bs


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
@pytest.mark.parametrize("eagle3", [True, False], ids=["eagle3", "eagle1"])
@pytest.mark.parametrize(("bs", "n"), [(1, 1), (1, 4), (5, 4), (3, 2)])
def test_draft_extend_matches_twin(device, eagle3, dtype, bs, n):
    w, batch, x = extend_case(device, eagle3, dtype, bs, n, seed=17 * bs + n)
    clear, rows = check_extend(w, batch, x, run_ours(w, batch, x))
    assert clear >= rows - 1  # random logits: near-ties are rare; a test that compares nothing would pass anything
