"""Compiling every Triton kernel the CPU run interprets, for an H100 (sm_90), an MI300X (gfx942) and an MI355X
(gfx950), without a GPU.

The Triton interpreter (``TRITON_INTERPRET=1``, CPU CI) skips the compiler's checks (e.g. a loop-carried variable
whose type changes in a ``while`` loop), so a kernel can pass every CPU test and fail to compile on the GPU.
:func:`record` (installed by tests/conftest.py) notes each kernel's launches with distinct argument types (always)
and distinct constexpr values (up to :data:`MAX_VARIANTS`): its module, name, argument types and constexpr values,
and launch options.
:func:`compile_all` compiles those in fresh processes without the interpreter, as ``triton.compile`` does on a GPU
host, once per target of :data:`TARGETS` with the launch's own options: ptx and cubin for sm_90a (Triton's bundled
ptxas), amdgcn and hsaco for gfx942 / gfx950 (Triton's AMD backend links in process). A variant fails on a target
when it does not compile or when its compiled shared memory exceeds what one program may use there
(``sgl_eagle_triton.kernels.device``'s entry: an H100's opt-in shared memory, an AMD GPU's LDS).
"""

from __future__ import annotations

import contextlib
import inspect
import json
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import torch

RECORDS: dict[str, dict] = {}
DTYPES = {torch.float32: "fp32", torch.float16: "fp16", torch.bfloat16: "bf16", torch.int64: "i64",
          torch.int32: "i32", torch.int16: "i16", torch.int8: "i8", torch.uint8: "u8", torch.bool: "i1",
          torch.float8_e4m3fn: "fp8e4nv", torch.float8_e5m2: "fp8e5"}
OPTIONS = ("num_warps", "num_stages", "num_ctas", "maxnreg")
# target name -> (backend, arch, warp size, the device.py entry whose shared_per_block bounds a program's shared memory)
TARGETS = {"sm_90": ("cuda", 90, 32, "H100"), "gfx942": ("hip", "gfx942", 64, "MI300X"),
           "gfx950": ("hip", "gfx950", 64, "MI355X")}


def _type(value) -> str | None:
    if isinstance(value, torch.Tensor):
        return "*" + DTYPES[value.dtype]
    if isinstance(value, bool):
        return "i1"
    if isinstance(value, int):
        return "i32" if -(2**31) <= value < 2**31 else "i64"
    if isinstance(value, float):
        return "fp32"
    return None  # None or other: passed as a constexpr


def _constexpr(value):
    """A constexpr value as JSON can carry it: a Triton dtype as ``{"tl_dtype": name}``."""
    import triton.language as tl

    if isinstance(value, tl.constexpr):
        value = value.value
    if isinstance(value, tl.dtype):
        return {"tl_dtype": str(value)}
    return value


def _from_json(value):
    import triton.language as tl

    return tl.dtype(value["tl_dtype"]) if isinstance(value, dict) and "tl_dtype" in value else value


# Specializations compiled per kernel at most: each distinct set of constexpr values that ran (a variant's code, e.g.
# a logit cap, may compile differently), the first few of them
MAX_VARIANTS = 6


def record(function, args, kwargs, records: dict | None = None, cap: int = MAX_VARIANTS) -> None:
    """Notes the launch of ``function`` (an interpreted kernel's Python function) with ``args`` / ``kwargs`` in
    ``records`` (:data:`RECORDS` by default): once per distinct set of argument types, and per distinct set of
    constexpr values up to ``cap`` per kernel."""
    records = RECORDS if records is None else records
    kernel = f"{function.__module__}.{function.__qualname__}"
    if not function.__module__.startswith("sgl_eagle_triton"):
        return
    params = inspect.signature(function).parameters
    bound = dict(zip(params, args, strict=False))
    bound.update({k: v for k, v in kwargs.items() if k in params})
    signature, constexprs = {}, {}
    for name, param in params.items():
        value = bound.get(name, param.default)
        if "constexpr" in str(param.annotation) or _type(value) is None:
            signature[name], constexprs[name] = "constexpr", _constexpr(value)
        else:
            signature[name] = _type(value)
    key = f"{kernel}|{json.dumps(constexprs, sort_keys=True, default=str)}|{json.dumps(signature, sort_keys=True)}"
    if key in records:
        return
    # argument types not seen before (e.g. int64 index pointers, as SGLang passes them under CUDA graphs): always
    # compiled once; other constexpr sets up to MAX_VARIANTS
    new_types = not any(r["kernel"] == kernel and r["signature"] == signature for r in records.values())
    if not new_types and sum(r["kernel"] == kernel for r in records.values()) >= cap:
        return
    records[key] = dict(kernel=kernel, module=function.__module__, name=function.__name__, signature=signature,
                        constexprs=constexprs, options={k: kwargs[k] for k in OPTIONS if k in kwargs})


