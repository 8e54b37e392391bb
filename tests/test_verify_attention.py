"""verify_attention (the target's verify forward attention: draft tokens over their paged prefix and tree) against
its twin, and the twin against SGLang's ``extend_attention_fwd`` (what it replaces) in fp32.

Pass: outputs within the measured bf16 / fp16 error of the twin (the kernel rounds the probabilities to the pool's
dtype before P.V, as SGLang's kernel does) on random batches: batch 1, ragged prefixes, one draft token, chains
(causal, no mask) and random trees, grouped heads 1 / 4, head dims not a power of two; the mask's prefix columns
are random and must be ignored; pool slots permuted. The twin equals SGLang's kernel (interpreted, fp32) within
fp32 rounding.
"""

import pytest
import torch

from sgl_eagle_triton.kernels.verify_attention import verify_attention
from sgl_eagle_triton.reference.verify_attention import verify_attention as verify_attention_ref

# (bs, prefix lengths or None for random, draft tokens per request, Hq, Hkv, D, masked)
CASES = [
    (1, [5], 4, 4, 1, 64, True),           # batch 1
    (3, [1, 37, 70], 6, 8, 2, 64, True),   # ragged prefixes, a prefix of 1, more than one prefix block
    (2, [9, 20], 1, 4, 4, 64, True),       # one draft token (steps 0), no grouping
    (4, None, 4, 8, 2, 64, False),         # chains: causal, no mask
    (2, [33, 65], 20, 4, 1, 80, True),     # 20 tokens x 4 heads: two row blocks; head dim not a power of two
]


def tree_masks(prefix_lens, n, gen):
    """Per request ``n`` rows of ``prefix + n``: random prefix columns (ignored), the tree part each node's
    ancestors and itself (node 0 the root, node i's parent drawn from 0 .. i - 1)."""
    rows = []
    for prefix in prefix_lens:
        parent = [0] + [int(torch.randint(0, i, (1,), generator=gen)) for i in range(1, n)]
        tree = torch.zeros(n, n, dtype=torch.bool)
        for i in range(n):
            j = i
            while True:
                tree[i, j] = True
                if j == 0:
                    break
                j = parent[j]
        rows.append(torch.cat([torch.rand(n, prefix, generator=gen) < 0.5, tree], dim=1).flatten())
    lens = torch.tensor([0] + [r.numel() for r in rows])
    return torch.cat(rows), lens.cumsum(0)


def make_case(bs, prefix_lens, n, hq, hkv, dim, masked, dtype, seed, slots=400):
    gen = torch.Generator().manual_seed(seed)
    if prefix_lens is None:
        prefix_lens = torch.randint(1, 90, (bs,), generator=gen).tolist()
    total = sum(prefix_lens)
    q = torch.randn(bs * n, hq, dim, generator=gen).to(dtype)
    k_ext = torch.randn(bs * n, hkv, dim, generator=gen).to(dtype)
    v_ext = torch.randn(bs * n, hkv, dim, generator=gen).to(dtype)
    k_buf = torch.randn(slots, hkv, dim, generator=gen).to(dtype)
    v_buf = torch.randn(slots, hkv, dim, generator=gen).to(dtype)
    kv_indices = torch.randperm(slots, generator=gen)[:total].to(torch.int64)
    kv_indptr = torch.tensor([0, *prefix_lens]).cumsum(0).to(torch.int32)
    qo_indptr = (torch.arange(bs + 1) * n).to(torch.int32)
    mask, mask_indptr = tree_masks(prefix_lens, n, gen) if masked else (None, None)
    return dict(q=q, k_extend=k_ext, v_extend=v_ext, k_buffer=k_buf, v_buffer=v_buf, qo_indptr=qo_indptr,
                kv_indptr=kv_indptr, kv_indices=kv_indices, custom_mask=mask,
                mask_indptr=None if mask_indptr is None else mask_indptr.to(torch.int32), max_len_extend=n,
                sm_scale=dim ** -0.5)


def run(impl, case, device, **extra):
    args = {k: (v.to(device) if isinstance(v, torch.Tensor) else v) for k, v in case.items()}
    q = args["q"]
    o = torch.zeros(q.shape[0], q.shape[1], args["v_extend"].shape[2], dtype=q.dtype, device=device)
    return impl(args["q"], args["k_extend"], args["v_extend"], o, args["k_buffer"], args["v_buffer"],
                args["qo_indptr"], args["kv_indptr"], args["kv_indices"], args["custom_mask"], args["mask_indptr"],
                args["max_len_extend"], args["sm_scale"], **extra).float().cpu()


