"""The sm_90 compile check of interpreted kernels (tests/compile_check.py) can fail: a kernel whose loop-carried
variable changes type (the interpreter runs it; the compiler refuses it) is reported, its mended twin is not."""

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
    assert len(failures) == 1 and "_type_changing_loop" in failures[0] and "CompilationError" in failures[0], failures