def install() -> None:
    """Wraps the interpreter's kernel launch so that every launch is recorded (once per kernel)."""
    from triton.runtime import interpreter

    run = interpreter.InterpretedFunction.run
    if getattr(run, "compile_check", False):
        return

    def recording_run(self, *args, grid, warmup, **kwargs):
        try:
            record(self.fn, args, kwargs)
        except Exception:  # an argument this recorder cannot type: that kernel is not checked
            pass
        return run(self, *args, grid=grid, warmup=warmup, **kwargs)

    recording_run.compile_check = True
    interpreter.InterpretedFunction.run = recording_run


@contextlib.contextmanager
def launches_on(gpu):
    """Within it, the kernels' launchers choose their tiles and launch options for ``gpu`` (a
    ``sgl_eagle_triton.kernels.device.DeviceInfo``: every kernel module's ``device_info`` answers it) and their
    interpreted launches are recorded, every variant, without running (tensors need shapes only). Yields the records
    (:func:`compile_all` compiles them)."""
    from triton.runtime import interpreter

    from sgl_eagle_triton.kernels import pdl

    records: dict[str, dict] = {}
    run = interpreter.InterpretedFunction.run
    modules = [m for name, m in list(sys.modules.items())
               if name.startswith("sgl_eagle_triton.kernels.") and hasattr(m, "device_info")]
    saved = {m: m.device_info for m in modules}

    def recording_run(self, *args, grid, warmup, **kwargs):
        record(self.fn, args, kwargs, records, cap=10**9)

    try:
        interpreter.InterpretedFunction.run = recording_run
        for module in modules:
            module.device_info = lambda device: gpu
        pdl.pdl_args.cache_clear()
        yield records
    finally:
        interpreter.InterpretedFunction.run = run
        for module, device_info in saved.items():
            module.device_info = device_info
        pdl.pdl_args.cache_clear()


def _compile(record_: dict, target: str = "sm_90") -> str | None:
    """Compiles one recorded variant for ``target`` (a key of :data:`TARGETS`); returns why it failed, or None."""
    import importlib

    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from sgl_eagle_triton.kernels import device

    backend, arch, warp_size, gpu = TARGETS[target]
    limit = getattr(device, gpu).shared_per_block
    kernel = getattr(importlib.import_module(record_["module"]), record_["name"])
    while not isinstance(kernel, triton.runtime.jit.JITFunction):  # an Autotuner / Heuristics wraps it
        kernel = kernel.fn
    where = f"{target} {record_['module']}.{record_['name']}"
    try:
        constexprs = {name: _from_json(value) for name, value in record_["constexprs"].items()}
        source = ASTSource(kernel, record_["signature"], constexprs=constexprs)
        compiled = triton.compile(source, target=GPUTarget(backend, arch, warp_size), options=record_["options"])
    except Exception as e:  # noqa: BLE001 - the compiler's message is the report
        return f"{where}: {type(e).__name__}: {' | '.join(str(e).splitlines())[:600]}"
    if compiled.metadata.shared > limit:
        return (f"{where}: {compiled.metadata.shared} bytes of shared memory, {target} has {limit} "
                f"(constexprs {record_['constexprs']}, options {record_['options']})")
    return None


def compile_all(records: dict[str, dict], targets=tuple(TARGETS)) -> list[str]:
    """Compiles ``records`` for each of ``targets`` (:func:`compile_each`); returns one line per failure."""
    return compile_each({target: records for target in targets})


SPLIT_FROM = 16  # records of one target from which compile_each splits them over two processes


def compile_each(jobs: dict[str, dict[str, dict]]) -> list[str]:
    """Compiles each target's records (``{target: records}``) in fresh processes without the interpreter, two at a
    time (a target's records split in two from :data:`SPLIT_FROM` on, so that both cores stay busy to the end);
    returns one line per failure (target first), in target order."""
    code = ("import json, sys; from tests.compile_check import _compile; "
            "target, records = sys.argv[1], json.load(sys.stdin); "
            "print(json.dumps([m for r in records.values() if (m := _compile(r, target))]))")
    root = Path(__file__).resolve().parent.parent  # the repository: tests and the package import from it
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = os.pathsep.join([str(root), *filter(None, [env.get("PYTHONPATH")])])

    parts = []
    for target, records in jobs.items():
        items = list(records.items())
        n = 2 if len(items) >= SPLIT_FROM else 1
        parts += [(target, dict(items[i::n])) for i in range(n)]

    def run(part: tuple[str, dict]) -> list[str]:
        target, records = part
        out = subprocess.run([sys.executable, "-c", code, target], input=json.dumps(records, default=str),
                             capture_output=True, text=True, env=env, cwd=root, timeout=900)
        if out.returncode:
            return [f"{target}: compile check process failed: {out.stderr[-2000:]}"]
        return json.loads(out.stdout.strip().splitlines()[-1])

    with ThreadPoolExecutor(max_workers=2) as pool:
        return [line for lines in pool.map(run, parts) for line in lines]