# max |kernel - twin| (outputs of magnitude up to ~3, both rounded to the dtype): measured 2026-11-27 under the
# interpreter over these cases and three seeds each at 0.0156 (bf16: one ulp in [2, 4)) / 0.00195 (fp16); twice that
TOLERANCE = {torch.bfloat16: 0.031, torch.float16: 0.0039}


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize(("bs", "prefix_lens", "n", "hq", "hkv", "dim", "masked"), CASES)
def test_matches_reference(device, bs, prefix_lens, n, hq, hkv, dim, masked, dtype):
    case = make_case(bs, prefix_lens, n, hq, hkv, dim, masked, dtype, seed=bs * 100 + n)
    got, want = run(verify_attention, case, device), run(verify_attention_ref, case, "cpu")
    assert torch.isfinite(got).all()
    assert (got - want).abs().max() <= TOLERANCE[dtype]


@pytest.mark.parametrize(("k_scale", "v_scale", "logit_cap"), [(0.5, 2.0, 0.0), (1.0, 1.0, 5.0)])
def test_scales_and_logit_cap(device, k_scale, v_scale, logit_cap):
    case = make_case(3, [12, 40, 3], 5, 8, 2, 64, True, torch.bfloat16, seed=7)
    extra = dict(k_scale=k_scale, v_scale=v_scale, logit_cap=logit_cap)
    got, want = run(verify_attention, case, device, **extra), run(verify_attention_ref, case, "cpu", **extra)
    assert (got - want).abs().max() <= TOLERANCE[torch.bfloat16] * v_scale


def test_the_mask_decides_which_draft_tokens_are_seen(device):
    """A tree whose mask the kernel misread (e.g. the prefix columns as the tree's) changes outputs far beyond
    rounding: the same batch with every tree reduced to its chain of ancestors... here, to the root alone."""
    case = make_case(2, [10, 30], 6, 4, 1, 64, True, torch.bfloat16, seed=11)
    lone = dict(case)
    mask = case["custom_mask"].clone()
    for b, (start, prefix) in enumerate(zip(case["mask_indptr"][:-1].tolist(), [10, 30], strict=True)):
        rows = mask[start:start + 6 * (prefix + 6)].view(6, prefix + 6)
        rows[:, prefix:] = False
        rows[:, prefix] = True  # the root
        rows[:, prefix:].diagonal().fill_(True)
    lone["custom_mask"] = mask
    differ = (run(verify_attention, case, device) - run(verify_attention, lone, device)).abs().max()
    assert differ > 10 * TOLERANCE[torch.bfloat16]
    assert (run(verify_attention, lone, device) - run(verify_attention_ref, lone, "cpu")).abs().max() <= \
        TOLERANCE[torch.bfloat16]


@pytest.mark.gpu
@pytest.mark.parametrize("masked", [True, False])
def test_the_twin_is_sglangs_extend_attention(masked):
    """What SGLang's triton backend computes for a target verify (``extend_attention_fwd``: prefix from the pool,
    the draft tokens' own K/V, the mask's prefix columns skipped) equals the twin, and our kernel, within bf16
    rounding (CUDA only: SGLang's kernel loops over tensor bounds, which the interpreter cannot run)."""
    from sglang.kernels.ops.attention.extend_attention import extend_attention_fwd

    case = make_case(3, [4, 33, 17], 5, 8, 2, 64, masked, torch.bfloat16, seed=3)
    args = {k: (v.to("cuda") if isinstance(v, torch.Tensor) else v) for k, v in case.items()}
    o = torch.zeros_like(args["q"])
    extend_attention_fwd(args["q"], args["k_extend"], args["v_extend"], o, args["k_buffer"], args["v_buffer"],
                         args["qo_indptr"], args["kv_indptr"], args["kv_indices"], args["custom_mask"], True,
                         args["mask_indptr"], args["max_len_extend"], 1.0, 1.0, sm_scale=args["sm_scale"])
    sglang_out = o.float().cpu()
    assert (sglang_out - run(verify_attention_ref, case, "cpu")).abs().max() <= TOLERANCE[torch.bfloat16]
    assert (sglang_out - run(verify_attention, case, "cuda")).abs().max() <= TOLERANCE[torch.bfloat16]
