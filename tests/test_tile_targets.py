"""The tile rules on each GPU the suite compiles for (sgl_eagle_triton.kernels.device: H100 sm_90, MI300X gfx942,
MI355X gfx950): every tile rule's launcher (linear, LM head, draft attention, verify attention, target_probs and the
sampled verify that shares its vocabulary split) is called at Llama-3-8B-class shapes as if on that GPU
(:func:`tests.compile_check.launches_on`: the launches are recorded, not run), and every tile and launch option it
picks is compiled for that GPU: it must compile, and its compiled shared memory must fit the GPU's (an MI300X's
64 KB of LDS). Also what each rule reads of the GPU: AMD's wavefronts of 64 halve ``num_warps``, PDL never on AMD.
"""

import os

import pytest
import torch

from sgl_eagle_triton.kernels import device, pdl
from sgl_eagle_triton.kernels.draft_attention import draft_attention
from sgl_eagle_triton.kernels.linear import linear
from sgl_eagle_triton.kernels.lm_head_topk import lm_head_topk
from sgl_eagle_triton.kernels.target_probs import prepare_target_probs
from sgl_eagle_triton.kernels.tree_rows import chain_tree, verify_outputs
from sgl_eagle_triton.kernels.tree_sampling import tree_speculative_sampling
from sgl_eagle_triton.kernels.verify_attention import verify_attention
from tests import compile_check

BF16 = torch.bfloat16
CPU_ONLY = pytest.mark.skipif(not os.environ.get("TRITON_INTERPRET"),
                              reason="the CPU run's check (launches are recorded from the interpreter)")
GPUS = {target: getattr(device, entry) for target, (_, _, _, entry) in compile_check.TARGETS.items()}


def _empty(*shape, dtype=BF16):
    return torch.empty(*shape, dtype=dtype)


