"""Triton ``lm_head_topk`` (LM head + softmax + top-k, logits never stored) against its PyTorch twin.

Most cases use exact inputs: small dyadic values whose fp32 partial sums are all exact, so every summation
order (the kernel's ``tl.dot`` tiles, the twin's matmul) gives the same logits bit for bit, ties included,
and the indices must be identical. The CUDA-only Gaussian cases compare tie-aware instead.
"""

import pytest
import torch

from sgl_eagle_triton.devtools.reference.lm_head_topk import lm_head_input, lm_head_logits
from sgl_eagle_triton.devtools.reference.lm_head_topk import lm_head_topk as lm_head_topk_ref
from sgl_eagle_triton.kernels.lm_head_topk import lm_head_topk


def lowest_bit(t: torch.Tensor) -> float:
    """The smallest power of two that every element of ``t`` is a multiple of (inf if all are 0)."""
    mantissa, exponent = torch.frexp(t[t != 0].double())
    if mantissa.numel() == 0:
        return float("inf")
    bits = (mantissa.abs() * 2**53).long()
    return ((bits & -bits).double() * torch.exp2(exponent.double() - 53)).min().item()


def assert_exact(x, weight, norm_weight):
    """Every fp32 partial sum of ``z @ weight.T`` is exact: all are multiples of one unit and below 2**24 units."""
    z = lm_head_input(x, weight, norm_weight).double()
    unit = lowest_bit(z) * lowest_bit(weight)
    assert (z.abs() @ weight.double().abs().T).max() < 2**24 * unit


def make_case(gen, R, V, H, norm, mapped, x_dtype=torch.bfloat16, density=1.0, dtype=torch.bfloat16):
    """Exact inputs ``(x, weight, norm_weight, token_map)``, on ``gen``'s device: x multiples of 1/8 in [-1, 1]
    (1/64 when fp32), weight multiples of 1/32 in [-1/2, 1/2] (nonzero with probability ``density``), norm
    weight 1 + multiples of 1/8 in [-1/2, 1/2], weights in ``dtype`` (the model's, bf16 or fp16; ``x_dtype``
    is that or fp32); token_map strictly increasing (EAGLE-3's ``d2t + arange``)."""
    dev = gen.device
    scale = 64 if x_dtype == torch.float32 else 8
    x = (torch.randint(-scale, scale + 1, (R, H), generator=gen, device=dev) / scale).to(x_dtype)
    weight = torch.randint(-16, 17, (V, H), generator=gen, device=dev) / 32
    if density < 1:
        weight *= torch.rand((V, H), generator=gen, device=dev) < density
    weight = weight.to(dtype)
    norm_weight = (1 + torch.randint(-4, 5, (H,), generator=gen, device=dev) / 8).to(dtype) if norm else None
    token_map = None
    if mapped:
        token_map = torch.arange(V, device=dev) + torch.randint(0, 3, (V,), generator=gen, device=dev).cumsum(0)
    assert_exact(x, weight, norm_weight)
    return x, weight, norm_weight, token_map


def row_errors(p: torch.Tensor, ref: torch.Tensor) -> torch.Tensor:
    """Per row, ``|p - ref| / |ref|`` (2-norms)."""
    return (p.double() - ref.double()).norm(dim=-1) / ref.double().norm(dim=-1)


def strided(x):
    """A copy of ``x`` whose row stride exceeds its width."""
    wide = torch.zeros(x.shape[0], x.shape[1] + 16, dtype=x.dtype, device=x.device)
    wide[:, : x.shape[1]] = x
    return wide[:, : x.shape[1]]


def check(device, x, weight, topk, norm_weight=None, token_map=None, strided_x=False, preallocated=False):
    """Kernel on ``device`` against the twin on the inputs' device: identical indices, close probabilities."""
    expected_p, expected_index = lm_head_topk_ref(x, weight, topk, norm_weight, token_map=token_map)
    args = [t.to(device) if t is not None else None for t in (x, weight, norm_weight, token_map)]
    if strided_x:
        args[0] = strided(args[0])
    outs = {}
    if preallocated:
        outs = dict(out_p=torch.empty(x.shape[0], topk, device=device),
                    out_index=torch.empty(x.shape[0], topk, dtype=torch.int64, device=device))
    p, index = lm_head_topk(args[0], args[1], topk, args[2], token_map=args[3], **outs)
    if preallocated:
        assert p is outs["out_p"] and index is outs["out_index"]
    assert torch.equal(index.to(expected_index.device), expected_index)
    assert row_errors(p.to(expected_p.device), expected_p).max() < 1e-5
    return p, index


