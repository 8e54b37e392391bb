"""Tile sweep of kernels/linear.py's Triton GEMM at 8B draft shapes: the five fastest (BLOCK_M, BLOCK_N, BLOCK_K,
stages, warps) per shape. H200 results: results/2026-11-26-NVIDIA_H200-linear-sweep.json, whose best depths
``linear._num_stages`` reproduces, and whose many-row tiles (64 and 256 rows) stayed behind cuBLAS, which
serves those shapes since (``CUBLAS_MIN_ROWS``).

    python -m bench.sweep_linear OUT.json        (on a GPU, from the repository root)
"""

import itertools
import json
import sys

import torch
import triton

from sgl_eagle_triton.kernels.linear import _linear_kernel

SHAPES = [(256, 14336, 4096, True, torch.float32), (256, 6144, 8192, False, torch.bfloat16),
          (64, 14336, 4096, True, torch.float32), (256, 4096, 14336, False, torch.bfloat16),
          (8, 14336, 4096, True, torch.float32), (8, 4096, 14336, False, torch.bfloat16)]
TILES = list(itertools.product([16, 32, 64, 128], [32, 64, 128], [64, 128], [2, 4], [4, 8]))


def sweep_shape(M, N, K, silu, xdt) -> list[tuple]:
    """``(median us, BLOCK_M, BLOCK_N, BLOCK_K, stages, warps)`` of every tile that runs, fastest first."""
    x = torch.randn(M, K, device="cuda", dtype=xdt)
    w = torch.randn((2 if silu else 1) * N, K, device="cuda", dtype=torch.bfloat16)
    out = torch.empty(M, N, device="cuda", dtype=torch.bfloat16)
    nw = torch.ones(K, device="cuda", dtype=torch.bfloat16)
    best = []
    for bm, bn, bk, st, nwarp in TILES:
        smem = st * (bm * bk * x.element_size() + (1 + silu) * bn * bk * 2)
        if (nwarp == 8) != (bm >= 64) or bm > max(16, M) or smem > 220000:
            continue
        grid = (triton.cdiv(M, bm), triton.cdiv(N, bn))

        def launch(grid=grid, bm=bm, bn=bn, bk=bk, st=st, nwarp=nwarp):
            _linear_kernel[grid](x, x.stride(0), w, out, nw, out, 0, out, out.stride(0), out, M, N, 1e-5,
                                 K=K, NORM=silu, HAS_BIAS=False, SILU_MUL=silu, ADD_RESIDUAL=False,
                                 WRITE_SUM=False, BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, USE_GDC=False,
                                 num_warps=nwarp, num_stages=st)

        try:
            launch()
            torch.cuda.synchronize()
            with torch.cuda.stream(torch.cuda.Stream()):
                t = triton.testing.do_bench_cudagraph(launch, rep=30, return_mode="median") * 1e3
        except Exception:  # a tile that does not fit this GPU (shared memory, registers) is skipped
            continue
        best.append((t, bm, bn, bk, st, nwarp))
    return sorted(best)


def main(out_path: str) -> None:
    res = {}
    for M, N, K, silu, xdt in SHAPES:
        key = f"M{M} N{N} K{K} silu{silu}"
        res[key] = sweep_shape(M, N, K, silu, xdt)[:5]
        print(key, res[key], flush=True)
    with open(out_path, "w") as f:
        json.dump(res, f, indent=1)


if __name__ == "__main__":
    main(sys.argv[1])
