"""Parity tests: Triton ``build_tree_`` vs its PyTorch twin (and sgl-kernel's CUDA op on a GPU)."""

import random
from enum import IntEnum

import pytest
import torch

from sgl_eagle_triton.devtools.reference import build_tree as reference
from sgl_eagle_triton.devtools.testing import draft_tree
from sgl_eagle_triton.kernels import build_tree as kernels

FULL_MASK, QLEN_ONLY, QLEN_ONLY_BITPACKING = 0, 1, 2
POISON = 12345  # never a valid position / index / link


class TreeMaskMode(IntEnum):  # stands in for SGLang's enum of the same name
    FULL_MASK = 0
    QLEN_ONLY = 1
    QLEN_ONLY_BITPACKING = 2


def max_draft_tokens(topk: int, steps: int) -> int:
    """Largest ``n``: the root plus every scored draft candidate."""
    return 1 + topk + (steps - 1) * topk * topk


def mask_size(mode: int, seq_lens: list, n: int) -> int:
    bs = len(seq_lens)
    sizes = {FULL_MASK: n * sum(seq_lens) + n * n * bs, QLEN_ONLY: n * n * bs, QLEN_ONLY_BITPACKING: n * bs}
    return sizes[mode]


def mask_dtype(mode: int, n: int) -> torch.dtype:
    return reference.packed_mask_dtype(n) if mode == QLEN_ONLY_BITPACKING else torch.uint8


def poisoned_mask(mode: int, seq_lens: list, n: int, dtype: torch.dtype, gen: torch.Generator, tail: int = 0):
    """A mask buffer (plus ``tail`` spare cells) of random bytes that the op must overwrite or keep."""
    size = mask_size(mode, seq_lens, n) + tail
    if dtype == torch.bool:
        return torch.randint(0, 2, (size,), generator=gen).bool()
    if dtype == torch.uint8:
        return torch.full((size,), 7, dtype=torch.uint8)  # 7: neither True nor False
    raw = torch.randint(0, 256, (size * dtype.itemsize,), dtype=torch.uint8, generator=gen)
    return raw.view(dtype)


def run_both(parent_list, selected_index, seq_lens, mask, topk, steps, n, mode, fill_prefix, device):
    """Run kernel and reference on copies of the same poisoned buffers; return both outputs."""
    bs = selected_index.shape[0]
    results = []
    for impl, dev in ((kernels, device), (reference, "cpu")):
        out = (
            mask.clone().to(dev),
            torch.full((bs * n,), POISON, device=dev),
            *torch.full((3, bs, n), POISON, device=dev),
        )
        impl.build_tree_(
            parent_list.to(dev), selected_index.to(dev), torch.tensor(seq_lens, device=dev), *out,
            topk, steps, n, mode, fill_prefix,
        )
        results.append([t.cpu() for t in out])
    return results


def assert_same(got, want):
    """Equal masks (byte for byte) and equal integer outputs."""
    assert torch.equal(got[0].view(torch.uint8), want[0].view(torch.uint8)), "tree_mask"
    names = ("positions", "retrieve_index", "next_token", "next_sibling")
    for name, g, w in zip(names, got[1:], want[1:], strict=True):
        assert g.tolist() == w.tolist(), name


def full_mask_rows(mask: torch.Tensor, seq_lens: list, n: int):
    """Per request, its ``[n, seq_len + n]`` FULL_MASK rows (as bytes), then what lies past them."""
    rows, start = [], 0
    for seq_len in seq_lens:
        rows.append(mask.view(torch.uint8)[start : start + n * (seq_len + n)].view(n, seq_len + n))
        start += n * (seq_len + n)
    return rows, mask.view(torch.uint8)[start:]