CASES = [  # R, V, H, topk, norm, token_map, x dtype
    (1, 50, 32, 1, False, False, torch.bfloat16),
    (1, 200, 64, 4, True, True, torch.bfloat16),
    (3, 50, 48, 8, False, True, torch.bfloat16),  # one tile: fewer tiles than topk
    (3, 333, 64, 8, True, False, torch.bfloat16),
    (16, 200, 32, 4, False, False, torch.float32),
    (16, 333, 64, 1, True, True, torch.float32),
    (20, 333, 32, 8, True, True, torch.bfloat16),  # two row blocks, the second partial
    (20, 200, 64, 16, False, True, torch.bfloat16),
    (40, 333, 64, 8, True, True, torch.bfloat16),  # from 33 rows on: RMSNorm kernel, cuBLAS logits, tile kernel
    (40, 200, 32, 4, False, False, torch.float32),
    (3, 333, 768, 8, False, False, torch.bfloat16),  # BLOCK_K 256 (3 trips); more tiles than the interpreter's SMs
    (2, 200, 512, 4, False, True, torch.float32),  # BLOCK_K 256; tiles within the interpreter's one wave
]


@pytest.mark.parametrize("case", range(len(CASES)))
def test_matches_reference(device, case):
    R, V, H, topk, norm, mapped, x_dtype = CASES[case]
    gen = torch.Generator().manual_seed(case)
    x, weight, norm_weight, token_map = make_case(gen, R, V, H, norm, mapped, x_dtype)
    odd = case % 2 == 1  # odd cases: a strided x and preallocated outputs
    check(device, x, weight, topk, norm_weight, token_map, strided_x=odd, preallocated=odd)


@pytest.mark.parametrize("case", [1, 4, 8])
def test_fp16(device, case):
    """An fp16 model (weights, norm weight and the non-fp32 x in fp16; logits rounded to fp16) on cases whose
    sums stay exact with fp16 inputs: the final norm at one row, no norm with an fp32 x, the cuBLAS path."""
    R, V, H, topk, norm, mapped, x_dtype = CASES[case]
    gen = torch.Generator().manual_seed(case)
    x_dtype = torch.float32 if x_dtype == torch.float32 else torch.float16
    x, weight, norm_weight, token_map = make_case(gen, R, V, H, norm, mapped, x_dtype, dtype=torch.float16)
    odd = case % 2 == 1
    check(device, x, weight, topk, norm_weight, token_map, strided_x=odd, preallocated=odd)


@pytest.mark.parametrize("norm", [False, True])
def test_one_logit_dominates(device, norm):
    """Row ``r``'s logit at ``winners[r]`` (rows of ``sign(x_r)``) exceeds all others by ~30-50: its ``p`` is
    ~1 and the rest, down to ~1e-20, still match the twin elementwise."""
    gen = torch.Generator().manual_seed(7)
    x, weight, norm_weight, _ = make_case(gen, 3, 333, 64, norm, False)
    winners = torch.tensor([7, 150, 330])
    weight[winners] = torch.sign(x.float()).to(torch.bfloat16)
    assert_exact(x, weight, norm_weight)
    p, index = check(device, x, weight, 8, norm_weight)
    assert torch.equal(index[:, 0].cpu(), winners) and (p[:, 0] > 0.999).all()
    expected_p, _ = lm_head_topk_ref(x, weight, 8, norm_weight)
    assert expected_p[:, 1:].max() < 1e-10
    torch.testing.assert_close(p.cpu(), expected_p, rtol=1e-4, atol=0)


def test_topk_straddles_tiles(device):
    """Planted logits (x is one-hot, so the logits are one column of the weight): row 0's top 8 spread over
    five 64-wide tiles, with equal logits across tile borders (the lower id first); row 1's top 8 all in one
    tile, its 9th in another."""
    V, H = 333, 32
    gen = torch.Generator().manual_seed(3)
    weight = torch.randint(-8, 5, (V, H), generator=gen) / 8  # background logits in [-1, 1/2]
    planted = (
        {330: 4.0, 5: 3.5, 64: 3.0, 63: 3.0, 200: 2.5, 128: 2.0, 127: 2.0, 260: 1.5},
        {140: 3.0, 131: 2.75, 190: 2.5, 128: 2.25, 129: 2.25, 170: 2.0, 150: 1.75, 191: 1.5, 10: 1.25},
    )
    for row, logits in enumerate(planted):
        weight[list(logits), row] = torch.tensor(list(logits.values()))
    x = torch.eye(2, H, dtype=torch.bfloat16)
    _, index = check(device, x, weight.to(torch.bfloat16), 8)
    assert index.tolist() == [[330, 5, 63, 64, 200, 127, 128, 260], [140, 131, 190, 128, 129, 170, 150, 191]]


