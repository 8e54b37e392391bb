"""The compile check of interpreted kernels (tests/compile_check.py: sm_90, gfx942, gfx950) can fail: a kernel whose
loop-carried variable changes type (the interpreter runs it; the compiler refuses it) is reported on every target, its
mended twin is not. (A tile over a target's shared memory: tests/test_tile_targets.py.)"""

import os

import pytest
import triton
import triton.language as tl

from tests import compile_check


@triton.jit
def _type_changing_loop(out_ptr, n):
    found = -1  # int32, then int64 inside the loop: the compiler refuses it
    i = tl.full((), 0, tl.int64)
    while i < n:
        found = tl.where(i == 3, i, found)
        i += 1
    tl.store(out_ptr, found)


@triton.jit
def _typed_loop(out_ptr, n):
    found = tl.full((), -1, tl.int64)
    i = tl.full((), 0, tl.int64)
    while i < n:
        found = tl.where(i == 3, i, found)
        i += 1
    tl.store(out_ptr, found)


def _record(name):
    return {"module": __name__, "name": name, "signature": {"out_ptr": "*i64", "n": "i64"}, "constexprs": {},
            "options": {"num_warps": 1}}


@pytest.mark.skipif(not os.environ.get("TRITON_INTERPRET"), reason="the CPU run's check (a GPU run compiles anyway)")
def test_a_kernel_the_compiler_refuses_is_reported():
    failures = compile_check.compile_all({"bad": _record("_type_changing_loop"), "good": _record("_typed_loop")})
    assert len(failures) == len(compile_check.TARGETS), failures
    for target, failure in zip(compile_check.TARGETS, failures, strict=True):
        assert failure.startswith(f"{target} ") and "_type_changing_loop" in failure and "CompilationError" in failure


def test_new_argument_types_are_recorded_beyond_the_variant_cap(monkeypatch):
    """Past MAX_VARIANTS constexpr sets a kernel's launches are no longer recorded, except with argument types not
    seen before (int64 index pointers, as SGLang passes them under CUDA graphs, compile differently)."""
    import torch

    def fake_kernel(x_ptr, n, BLOCK: tl.constexpr):
        pass

    fake_kernel.__module__ = "sgl_eagle_triton.fake"
    monkeypatch.setattr(compile_check, "RECORDS", {})
    narrow, wide = torch.zeros(1, dtype=torch.int32), torch.zeros(1, dtype=torch.int64)
    for block in range(compile_check.MAX_VARIANTS + 2):
        compile_check.record(fake_kernel, (narrow, 3), {"BLOCK": block})
    assert len(compile_check.RECORDS) == compile_check.MAX_VARIANTS
    compile_check.record(fake_kernel, (wide, 3), {"BLOCK": 99})
    compile_check.record(fake_kernel, (wide, 3), {"BLOCK": 98})  # those types seen: capped again
    assert len(compile_check.RECORDS) == compile_check.MAX_VARIANTS + 1
    assert any(r["signature"]["x_ptr"] == "*i64" for r in compile_check.RECORDS.values())
