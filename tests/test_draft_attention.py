"""Triton ``draft_attention`` (one draft-decode step's attention) against its PyTorch twin."""

import pytest
import torch

from sgl_eagle_triton.devtools.reference.draft_attention import draft_attention as draft_attention_ref
from sgl_eagle_triton.kernels.draft_attention import draft_attention

PAD = -1  # a padded CUDA-graph request: req_pool_index 0, seq_len 1


def rope_cache(max_pos: int, head_dim: int, base: float = 10000.0) -> torch.Tensor:
    """SGLang's ``cos_sin_cache`` for neox RoPE over the full head: [max_pos, D] fp32, cos then sin."""
    inv_freq = 1.0 / base ** (torch.arange(0, head_dim, 2, dtype=torch.float) / head_dim)
    freqs = torch.outer(torch.arange(max_pos, dtype=torch.float), inv_freq)
    return torch.cat((freqs.cos(), freqs.sin()), dim=-1)


def row_strided(t: torch.Tensor) -> torch.Tensor:
    """A copy of the 2-D ``t`` whose row stride exceeds its width."""
    wide = t.new_empty(t.shape[0], t.shape[1] + 24)
    wide[:, : t.shape[1]] = t
    return wide[:, : t.shape[1]]


def clone_case(case):
    """Copy of a case: its own tensors, ``qkv`` row-strided."""
    copy = {k: v.clone() if isinstance(v, torch.Tensor) else v for k, v in case.items()}
    return dict(copy, qkv=row_strided(case["qkv"]))


def make_case(device, seq_lens, topk, hq, hkv, d, step, seed=0, ctx=None, dtype=torch.bfloat16, kv_dtype=None,
              kv_scales=(1.0, 1.0)):
    """Keyword arguments of ``draft_attention``, on ``device``, activations in ``dtype`` (the model's), the KV pool
    and chain in ``kv_dtype`` (default ``dtype``; an FP8 format: random values / their scale, quantised, and
    ``kv_scales`` passed as ``k_scale`` / ``v_scale``). Shapes depend on ``seq_lens`` only through ``ctx`` (default
    ``max(seq_lens) + 8``), the width of ``req_to_token``.

    ``qkv`` has a row stride wider than its width. Every slot of ``req_to_token`` is distinct and
    scattered over the pool, and slot 0 is never used. The chain's other steps, the spare chain rows
    and ``out`` all hold random data. ``seq_lens`` entries equal to ``PAD`` become padded requests.
    """
    gen = torch.Generator().manual_seed(seed)

    def randn(*shape):
        return torch.randn(*shape, generator=gen).to(dtype)

    bs, rows, width = len(seq_lens), len(seq_lens) * topk, (hq + 2 * hkv) * d
    reqs, ctx = bs + 2, ctx or max(seq_lens) + 8
    lens = torch.tensor([1 if n == PAD else n for n in seq_lens])
    req_pool_indices = torch.randperm(reqs - 1, generator=gen)[:bs] + 1
    req_pool_indices[torch.tensor(seq_lens) == PAD] = 0
    case = dict(
        qkv=randn(rows, width),
        positions=lens.repeat_interleave(topk) + step,
        cos_sin_cache=rope_cache(ctx + step + 1, d),
        k_cache=randn(reqs * ctx + 1, hkv, d),
        v_cache=randn(reqs * ctx + 1, hkv, d),
        req_to_token=(torch.randperm(reqs * ctx, generator=gen) + 1).view(reqs, ctx).int(),
        req_pool_indices=req_pool_indices,
        seq_lens=lens,
        chain_k=randn(step + 2, rows + 3, hkv, d),
        chain_v=randn(step + 2, rows + 3, hkv, d),
        out=randn(rows, hq * d),
    )
    if kv_dtype is not None:
        for name, kv_scale in (("k_cache", kv_scales[0]), ("v_cache", kv_scales[1]), ("chain_k", kv_scales[0]),
                               ("chain_v", kv_scales[1])):
            case[name] = (case[name] / kv_scale).to(dtype).to(kv_dtype)
        case.update(k_scale=kv_scales[0], v_scale=kv_scales[1])
    case = {name: t.to(device) if isinstance(t, torch.Tensor) else t for name, t in case.items()}
    dims = dict(step=step, topk=topk, num_q_heads=hq, num_kv_heads=hkv, head_dim=d, scale=d**-0.5)
    return dict(case, qkv=row_strided(case["qkv"]), **dims)


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a.float() - b.float()).norm() / b.float().norm()).item()