@pytest.mark.parametrize("norm", [False, True])
def test_all_logits_equal(device, norm):
    """Zero rows: every logit is 0 (some of them -0 products), so the top-k are ids 0..k-1, each p = 1/V."""
    gen = torch.Generator().manual_seed(5)
    _, weight, norm_weight, token_map = make_case(gen, 2, 200, 32, norm, True)
    x = torch.zeros(2, 32, dtype=torch.bfloat16)
    p, index = check(device, x, weight, 4, norm_weight, token_map)
    assert torch.equal(index.cpu(), token_map[:4].expand(2, 4))
    assert torch.allclose(p.cpu(), torch.full((2, 4), 1 / 200))


@pytest.mark.gpu
class TestRealShapes:
    """H 4096 and real draft vocabularies, with the final norm and a token map, twin on the GPU."""

    H = 4096

    @pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
    @pytest.mark.parametrize("V", [8000, 32000, 128256])  # 8000: a TP 4 shard's tiles, one wave
    @pytest.mark.parametrize("R", [1, 8, 64, 256])
    @pytest.mark.parametrize("topk", [1, 8])
    def test_exact(self, V, R, topk, dtype):
        """Exact inputs (sparse weights keep the partial sums exact at H 4096): identical indices. fp16 without
        the final norm (its output's 11-bit mantissas make the sums inexact at H 4096)."""
        gen = torch.Generator("cuda").manual_seed(V + R + topk)
        norm = dtype == torch.bfloat16
        x, weight, norm_weight, token_map = make_case(gen, R, V, self.H, norm, True, dtype, density=1 / 16, dtype=dtype)
        check("cuda", x, weight, topk, norm_weight, token_map)

    @pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
    @pytest.mark.parametrize("V", [32000, 128256])
    @pytest.mark.parametrize("R", [1, 8, 64, 256])
    @pytest.mark.parametrize("topk", [1, 8])
    def test_gaussian(self, V, R, topk, dtype):
        """Gaussian hidden states and weights. The kernel's fp32 sums run in another order than the twin's,
        so a logit may round to the neighbouring value of the model's dtype: ranks may differ only among logits
        within one ulp of each other, and p by about e**ulp - 1 per rounding that differs (bf16: 3% at logits in
        [4, 8); fp16: 0.4%)."""
        gen = torch.Generator("cuda").manual_seed(V + R + topk)
        x = torch.randn(R, self.H, generator=gen, device="cuda").to(dtype)
        weight = (0.02 * torch.randn(V, self.H, generator=gen, device="cuda")).to(dtype)
        norm_weight = (1 + 0.1 * torch.randn(self.H, generator=gen, device="cuda")).to(dtype)
        token_map = torch.arange(V, device="cuda") + torch.randint(0, 3, (V,), generator=gen, device="cuda").cumsum(0)
        p, index = lm_head_topk(x, weight, topk, norm_weight, token_map=token_map)
        logits = lm_head_logits(x, weight, norm_weight)
        ids = torch.searchsorted(token_map, index)
        assert torch.equal(token_map[ids], index)
        assert (ids.sort(dim=-1).values.diff(dim=-1) != 0).all()
        best = logits.sort(dim=-1, descending=True, stable=True)
        want = best.values[:, :topk]
        ulp = torch.exp2(torch.floor(torch.log2(want.abs()))) * torch.finfo(dtype).eps
        assert ((logits.gather(-1, ids) - want).abs() <= ulp).all()
        assert (ids != best.indices[:, :topk]).any(dim=-1).sum() <= max(1, R // 10)
        expected_p = torch.softmax(logits, dim=-1).gather(-1, ids)
        torch.testing.assert_close(p, expected_p, rtol=0.1, atol=1e-6)

    def test_cuda_graph_replay(self):
        """Captured once with preallocated outputs, replays on fresh hidden states copied into ``x``."""
        gen = torch.Generator("cuda").manual_seed(0)
        R, V, topk = 8, 32000, 4
        x, weight, norm_weight, token_map = make_case(gen, R, V, self.H, True, True, density=1 / 16)
        out_p = torch.empty(R, topk, device="cuda")
        out_index = torch.empty(R, topk, dtype=torch.int64, device="cuda")
        args = (x, weight, topk, norm_weight)
        lm_head_topk(*args, token_map=token_map, out_p=out_p, out_index=out_index)  # compile outside the capture
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            lm_head_topk(*args, token_map=token_map, out_p=out_p, out_index=out_index)
        for _ in range(3):
            x.copy_(torch.randint(-8, 9, (R, self.H), generator=gen, device="cuda") / 8)
            assert_exact(x, weight, norm_weight)
            expected_p, expected_index = lm_head_topk_ref(*args, token_map=token_map)
            graph.replay()
            assert torch.equal(out_index, expected_index)
            assert row_errors(out_p, expected_p).max() < 1e-5
