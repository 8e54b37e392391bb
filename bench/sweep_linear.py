"""Tile sweep of kernels/linear.py's Triton GEMM at 8B draft shapes: the five fastest (BLOCK_M, BLOCK_N, BLOCK_K,
stages, warps) per shape. H200 results: results/2026-11-26-NVIDIA_H200-linear-sweep.json, whose best depths
``linear._num_stages`` reproduces, and whose many-row tiles (64 and 256 rows) stayed behind cuBLAS, which
serves those shapes since (``CUBLAS_MIN_ROWS``).

    python -m bench.sweep_linear OUT.json        (on a GPU, from the repository root)
    python -m bench.sweep_linear OUT.json --tp 1 2 4    rank 0's shards at each TP size (1: the one-GPU draft;
                                                        1 and 8 rows, cold weights): the tiles (BLOCK_K up to 512,
                                                        deeper pipelines) against linear's own choice, and the
                                                        draft LM head's tile pass over its vocabulary shard
                                                        (--ops qkv o_proj gate_up down lm_head, --rows 1 8)

At --tp 4 shard shapes the rule before gave too few bytes in flight at one row (qkv N 1536: 96 programs of 16
columns, BLOCK_K 128). Sweeps of rank 0's shards (an H200 at --tp 4:
results/2026-11-27-NVIDIA_H200-sweep-linear-tp4.json; an H100 at --tp 1 and 2:
results/2026-11-28-NVIDIA_H100_80GB_HBM3-sweep-linear-tp12.json) found 32 columns and deep K tiles (512, 256 with
silu_mul) best wherever the grid is at most one wave, and BLOCK_K 256 best for the LM head's tile pass: the rules
of ``linear._config`` and ``lm_head_topk._tile_pass_config`` since: each within 3.2 % of the best tile there
but TP 4's o_proj (K 1024: 6 %, as before).
"""

import argparse
import itertools
import json

import torch
import triton
import triton.language as tl

from sgl_eagle_triton.kernels.device import device_info, stage_bytes
from sgl_eagle_triton.kernels.linear import _config, _linear_kernel, _num_stages

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
    def fits(bm, bn, bk, st, nwarp):
        smem = st * stage_bytes(bm, bn, bk, x.element_size(), 1 + silu)
        return (nwarp == 8) == (bm >= 64) and bm <= max(16, M) and smem <= 220000

    def time_tile(bm, bn, bk, st, nwarp):
        grid = (triton.cdiv(M, bm), triton.cdiv(N, bn))

        def launch():
            _linear_kernel[grid](x, x.stride(0), w, out, nw, out, 0, out, out.stride(0), out, M, N, 1e-5,
                                 K=K, NORM=silu, HAS_BIAS=False, SILU_MUL=silu, ADD_RESIDUAL=False,
                                 WRITE_SUM=False, BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, DTYPE=tl.bfloat16, USE_GDC=False,
                                 num_warps=nwarp, num_stages=st)

        return graph_us(launch)

    return timed_tiles(time_tile, TILES, fits)


def graph_us(launch, per: int = 1) -> float:
    """Median microseconds of ``launch()`` replayed in a CUDA graph (after one eager run), over ``per``."""
    launch()
    torch.cuda.synchronize()
    with torch.cuda.stream(torch.cuda.Stream()):
        return triton.testing.do_bench_cudagraph(launch, rep=30, return_mode="median") * 1e3 / per


def cold_copies(rows: int, cols: int) -> list[torch.Tensor]:
    """Random bf16 [rows, cols] weights, COLD_BYTES in all: timed one after another, none is re-read from L2."""
    return [torch.randn(rows, cols, device="cuda", dtype=torch.bfloat16)
            for _ in range(triton.cdiv(COLD_BYTES, rows * cols * 2))]


def timed_tiles(time_tile, tiles, fits) -> list[tuple]:
    """``(time_tile(*tile), *tile)`` of every tile of ``tiles`` that ``fits(*tile)`` and runs, fastest first."""
    timed = []
    for tile in tiles:
        if not fits(*tile):
            continue
        try:
            timed.append((time_tile(*tile), *tile))
        except Exception:  # a tile that does not fit this GPU (shared memory, registers) is skipped
            continue
    return sorted(timed)