def check_tree(mode, bs, topk, steps, n, seq_lens, gen, device, dtype=None, fill_prefix=False):
    dtype = dtype or mask_dtype(mode, n)
    parent_list, selected_index = draft_tree(bs, topk, steps, n, gen)
    mask = poisoned_mask(mode, seq_lens, n, dtype, gen, tail=37)
    got, want = run_both(parent_list, selected_index, seq_lens, mask, topk, steps, n, mode, fill_prefix, device)
    assert_same(got, want)
    return got


def random_shape(rng: random.Random, max_n: int):
    topk, steps = rng.randint(1, 10), rng.randint(1, 10)
    largest = min(max_n, max_draft_tokens(topk, steps))
    n = largest if rng.random() < 0.25 else rng.randint(2, largest)
    return rng.randint(1, 4), topk, steps, n


@pytest.mark.parametrize("chunk", range(4))
@pytest.mark.parametrize("mode", [FULL_MASK, QLEN_ONLY, QLEN_ONLY_BITPACKING])
def test_random_trees_match_reference(mode, chunk, device):
    """50 random SGLang-shaped trees per (mode, chunk): 200 per mode."""
    rng, gen = random.Random(1000 * mode + chunk), torch.Generator().manual_seed(chunk)
    large_l = 0.5 if device == "cuda" else 0.05
    for _ in range(50):
        bs, topk, steps, n = random_shape(rng, 32 if mode == QLEN_ONLY_BITPACKING else 64)
        seq_lens = [rng.randint(1, 5000 if rng.random() < large_l else 300) for _ in range(bs)]
        dtype = rng.choice([torch.bool, torch.uint8]) if mode != QLEN_ONLY_BITPACKING else None
        check_tree(mode, bs, topk, steps, n, seq_lens, gen, device, dtype, fill_prefix=rng.random() < 0.5)


@pytest.mark.parametrize(
    "bs, topk, steps, n",
    [
        (1, 1, 1, 2),  # smallest tree
        (2, 1, 10, 11),  # topk 1: a chain as deep as the draft
        (3, 4, 1, 5),  # one draft step: parent_list is [bs, 0]
        (1, 10, 1, 11),
        (2, 2, 3, max_draft_tokens(2, 3)),  # every candidate selected
        (1, 3, 3, max_draft_tokens(3, 3)),
        (2, 4, 5, 7),  # n not a power of two
        (4, 8, 8, 64),
        (2, 10, 6, 100),  # beyond 64 draft tokens
        (1, 10, 3, 128),
    ],
)
@pytest.mark.parametrize("mode", [FULL_MASK, QLEN_ONLY, QLEN_ONLY_BITPACKING])
def test_edge_shapes(mode, bs, topk, steps, n, device):
    if mode == QLEN_ONLY_BITPACKING and n > 32:
        pytest.skip("bit-packed rows hold at most 32 tokens")
    gen = torch.Generator().manual_seed(n)
    check_tree(mode, bs, topk, steps, n, [3 + 17 * b for b in range(bs)], gen, device, fill_prefix=True)


@pytest.mark.parametrize("fill_prefix", [False, True])
@pytest.mark.parametrize("dtype", [torch.bool, torch.uint8])
def test_full_mask_prefix(dtype, fill_prefix, device):
    """Prefix cells are True with ``fill_prefix``, untouched without; cells past the end stay."""
    gen, n, seq_lens = torch.Generator().manual_seed(0), 9, [1, 700, 0, 129]
    mask = check_tree(FULL_MASK, 4, 3, 4, n, seq_lens, gen, device, dtype, fill_prefix)[0]
    rows, tail = full_mask_rows(mask, seq_lens, n)
    for seq_len, request in zip(seq_lens, rows, strict=True):
        if fill_prefix or dtype == torch.uint8:
            assert (request[:, :seq_len] == (1 if fill_prefix else 7)).all()
        assert (request[:, seq_len:] <= 1).all() and (request[:, seq_len] == 1).all()
    if dtype == torch.uint8:
        assert (tail == 7).all()


