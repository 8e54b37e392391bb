"""Write DIR/MANIFEST.txt: what each file of the bundle is, why the host needs it, and what was changed.

    python3 manifest.py DIR     # CUDA_HOME in the environment names the nvcc that built the JIT cache
"""

import os
import re
import subprocess
import sys
import tarfile
from pathlib import Path

import sglang_patches
from bundle import JIT_CACHE, MANIFEST, MAX_MIB, WHEELS
from repack import RECIPES

INSTALL = ("python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade "
           "--target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site")
UNPACK_JIT = (f"export TVM_FFI_CACHE_DIR=/tmp/tvm-ffi; mkdir -p $TVM_FFI_CACHE_DIR; "
              f"tar -xJf .whl/{JIT_CACHE} -C $TVM_FFI_CACHE_DIR")


def nvcc_release() -> str:
    nvcc = Path(os.environ["CUDA_HOME"]) / "bin" / "nvcc"
    out = subprocess.run([str(nvcc), "--version"], capture_output=True, text=True, check=True).stdout
    return re.search(r"release [\d.]+, V[\d.]+", out).group(0)


def manifest(folder: Path) -> str:
    lines = [
        "Offline wheel set for SGLang 0.5.17 on an air-gapped Hopper (H100/H200) GPU host:",
        "CPython 3.12, x86_64, torch 2.11.0+cu130. Made by tools/gpu_wheelhouse.sh (see docs/gpu.md).",
        f"Install: {INSTALL}",
        "Assumed present on the host (not bundled): torch 2.11.0+cu130 with its nvidia-* CUDA 13 libraries,",
        "triton 3.6.0, transformers 5.17 and the packages around them (numpy, tokenizers, safetensors, ...).",
        "",
        f"{'size(bytes)':>12}  {'MiB':>6}  wheel  --  why",
    ]
    sizes = {w.filename: (folder / w.filename).stat().st_size for w in WHEELS}
    for wheel in sorted(WHEELS, key=lambda w: -sizes[w.filename]):
        size = sizes[wheel.filename]
        recipe = RECIPES.get(wheel.name)
        why = wheel.why + (f" REPACKED: {recipe.summary}" if recipe else " Unmodified.")
        lines += [f"{size:>12}  {size / 2**20:6.2f}  {wheel.filename}", f"{'':22}{why}"]
    wheels_total = sum(sizes.values())
    lines += ["", f"TOTAL {len(WHEELS)} wheels, {wheels_total} bytes = {wheels_total / 2**20:.2f} MiB", ""]

    lines.append("Source patches inside the repacked sglang wheel (RECORD regenerated; sglang-kernel and "
                 "torchvision only lose files):")
    lines += [f" {n:>2} {p.path}: {p.why}" for n, p in enumerate(sglang_patches.PATCHES, 1)]

    jit = folder / JIT_CACHE
    with tarfile.open(jit, "r:xz") as tar:
        modules = sorted({Path(m.name).parent.name for m in tar.getmembers() if m.name.endswith(".so")})
    lines += [
        "",
        f"JIT cache (not a wheel): {JIT_CACHE}  {jit.stat().st_size} bytes.",
        "SGLang compiles some CUDA kernels at run time with nvcc (tvm_ffi.cpp.load_inline). These",
        f"modules are prebuilt for sm_90a with tvm-ffi 0.1.11 and nvcc {nvcc_release()}, under the",
        "cache keys the bundled sglang computes:",
        *(f"    {m}" for m in modules),
        f"Use: {UNPACK_JIT}",
        "Other JIT kernels compile on the host at first use (nvcc via CUDA_HOME or PATH, and g++);",
        "triton needs a C compiler (cc) there.",
        "",
        f"Wheels + JIT cache: {(wheels_total + jit.stat().st_size) / 2**20:.2f} MiB "
        f"(the whole folder must stay at or under {MAX_MIB} MiB).",
    ]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: python3 manifest.py DIR")
    folder = Path(sys.argv[1])
    (folder / MANIFEST).write_text(manifest(folder))