def rule_and_best(time_tile, rule: tuple, tiles, smem_of) -> dict:
    """``{"rule": (us, *rule), "best": the five fastest (us, *tile)}``: ``time_tile(*tile)`` for the kernel's own
    choice and for every tile of ``tiles`` whose shared memory ``smem_of(*tile)`` fits (:func:`timed_tiles`)."""
    timed_rule = (time_tile(*rule), *rule)  # first, as before the tiles
    return {"rule": timed_rule, "best": timed_tiles(time_tile, tiles, lambda *tile: smem_of(*tile) <= 200000)[:5]}


# Llama-3.1-8B EAGLE-3 draft layer, rank 0's shard at --tp N: op -> (N, K, norm + silu_mul) with the inputs the
# drafter passes (qkv: the bf16 [embed; hidden] of 2H; gate_up: the fp32 residual sum, normalised); the row-parallel
# o_proj and down run without their residual epilogue under TP (added after the all-reduce: drafter._row_parallel);
# timed so at --tp 1 as well, where the one-GPU drafter fuses that epilogue (one [M, N] read more)
TP_OPS = {"qkv": lambda tp: (6144 // tp, 8192, False), "o_proj": lambda tp: (4096, 4096 // tp, False),
          "gate_up": lambda tp: (14336 // tp, 4096, True), "down": lambda tp: (4096, 14336 // tp, False)}
SKINNY_TILES = list(itertools.product([16, 32, 64], [128, 256, 512], [2, 3, 4, 6], [4]))  # BLOCK_N, BLOCK_K, stages
COLD_BYTES = 256 << 20  # weights cycled through per timing: none re-read from L2 (50 MB on an H100 / H200)
H200_COPY_BYTES_PER_S = 4.25e12  # the floors' bandwidth: an H200's copy, as bench.drafter measured it


def sweep_tp_shape(M, N, K, silu) -> dict:
    """``{"rule": (us, tile), "best": [(us, BLOCK_N, BLOCK_K, stages, warps)...]}`` for one shard op at ``M`` rows,
    BLOCK_M 16, each timing over cold copies of the weight (as bench.drafter)."""
    x = torch.randn(M, K, device="cuda", dtype=torch.float32 if silu else torch.bfloat16)
    rows_w = (2 if silu else 1) * N
    copies = cold_copies(rows_w, K)
    out = torch.empty(M, N, device="cuda", dtype=torch.bfloat16)
    nw = torch.ones(K, device="cuda", dtype=torch.bfloat16)

    def smem(bn, bk, st, nwarp):
        return st * stage_bytes(16, bn, bk, x.element_size(), 1 + silu)

    def time_tile(bn, bk, st, nwarp):
        grid = (1, triton.cdiv(N, bn))

        def launch():
            for w in copies:
                _linear_kernel[grid](x, x.stride(0), w, out, nw, out, 0, out, out.stride(0), out, M, N, 1e-5, K=K,
                                     NORM=silu, HAS_BIAS=False, SILU_MUL=silu, ADD_RESIDUAL=False, WRITE_SUM=False,
                                     BLOCK_M=16, BLOCK_N=bn, BLOCK_K=bk, DTYPE=tl.bfloat16, USE_GDC=False,
                                     num_warps=nwarp, num_stages=st)

        return graph_us(launch, len(copies))

    gpu = device_info(x.device)
    _, bn, bk, nwarp = _config(M, N, K, silu, x.element_size(), gpu)
    st = _num_stages(triton.cdiv(N, bn), smem(bn, bk, 1, nwarp), gpu)
    floor_us = rows_w * K * 2 / H200_COPY_BYTES_PER_S * 1e6
    return {**rule_and_best(time_tile, (bn, bk, st, nwarp), SKINNY_TILES, smem), "floor_us_h200": floor_us}


LM_HEAD_TILES = list(itertools.product([16, 32, 64], [64, 128, 256], [2, 3, 4, 6], [4]))  # BLOCK_V, BLOCK_K, stages
DRAFT_VOCAB = 32000  # the EAGLE-3 draft's vocabulary (token map to the target's)


def sweep_lm_head_shard(M, V, H=4096) -> dict:
    """As :func:`sweep_tp_shape` for the draft LM head's tile pass over a shard of ``V`` vocabulary rows (normed
    fp32 input, top-8 per tile): ``BLOCK_V`` (``lm_head_topk.VOCAB_TILE``, whose tiles the merge then reads),
    ``BLOCK_K`` and depth against the kernel's own choice (``lm_head_topk._tile_pass_config``)."""
    from sgl_eagle_triton.kernels.lm_head_topk import VOCAB_TILE, _lm_head_tile_kernel, _tile_pass_config

    topk = 8
    x = torch.randn(M, H, device="cuda", dtype=torch.float32)
    nw = torch.ones(H, device="cuda", dtype=torch.bfloat16)
    copies = cold_copies(V, H)

    def time_tile(bv, bk, st, nwarp):
        tiles = triton.cdiv(V, bv)
        keys = torch.empty((M, topk, tiles), dtype=torch.int64, device="cuda")
        sums = torch.empty((M, tiles), dtype=torch.float32, device="cuda")

        def launch():
            for w in copies:
                _lm_head_tile_kernel[(1, tiles)](x, x.stride(0), w, nw, keys, sums, M, 1e-5, 0, V, V=V, H=H, TOPK=topk,
                                                 HAS_NORM=True, FROM_LOGITS=False, BLOCK_R=16, BLOCK_V=bv,
                                                 BLOCK_K=bk, DTYPE=tl.bfloat16, USE_GDC=False, num_warps=nwarp,
                                                 num_stages=st)

        return graph_us(launch, len(copies))

    _, block_k, stages = _tile_pass_config(M, H, triton.cdiv(V, VOCAB_TILE), x.element_size(), device_info(x.device))
    return {**rule_and_best(time_tile, (VOCAB_TILE, block_k, stages, 4), LM_HEAD_TILES,
                            lambda bv, bk, st, nwarp: st * stage_bytes(16, bv, bk, x.element_size())),
            "floor_us_h200": V * H * 2 / H200_COPY_BYTES_PER_S * 1e6}


OPS = [*TP_OPS, "lm_head"]


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out")
    parser.add_argument("--tp", type=int, nargs="+", choices=[1, 2, 4, 8],
                        help="sweep rank 0's shard shapes at these TP sizes (1: the whole one-GPU draft layer) instead "
                        "of the many-row shapes")
    parser.add_argument("--ops", nargs="+", choices=OPS, default=OPS, help="with --tp: only these ops")
    parser.add_argument("--rows", type=int, nargs="+", default=[1, 8], help="with --tp: rows of each op")
    args = parser.parse_args(argv)
    res = {"gpu": torch.cuda.get_device_name()}

    def record(key, value):  # saved after every shape: a call cut by its deadline keeps what it measured
        res[key] = value
        print(key, value, flush=True)
        with open(args.out, "w") as f:
            json.dump(res, f, indent=1)

    if not args.tp:
        for M, N, K, silu, xdt in SHAPES:
            record(f"M{M} N{N} K{K} silu{silu}", sweep_shape(M, N, K, silu, xdt)[:5])
        return
    for tp in args.tp:
        for op in args.ops:
            for M in args.rows:
                if op == "lm_head":
                    record(f"tp{tp} lm_head tile pass M{M} V{DRAFT_VOCAB // tp}",
                           sweep_lm_head_shard(M, DRAFT_VOCAB // tp))
                else:
                    N, K, silu = TP_OPS[op](tp)
                    record(f"tp{tp} {op} M{M} N{N} K{K}", sweep_tp_shape(M, N, K, silu))


if __name__ == "__main__":
    main()
