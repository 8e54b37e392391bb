"""Prebuild SGLang's tvm-ffi JIT CUDA kernels for sm_90a and pack them as a cache tarball. No GPU needed.

    python3 prebuild_jit.py OUT_DIR      # writes OUT_DIR/tvm-ffi-jit-cache-sm90a.tar.xz

SGLang 0.5.17 compiles a few small CUDA kernels at run time (tvm_ffi.cpp.load_inline + nvcc) and caches
each as $TVM_FFI_CACHE_DIR/<module>__arch_<arch>__tvmffi_<version>/<module>.so, where <module> hashes
the kernel's template arguments and sources. This script calls SGLang's own module builders, with
override_jit_cuda_arch(9, 0) standing in for a Hopper GPU, so the cache keys are exactly the ones the
host computes and it loads these .so files instead of compiling them.

Expects on sys.path (PYTHONPATH): the unpacked sglang of the bundle (cache keys hash its sources) and a
build environment with torch, torchvision, apache-tvm-ffi==0.1.11, ninja and sglang's light import
dependencies. Expects TVM_FFI_CACHE_DIR (an empty scratch folder) and CUDA_HOME (nvcc 13.x) in the
environment.
"""

import os
import sys
import tarfile
import time
from pathlib import Path

import torch
from bundle import JIT_CACHE
from sglang.kernels.jit.utils import override_jit_cuda_arch
from sglang.kernels.ops.activation.activation import activation_module
from sglang.kernels.ops.attention.clamp_position import _jit_clamp_position_module
from sglang.kernels.ops.attention.rope import _jit_fused_rope_module
from sglang.kernels.ops.kvcache.kvcache import _jit_kvcache_module

# The JIT kernels that serving the tiny Llama of sgl_eagle_triton/devtools (bf16, head_dim 64, 2 KV heads)
# with EAGLE-3 on the triton attention backend needs. Kernels for other shapes compile on the host at first use
# (nvcc there).
BF16 = torch.bfloat16
KERNELS = [  # (label, SGLang's module builder, its arguments)
    ("silu_and_mul, bf16", activation_module, (BF16,)),
    ("fused rope, neox, rope_dim 64, bf16", _jit_fused_rope_module, (True, 64, BF16, BF16)),
    ("clamp_position, int32", _jit_clamp_position_module, (torch.int32,)),
    ("clamp_position, int64", _jit_clamp_position_module, (torch.int64,)),
    ("KV-cache store, 256-byte K/V rows", _jit_kvcache_module, (256, 256)),
]


def build(cache_dir: Path) -> None:
    with override_jit_cuda_arch(9, 0):
        for label, builder, args in KERNELS:
            start = time.time()
            builder(*args)
            print(f"  built {label} ({time.time() - start:.0f} s)", flush=True)
    built = sorted(cache_dir.glob("*/*.so"))
    if len(built) != len(KERNELS):
        sys.exit(f"expected {len(KERNELS)} modules in {cache_dir}, found {[p.name for p in built]}")


def pack(cache_dir: Path, out: Path) -> None:
    """Tar only the .so of each module folder (build files are not needed), with fixed metadata."""

    def normalised(info: tarfile.TarInfo) -> tarfile.TarInfo:
        info.uid = info.gid = 0
        info.uname = info.gname = ""
        info.mtime = 0
        info.mode = 0o755
        return info

    with tarfile.open(out, "w:xz", preset=9) as tar:
        for so in sorted(cache_dir.glob("*/*.so")):
            module_dir = so.parent.name
            tar.add(so.parent, arcname=module_dir, recursive=False, filter=normalised)
            tar.add(so, arcname=f"{module_dir}/{so.name}", filter=normalised)


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: python3 prebuild_jit.py OUT_DIR")
    cache = Path(os.environ["TVM_FFI_CACHE_DIR"])
    build(cache)
    pack(cache, Path(sys.argv[1]) / JIT_CACHE)
