"""bench.margin_shift on 1 prompt x 8 tokens (CPU): keeps the tool's model and summary from rotting."""

import pytest
import torch

from bench.margin_shift import VARIANTS, Arith, TinyTarget, margins, markdown, summarize
from sgl_eagle_triton.devtools.testing import CODE_PROMPTS


@pytest.fixture(scope="module")
def single_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # the tiny shapes run fastest so; threads only oversubscribe a busy CPU
    yield
    torch.set_num_threads(threads)


def test_margin_shift_small(single_thread):
    model = TinyTarget()
    ids = model.encode(CODE_PROMPTS[4])
    assert ids[0] == 0  # BOS prepended
    out, lpA = model.greedy(ids, 8)
    assert lpA.shape == (8, 2048) and out == lpA.argmax(-1).tolist()
    mA, shift, dV = margins(lpA, model.teacher_forced(ids, out, Arith("exact_vec")))
    assert (mA >= 0).all() and shift.abs().max() <= 0.5  # prefill shapes, A's arithmetic: a few bf16 steps at most
    per = {n: margins(lpA, model.teacher_forced(ids, out, ar))[1:] for n, ar in VARIANTS.items()}
    r = summarize(mA, per)
    assert set(r["variants"]) == set(VARIANTS)
    assert set(r["variants"]["B_online64"]) == {"median_abs_shift", "p99_abs_shift", "p99.9_abs_shift", "max_abs_shift",
                                                "strict_flips", "ties", "max_a_margin_at_flip", "max_margin_loss"}
    assert sum(b["positions"] for b in r["flips_by_a_margin"]) == 8
    r |= {"date": "-", "model": "-", "prompts": 1, "new_tokens": 8, "positions": 8, "torch": torch.__version__}
    assert "| B_online64 |" in markdown(r)
