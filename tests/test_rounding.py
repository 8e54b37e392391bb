"""``kernels.rounding.round_to`` (fp32 -> bf16 / fp16 / fp8, ties to even) against torch's casts, bit for bit, on
the suite's device: compiled on a GPU, under the Triton interpreter on the CPU (whose own casts it works around)."""

import pytest
import torch
import triton
import triton.language as tl

from sgl_eagle_triton.kernels.rounding import round_to, tl_dtype

DTYPES = [torch.bfloat16, torch.float16, torch.float8_e4m3fn, torch.float8_e5m2]


@triton.jit
def _round_kernel(x_ptr, out_ptr, n, DTYPE: tl.constexpr, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    ok = offs < n
    tl.store(out_ptr + offs, round_to(tl.load(x_ptr + offs, mask=ok, other=0.0), DTYPE), mask=ok)


def bits(t: torch.Tensor) -> torch.Tensor:
    return t.view(torch.uint8 if t.element_size() == 1 else torch.int16)


def values(dtype: torch.dtype, gen: torch.Generator) -> torch.Tensor:
    """fp32 inputs for ``dtype``, all finite and inside its range: the values of (a sample of) its bit patterns,
    the exact midpoints between neighbouring values (ties, subnormal ones included), each midpoint's fp32
    neighbours (just below and above a tie), and random values spread over the whole range, subnormals included."""
    info = torch.finfo(dtype)
    if dtype.itemsize == 1:
        patterns = torch.arange(256, dtype=torch.uint8)
    else:
        patterns = torch.cat((torch.arange(0, 1024), torch.randint(0, 1 << 16, (8192,), generator=gen))).to(torch.int32)
        patterns = patterns.to(torch.int16)  # wraps into the negative half: both signs
    low = patterns.view(dtype).float()
    high_bits = (patterns.to(torch.int32) + 1).to(patterns.dtype)  # next magnitude, same sign
    high = high_bits.view(dtype).float()
    same_sign = (high_bits.to(torch.int32) & (0x80 if dtype.itemsize == 1 else 0x8000)) == (
        patterns.to(torch.int32) & (0x80 if dtype.itemsize == 1 else 0x8000))
    ok = low.isfinite() & high.isfinite() & same_sign
    low, high = low[ok], high[ok]
    ties = ((low.double() + high.double()) / 2).float()
    assert torch.equal(ties.double(), (low.double() + high.double()) / 2)  # exact in fp32
    below, above = torch.nextafter(ties, ties.new_tensor(0.0)), torch.nextafter(ties, ties.new_tensor(float("inf")))
    # Random magnitudes from below the smallest subnormal to below the largest value, both signs.
    smallest = info.smallest_normal * info.eps  # the smallest subnormal
    exponents = torch.empty(4096).uniform_(float(torch.log2(torch.tensor(smallest))) - 2,
                                           float(torch.log2(torch.tensor(info.max))) - 1, generator=gen)
    rand = torch.exp2(exponents) * (1 + torch.rand(4096, generator=gen))
    rand *= torch.where(torch.rand(4096, generator=gen) < 0.5, -1.0, 1.0)
    x = torch.cat((low, ties, below, above, rand, torch.tensor([0.0, -0.0])))
    return x[x.abs() <= info.max]


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: str(d).removeprefix("torch."))
def test_round_to_matches_torch(device, dtype):
    if device == "cuda" and dtype == torch.float8_e4m3fn and torch.cuda.get_device_capability() < (8, 9):
        pytest.skip("float8e4nv needs sm_89 or later")
    x = values(dtype, torch.Generator().manual_seed(0))
    out = torch.empty(x.shape, dtype=dtype, device=device)
    block = 1024
    _round_kernel[(triton.cdiv(x.numel(), block),)](x.to(device), out, x.numel(), DTYPE=tl_dtype(dtype), BLOCK=block)
    expected = x.to(dtype)
    wrong = (bits(out.cpu()) != bits(expected)).nonzero().flatten()
    assert wrong.numel() == 0, [(x[i].item(), out[i].item(), expected[i].item()) for i in wrong[:5].tolist()]


def test_tl_dtype():
    assert [tl_dtype(d) for d in DTYPES] == [tl.bfloat16, tl.float16, tl.float8e4nv, tl.float8e5]
    assert tl_dtype(torch.float32) == tl.float32