@pytest.mark.parametrize("mode", [FULL_MASK, QLEN_ONLY, QLEN_ONLY_BITPACKING])
def test_sglang_example(mode, device):
    """The two-request tree of SGLang's ``test_build_tree_kernel_efficient`` (topk 4, 4 steps)."""
    parent_list = torch.tensor(
        [[-1, 0, 1, 2, 3, 4, 8, 9, 10, 20, 24, 21, 28], [-1, 0, 1, 2, 3, 4, 5, 6, 7, 24, 28, 20, 21]]
    )
    selected_index = torch.tensor([[0, 1, 4, 8, 20, 24, 36], [0, 4, 5, 6, 7, 24, 36]])
    n, seq_lens = 8, [5, 10]
    mask = poisoned_mask(mode, seq_lens, n, mask_dtype(mode, n), torch.Generator())
    got, want = run_both(parent_list, selected_index, seq_lens, mask, 4, 4, n, mode, True, device)
    assert_same(got, want)
    _, positions, retrieve_index, next_token, next_sibling = got
    assert positions.tolist() == [5, 6, 6, 7, 7, 8, 8, 9, 10, 11, 12, 12, 12, 12, 13, 14]
    assert retrieve_index.tolist() == [list(range(8)), list(range(8, 16))]
    assert next_token.tolist() == [[1, 3, 4, 5, 6, 7, -1, -1], [1, 2, -1, 6, -1, -1, 7, -1]]
    assert next_sibling.tolist() == [[-1, 2, -1, -1, -1, -1, -1, -1], [-1, -1, 3, 4, 5, -1, -1, -1]]
    if mode == QLEN_ONLY_BITPACKING:  # request 1: node 7's ancestors are 6, 3, 1 and the root
        assert got[0][8 + 7].item() == 0b11001011


@pytest.mark.parametrize("mode", [FULL_MASK, QLEN_ONLY, QLEN_ONLY_BITPACKING])
def test_invalid_tree_stays_in_bounds(mode, device):
    """Unselected parents (CUDA warns "invalid eagle tree"): unlinked, walk stops, no stray writes."""
    gen, n, topk, seq_lens = torch.Generator().manual_seed(5), 20, 3, [11, 4]
    parent_list, selected_index = draft_tree(2, topk, 4, n, gen)
    parent_list[:, topk + 1 : 2 * topk + 1] = 10**6  # orphan draft step 2; step 3 hangs below it
    parents = reference.tree_parents(parent_list[0].tolist(), selected_index[0].tolist(), topk)
    assert -1 in parents[1:] and any(parents[p] == -1 for p in parents[1:] if p > 0)
    mask = poisoned_mask(mode, seq_lens, n, mask_dtype(mode, n), gen, tail=37)
    got, want = run_both(parent_list, selected_index, seq_lens, mask, topk, 4, n, mode, True, device)
    assert_same(got, want)
    assert (got[3] >= -1).all() and (got[3] < n).all()


def test_bitpacking_rejects_more_than_32_tokens(device):
    n, long = 33, dict(dtype=torch.long, device=device)
    with pytest.raises(ValueError):
        kernels.build_tree_(
            torch.empty(1, 0, **long), torch.zeros(1, n - 1, **long), torch.ones(1, **long),
            torch.zeros(n, dtype=torch.int32, device=device), *torch.empty(4, n, **long).unsqueeze(1),
            1, 1, n, QLEN_ONLY_BITPACKING,
        )