def launch_model_shapes() -> None:
    """One call of each tile rule's launcher per shape class of an 8B draft / target (hidden 4096, 32 / 8 heads of
    128, vocabulary 128256, draft vocabulary 32000) at tensor parallelism 1 and 8 (a grid of one wave: the deepest
    tiles), 1 and 20 rows, the LM head's widest tiles (fp32 x) at both."""
    for tp in (1, 8):
        for M in (1, 20):
            for N, K, flags in [(6144 // tp, 8192, {}), (14336 // tp, 4096, dict(silu=True)),
                                (4096, 14336 // tp, dict(residual=True))]:
                silu = flags.get("silu", False)
                x = _empty(M, K, dtype=torch.float32 if silu else BF16)  # gate_up reads the fp32 residual sum
                linear(x, _empty(2 * N if silu else N, K), _empty(M, N), silu_mul=silu,
                       norm_weight=_empty(K) if silu else None, eps=1e-6,
                       residual=_empty(M, N) if flags.get("residual") else None)
            for x_dtype in (BF16, torch.float32) if M == 1 else (BF16,):
                lm_head_topk(_empty(M, 4096, dtype=x_dtype), _empty(32000 // tp, 4096), 8, norm_weight=_empty(4096))
    hq, hkv, d = 32, 8, 128
    for bs, topk in [(1, 1), (4, 4), (2, 16)]:  # draft rows per kv head: topk x 4 (up to 64)
        rows = bs * topk
        draft_attention(_empty(rows, (hq + 2 * hkv) * d), torch.zeros(rows, dtype=torch.int64),
                        _empty(64, d, dtype=torch.float32), _empty(64, hkv, d), _empty(64, hkv, d),
                        torch.zeros(bs, 64, dtype=torch.int32), torch.arange(bs), torch.ones(bs, dtype=torch.int64),
                        _empty(4, rows, hkv, d), _empty(4, rows, hkv, d), 1, topk, hq, hkv, d, d ** -0.5,
                        _empty(rows, hq * d))
    for bs, n, dim, masked in [(1, 4, 128, False), (2, 64, 128, True), (8, 16, 64, True)]:
        indptr = torch.arange(bs + 1, dtype=torch.int32)
        verify_attention(_empty(bs * n, hq, dim), _empty(bs * n, hkv, dim), _empty(bs * n, hkv, dim),
                         _empty(bs * n, hq, dim), _empty(64, hkv, dim), _empty(64, hkv, dim), indptr * n,
                         indptr * 8, torch.zeros(bs * 8, dtype=torch.int64),
                         torch.zeros(bs * n * (8 + n), dtype=torch.bool) if masked else None,
                         indptr * n * (8 + n) if masked else None, n, dim ** -0.5)
    vocab = 128256
    for bs, n in [(1, 4), (16, 8)]:
        ones = torch.ones(bs)
        prepare_target_probs(_empty(bs * n, vocab, dtype=torch.float32), ones, torch.full((bs,), 20), ones * 0.9,
                             ones * 0, n)
        candidates, *tree = chain_tree(n, bs, "cpu")
        tree_speculative_sampling(*verify_outputs(bs, n, n - 1, "cpu"), candidates, *tree,
                                  torch.rand(bs, n), torch.rand(bs), _empty(bs, n, vocab, dtype=torch.float32))


# constexprs that size a loop, not a tile: variants that differ only there share their shared memory
LOOP_SIZES = ("K", "H", "V")


def tiles(records: dict) -> dict:
    """``records`` less those whose kernel, argument types, launch options and constexprs but :data:`LOOP_SIZES`
    another record already has."""
    kept = {}
    for key, r in records.items():
        tile = (r["kernel"], str(r["signature"]), str(r["options"]),
                str({k: v for k, v in r["constexprs"].items() if k not in LOOP_SIZES}))
        kept.setdefault(tile, (key, r))
    return dict(kept.values())


@CPU_ONLY
def test_tile_rules_compile_within_the_targets_shared_memory():
    jobs = {}
    for target, gpu in GPUS.items():
        with compile_check.launches_on(gpu) as records:
            launch_model_shapes()
        kernels = {r["name"] for r in records.values()}
        assert {"_linear_kernel", "_lm_head_tile_kernel", "_prefix_kernel", "_verify_attention_kernel",
                "_stats_kernel", "_walk_kernel"} <= kernels, kernels
        assert all(r["constexprs"].get("USE_GDC", False) != gpu.amd for r in records.values() if "USE_GDC" in
                   r["constexprs"])  # PDL on the H100, never on AMD
        jobs[target] = tiles(records)
    failures = compile_check.compile_each(jobs)
    assert not failures, "\n".join(failures)


def test_amd_entries():
    """What the issue's GPUs are: wavefronts of 64, 64 KB / 160 KB of LDS, 304 / 256 CUs; the ISA each is compiled
    for (tests/compile_check.py)."""
    assert (device.MI300X.warp_size, device.MI300X.shared_per_block, device.MI300X.sms) == (64, 65_536, 304)
    assert (device.MI355X.warp_size, device.MI355X.shared_per_block, device.MI355X.sms) == (64, 163_840, 256)
    assert all(compile_check.TARGETS[gpu.arch][1] == gpu.arch for gpu in device.AMD_GPUS.values())
    assert device.warps(device.MI300X, 256) == 4 and device.warps(device.H100, 256) == 8
    assert device.warps(device.MI300X, 32) == 1
    assert device.pdl(device.H100) and not device.pdl(device.MI300X) and not device.pdl(device.MI355X)


@CPU_ONLY
def test_the_rules_read_the_target():
    """Each rule's launch follows the GPU it is asked on: an MI300X's 64 KB of LDS keeps the linear layer's one-wave
    grids at BLOCK_K 128 (512 on an H100), wavefronts halve num_warps, PDL stays off."""
    def launches(gpu):
        with compile_check.launches_on(gpu) as records:
            linear(_empty(1, 8192), _empty(768, 8192), _empty(1, 768))  # TP 8's qkv shard: one wave
            pdl_on = pdl.pdl_args(torch.device("cpu"))["USE_GDC"]
        (launch,) = records.values()
        return launch["constexprs"]["BLOCK_K"], launch["options"]["num_warps"], pdl_on

    assert launches(device.H100) == (512, 4, True)
    assert launches(device.MI300X) == (128, 2, False)
    assert launches(device.MI355X) == (512, 2, False)


def _lds_blind_rule(M, N, K, silu_mul, x_bytes, gpu):
    """linear's tile rule broken: a 64-row x tile 1024 deep (128 KB of bf16) whatever the GPU's shared memory."""
    return 64, 16, 1024, device.warps(gpu, 128)


@CPU_ONLY
def test_a_tile_over_the_lds_is_rejected(monkeypatch):
    """The check above can fail: with a tile rule blind to shared memory, the linear layer's 64 x 1024 x tile compiles
    to 128 KB of LDS, rejected for an MI300X (64 KB) and accepted for an MI355X (160 KB)."""
    from sgl_eagle_triton.kernels import linear as linear_module

    monkeypatch.setattr(linear_module, "_config", _lds_blind_rule)
    jobs = {}
    for target in ("gfx942", "gfx950"):
        with compile_check.launches_on(GPUS[target]) as jobs[target]:
            linear(_empty(20, 4096), _empty(1024, 4096), _empty(20, 1024))
        (launch,) = jobs[target].values()
        assert (launch["constexprs"]["BLOCK_M"], launch["constexprs"]["BLOCK_K"]) == (64, 1024)
    failures = compile_check.compile_each(jobs)
    assert len(failures) == 1 and failures[0].startswith("gfx942 ") and "_linear_kernel" in failures[0], failures
    assert "131072 bytes of shared memory, gfx942 has 65536" in failures[0], failures


def test_rocm_device_info_reads_the_amd_entry(monkeypatch):
    """On a ROCm torch (faked) an MI300X is read as :data:`device.MI300X`: CUs, wavefront and the LDS of its ISA's
    entry; an unknown ISA keeps what the device reports."""
    from types import SimpleNamespace

    props = SimpleNamespace(gcnArchName="gfx942:sramecc+:xnack-", multi_processor_count=304,
                            shared_memory_per_block=65_536, shared_memory_per_block_optin=0, warp_size=64)
    monkeypatch.setattr(torch.version, "hip", "6.3.0", raising=False)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda d: props)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda d: (9, 4))
    read = device.device_info.__wrapped__  # uncached
    assert read(torch.device("cuda", 0)) == device.MI300X
    props.gcnArchName, props.multi_processor_count = "gfx90a:sramecc+:xnack-", 104
    assert read(torch.device("cuda", 0)) == device.DeviceInfo(104, 65_536, (9, 4), 64, "gfx90a")