def check(case):
    """Run kernel and twin on copies of one case. ``out`` must agree to 16-bit precision and the whole
    chain must match: step ``step`` rows ``< R`` written, everything else untouched."""
    expected = clone_case(case)
    draft_attention_ref(**expected)
    got = clone_case(case)
    assert got["qkv"].stride(0) > got["qkv"].shape[1]
    assert draft_attention(**got) is got["out"]
    assert rel_err(got["out"], expected["out"]) < 1e-2
    for name in ("chain_k", "chain_v"):
        g, e = got[name], expected[name]
        if g.dtype in (torch.float8_e4m3fn, torch.float8_e5m2):
            # Bit for bit under the interpreter; compiled RoPE may differ from torch's by a 16-bit ulp, which
            # moves an FP8 rounding by at most one FP8 step (2^-3 / 2^-2 relative): a wrong scale moves more.
            step = 2.0**-3 if g.dtype == torch.float8_e4m3fn else 2.0**-2
            torch.testing.assert_close(g.float(), e.float(), rtol=step, atol=0, msg=name)
            if g.device.type == "cpu":
                assert torch.equal(g.view(torch.uint8), e.view(torch.uint8)), name
        else:
            torch.testing.assert_close(g, e, msg=name)


@pytest.mark.parametrize(
    "seq_lens, topk, hq, hkv, d, step",
    [
        ([37], 1, 2, 2, 32, 0),  # batch 1, no GQA, step 0
        ([100], 1, 4, 2, 16, 3),  # several key blocks per split chunk
        ([1, 40, 17], 4, 4, 2, 32, 2),  # ragged, L = 1, topk > 1, GQA
        ([23, 0, 9, 31], 2, 4, 4, 16, 1),  # an empty prefix: chain only
        ([12, 30, PAD, PAD], 3, 4, 1, 32, 4),  # padded CUDA-graph requests, one kv head
    ],
)
def test_matches_reference(device, seq_lens, topk, hq, hkv, d, step):
    check(make_case(device, seq_lens, topk, hq, hkv, d, step))


@pytest.mark.parametrize(
    "seq_lens, topk, hq, hkv, d, step",
    [
        ([100], 1, 4, 2, 16, 3),  # several key blocks per split chunk
        ([12, 30, PAD, PAD], 3, 4, 1, 32, 4),  # padded CUDA-graph requests, one kv head
    ],
)
def test_fp16(device, seq_lens, topk, hq, hkv, d, step):
    check(make_case(device, seq_lens, topk, hq, hkv, d, step, dtype=torch.float16))


FP8_KV = [(torch.float8_e4m3fn, (0.75, 1.5)), (torch.float8_e5m2, (1.0, 1.0))]


@pytest.mark.parametrize("kv_dtype, kv_scales", FP8_KV, ids=["e4m3-scaled", "e5m2"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
def test_fp8_kv_cache(device, kv_dtype, kv_scales, dtype):
    """An FP8 pool and chain (SGLang's --kv-cache-dtype fp8_e4m3 / fp8_e5m2): the prefix read in quantised
    units with the scales applied once, the step's own k / v quantised into the chain bit for bit as the twin
    (SGLang's set_kv_buffer) quantises them."""
    check(make_case(device, [1, 40, 17], 4, 4, 2, 32, 2, dtype=dtype, kv_dtype=kv_dtype, kv_scales=kv_scales))


@pytest.mark.gpu
class TestCuda:
    """Llama-3.1-8B draft shapes: Hq 32, Hkv 8, D 128, prefixes up to 4096."""

    @pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
    @pytest.mark.parametrize("bs", [1, 8, 32])
    @pytest.mark.parametrize("topk", [1, 8])
    def test_real_shapes(self, bs, topk, dtype):
        gen = torch.Generator().manual_seed(bs * 10 + topk)
        seq_lens = [4096, 1, *torch.randint(1, 4097, (bs,), generator=gen).tolist()][:bs]
        check(make_case("cuda", seq_lens, topk, 32, 8, 128, step=3, seed=bs + topk, dtype=dtype))

    @pytest.mark.parametrize("kv_dtype, kv_scales", FP8_KV, ids=["e4m3-scaled", "e5m2"])
    @pytest.mark.parametrize("bs", [1, 8])
    def test_real_shapes_fp8_kv(self, bs, kv_dtype, kv_scales):
        gen = torch.Generator().manual_seed(bs)
        seq_lens = [4096, *torch.randint(1, 4097, (bs,), generator=gen).tolist()][:bs]
        check(make_case("cuda", seq_lens, 8, 32, 8, 128, step=3, seed=bs, kv_dtype=kv_dtype, kv_scales=kv_scales))

    def test_cuda_graph_replay(self):
        """Captured once, the launch handles fresh lengths, slots, positions and activations."""
        case = make_case("cuda", [700, 5, 3000, PAD], 4, 32, 8, 128, step=2, ctx=4096)
        draft_attention(**case)  # compile outside the capture
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            draft_attention(**case)
        for seed, seq_lens in enumerate(([1, 2048, 64, PAD], [3500, 3000, 2, 7])):
            fresh = make_case("cuda", seq_lens, 4, 32, 8, 128, step=2, seed=seed + 1, ctx=4096)
            for name, t in fresh.items():
                if isinstance(t, torch.Tensor):
                    case[name].copy_(t)
            expected = clone_case(case)
            draft_attention_ref(**expected)
            graph.replay()
            assert rel_err(case["out"], expected["out"]) < 1e-2
            for name in ("chain_k", "chain_v"):
                torch.testing.assert_close(case[name], expected[name], msg=name)