@pytest.mark.parametrize("in_place", [False, True])
@pytest.mark.parametrize("fill_prefix_mask", [False, True])
@pytest.mark.parametrize("mode", list(TreeMaskMode))
def test_wrapper_matches_sglang_wrapper(mode, fill_prefix_mask, in_place, device):
    """``build_tree_kernel_efficient`` vs the reference twin of SGLang's (pre-filled buffers)."""
    if mode != TreeMaskMode.FULL_MASK and not fill_prefix_mask:
        pytest.skip("fill_prefix_mask only matters for FULL_MASK")
    bs, topk, steps, n, seq_lens = 3, 4, 4, 12, [30, 1, 257]
    gen = torch.Generator().manual_seed(int(mode))
    parent_list, selected_index = draft_tree(bs, topk, steps, n, gen)
    bonus = torch.randint(0, 1000, (bs,), generator=gen)
    draft = torch.randint(0, 1000, (bs, n - 1), generator=gen)
    dtype = reference.packed_mask_dtype(n) if mode == TreeMaskMode.QLEN_ONLY_BITPACKING else torch.bool
    buf = poisoned_mask(mode, seq_lens, n, dtype, gen) if in_place else None
    outs = []
    for impl, dev in ((kernels, device), (reference, "cpu")):
        mask = None if buf is None else buf.clone().to(dev)
        inputs = [t.to(dev) for t in (bonus, parent_list, selected_index, draft, torch.tensor(seq_lens))]
        result = impl.build_tree_kernel_efficient(
            *inputs, sum(seq_lens), topk, steps, n, mode, tree_mask_buf=mask, fill_prefix_mask=fill_prefix_mask
        )
        assert mask is None or result[0] is mask
        outs.append([t.cpu() for t in result])
    got, want = outs
    assert got[0].dtype == want[0].dtype and got[0].shape == want[0].shape
    if mode == TreeMaskMode.FULL_MASK and not (fill_prefix_mask or in_place):  # prefix cells are torch.empty
        got_rows, want_rows = full_mask_rows(got[0], seq_lens, n)[0], full_mask_rows(want[0], seq_lens, n)[0]
        rows = zip(got_rows, want_rows, seq_lens, strict=True)
        for g, w, seq_len in rows:
            assert torch.equal(g[:, seq_len:], w[:, seq_len:])
        got[0] = want[0]
    assert_same(got[:5], want[:5])
    assert got[5].tolist() == want[5].tolist() and got[5].tolist()[::n] == bonus.tolist()


@pytest.mark.gpu
@pytest.mark.parametrize("mode", [FULL_MASK, QLEN_ONLY, QLEN_ONLY_BITPACKING])
def test_matches_sgl_kernel(mode):
    """Against sgl-kernel's CUDA op, with buffers pre-filled the way SGLang does."""
    sgl_kernel = pytest.importorskip("sgl_kernel")
    rng, gen = random.Random(mode), torch.Generator().manual_seed(mode)
    for _ in range(100):
        bs, topk, steps, n = random_shape(rng, 32 if mode == QLEN_ONLY_BITPACKING else 64)
        seq_lens = [rng.randint(1, 3000) for _ in range(bs)]
        parent_list, selected_index = draft_tree(bs, topk, steps, n, gen)
        dtype = reference.packed_mask_dtype(n) if mode == QLEN_ONLY_BITPACKING else torch.bool
        mask = poisoned_mask(mode, seq_lens, n, dtype, gen).cuda()
        inputs = [t.cuda() for t in (parent_list, selected_index, torch.tensor(seq_lens))]
        positions = torch.full((bs * n,), POISON, device="cuda")
        ours = [mask.clone(), positions.clone(), *torch.full((3, bs, n), POISON, device="cuda")]
        kernels.build_tree_(*inputs, *ours, topk, steps, n, mode, True)
        theirs = [mask.clone(), positions.clone(), *torch.full((3, bs, n), -1, device="cuda")]
        theirs[0].view(torch.uint8).fill_(0 if mode == QLEN_ONLY_BITPACKING else 1)  # as SGLang pre-fills
        try:
            sgl_kernel.build_tree_kernel_efficient(*inputs, *theirs, topk, steps, n, mode)
        except RuntimeError as e:
            if "Not implemented" in str(e):
                pytest.skip("this sgl-kernel build has no bit-packed tree mask")
            raise
        assert_same([t.cpu() for t in ours], [t.cpu() for t in theirs])
