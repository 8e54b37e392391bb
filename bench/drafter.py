"""Fused-drafter benchmark at Llama-3.1-8B EAGLE-3 draft shapes (random weights, ~1k-token paged prefixes).

    python -m bench.drafter [--out bench/results]        (on a GPU, from the repository root)
    python -m bench.drafter --kv-formats [--out ...]      whole draft under each KV format and page size
    python -m bench.drafter --tp 4 [--out ...]            one rank's draft at --tp 4 (shard shapes, no collectives)
    python -m bench.drafter --extend [--out ...]          the lean draft extend (FusedDrafter.draft_extend)

With ``--kv-formats`` only the whole-draft rows run, once per KV format (``KV_FORMATS``: bf16 / page 1, bf16 /
page 16, FP8 e4m3 / page 1, FP8 e4m3 / page 16, in that order and then again reversed, so neither end of the run
is favoured; each row is the mean of its two timings) and write ``<date>-<gpu>-drafter-kv.json`` / ``.md``.

Rows: the whole draft of one decode cycle (``FusedDrafter.draft``: S - 1 forwards + selections + prune)
inside a CUDA graph, as SGLang's draft graph runner replays it, and per op of one step: our ``linear``
(Triton below ``CUBLAS_MIN_ROWS`` rows, from there RMSNorm + cuBLAS + a Triton epilogue) against cuBLAS
(``torch.nn.functional.linear``, what SGLang's draft layer calls) and ``lm_head_topk`` against cuBLAS
matmul + softmax + top-k, each cycling through copies of its weight so that no repetition finds it in L2
(as in the chain); and the kernels of one draft in launch order (profiler).
The floor of a draft is the bytes it must read
(draft weights once per forward, each request's prefix KV once per forward) over the measured copy
bandwidth (read + write bytes of a large copy). Writes ``<date>-<gpu>-drafter.json`` and ``.md``.

With ``--extend`` the rows are the lean draft extend after a chain's verify of ``n`` draft tokens
(``FusedDrafter.draft_extend``: the K / V of all ``n`` rows into the pool, the layer and LM head of each request's
last accepted row) in a CUDA graph, beside the layer and LM head over every row (``extend_step`` on all ``bs n``
rows at their positions: the GPU work SGLang's draft extend does, with our kernels), against the floor of the
draft weights and each request's prefix KV read once. Writes ``<date>-<gpu>-drafter-extend.json`` / ``.md``.

With ``--tp N`` every row runs rank 0's part of a draft at ``--tp N`` (``testing.draft_shard``: SGLang's shards
of the weights and KV heads) with the collectives replaced by local stand-ins (the all-reduce returns its input, the
all-gather stacks N copies of it, so that the LM head's merge does a real merge's work): the GPU work of one rank
without the link and without the other ranks' skew, against the shard's floor. Per-op rows take the shard's
weights, the LM head as :func:`lm_head_topk_shard` + :func:`merge_shards`. Writes ``...-drafter-tp<N>.*``.
"""

from __future__ import annotations

import datetime
import json

import torch
import torch.nn.functional as F
import triton

from bench.kernels import gpu_run_setup
from sgl_eagle_triton.devtools.testing import draft_shard, random_batch, random_draft
from sgl_eagle_triton.drafter import FusedDrafter, TensorParallel
from sgl_eagle_triton.kernels.device import CUBLAS_MIN_ROWS
from sgl_eagle_triton.kernels.linear import epilogue, linear
from sgl_eagle_triton.kernels.lm_head_topk import lm_head_topk, lm_head_topk_shard, merge_shards

DIMS = dict(H=4096, Hq=32, Hkv=8, D=128, inter=14336, vocab=128256, draft_vocab=32000)
CONFIGS = [(5, 8, 32), (3, 1, 4), (8, 8, 64)]  # (steps, topk, draft tokens)
BATCHES = [1, 8, 32]
PREFIX = 1024
KV_FORMATS = [(None, 1), (None, 16), (torch.float8_e4m3fn, 1), (torch.float8_e4m3fn, 16)]  # (FP8 pool or None, page)
COLD_BYTES = 256 << 20  # per-op rows stream this many weight bytes per repetition (5x an H100's L2)


def graph_us(fn) -> float:
    with torch.cuda.stream(torch.cuda.Stream()):
        return triton.testing.do_bench_cudagraph(fn, rep=200, return_mode="median") * 1e3


def weight_bytes(w) -> int:
    return sum(t.numel() * t.element_size() for t in (w.qkv, w.o_proj, w.gate_up, w.down, w.lm_head))


def local_rank(size: int, embed_shard: tuple, lm_head_shard: tuple) -> TensorParallel:
    """Rank 0 of ``size`` with local stand-ins for the collectives: the all-reduce returns its input, the all-gather
    stacks ``size`` copies (every later kernel, the LM head's merge included, does a real rank's work)."""
    return TensorParallel(size, 0, all_reduce=lambda t: t,
                          all_gather=lambda t: t.unsqueeze(0).expand(size, *t.shape).contiguous(),
                          embed_shard=embed_shard, lm_head_shard=lm_head_shard)


def rank_weights(w, tp: int):
    """``(weights, TensorParallel or None, KV heads)`` of rank 0 at ``tp`` ranks (the whole draft at 1): the
    ``rank`` argument of the functions below (None: the whole draft)."""
    if tp == 1:
        return w, None, slice(None)
    local, embed_shard, head_shard, heads = draft_shard(w, 0, tp)
    return local, local_rank(tp, embed_shard, head_shard), heads


def tp_size(rank) -> int:
    return 1 if rank is None or rank[1] is None else rank[1].size


def draft_once(w, steps, topk, n, bs, kv_dtype=None, page_size=1, rank=None):
    """A repeatable draft of a random batch (``bs`` requests, ``PREFIX``-token prefixes in a pool of
    ``page_size``-slot pages, FP8 when ``kv_dtype`` is given, with scales 0.5 / 0.25): a function that runs
    ``FusedDrafter.draft`` (``rank``'s, :func:`rank_weights`, on its KV heads) and puts the positions it advanced
    back."""
    scales = (0.5, 0.25) if kv_dtype is not None else (1.0, 1.0)
    b = random_batch(w, bs, topk, steps, [PREFIX] * bs, torch.Generator().manual_seed(bs), "cuda",
                     kv_dtype=kv_dtype, kv_scales=scales, page_size=page_size)
    local, parallel, heads = rank or rank_weights(w, 1)
    drafter = FusedDrafter(local, topk, steps, n, b["k_cache"][:, heads].contiguous(),
                           b["v_cache"][:, heads].contiguous(), b["req_to_token"], *scales, tp=parallel)

    def run():
        drafter.draft(b["topk_p"], b["topk_index"], b["hidden"], b["positions"], b["seq_lens"], b["req_pool_indices"])
        b["positions"].sub_(steps - 1)

    return run


def bench_draft(w, steps, topk, n, bs, bandwidth, kv_dtype=None, page_size=1, rank=None):
    t = graph_us(draft_once(w, steps, topk, n, bs, kv_dtype, page_size, rank))
    local = (rank or rank_weights(w, 1))[0]
    forwards = steps - 1
    kv_item = 2 if kv_dtype is None else 1
    kv_bytes = bs * PREFIX * local.num_kv_heads * local.head_dim * 2 * kv_item  # each request's prefix K and V
    floor = forwards * (weight_bytes(local) + kv_bytes) / bandwidth * 1e6
    return dict(op="draft (whole cycle)", impl="triton (ours)", steps=steps, topk=topk, draft_tokens=n, batch=bs,
                kv_cache_dtype=kv_name(kv_dtype), page_size=page_size, tp=tp_size(rank),
                graph_us=t, floor_us=floor, over_floor=t / floor if floor else None)


EXTEND_TOKENS = [2, 4, 8]  # the draft tokens of the chains the lean extend serves (the cost policy's 1, 3, 7 steps)


def extend_once(w, n, bs, every_row=False, device="cuda"):
    """A repeatable lean draft extend of a random batch (``bs`` requests of ``PREFIX``-token prefixes, ``n`` verified
    rows each, random accept lengths): ``FusedDrafter.draft_extend``, or with ``every_row`` the layer and LM head
    over all ``bs n`` rows (``extend_step`` with one row per position)."""
    gen = torch.Generator().manual_seed(bs * 100 + n)
    b = random_batch(w, bs, 1, n, [PREFIX] * bs, gen, device)
    drafter = FusedDrafter(w, 1, 1, n, b["k_cache"], b["v_cache"], b["req_to_token"])
    ids = torch.randint(0, w.embed.shape[0], (bs, n), generator=gen).to(device)
    hidden = torch.randn(bs, n, w.hidden_size, generator=gen).to(w.dtype).to(device)
    accept = torch.randint(1, n + 1, (bs,), generator=gen).to(device)
    positions = b["seq_lens"][:, None] + torch.arange(n, device=device)
    slots = b["req_to_token"][b["req_pool_indices"][:, None], positions].long().reshape(-1)

    def store(k, v):
        b["k_cache"][slots], b["v_cache"][slots] = k, v

    if every_row:
        rows = b["req_pool_indices"].repeat_interleave(n)
        return lambda: drafter.extend_step(ids.reshape(-1), hidden.reshape(bs * n, -1), positions.reshape(-1), rows, 1)
    return lambda: drafter.draft_extend(ids, hidden, b["seq_lens"], accept, b["req_pool_indices"], store, 1)


def bench_extend(w, n, bs, bandwidth) -> dict:
    kv_bytes = bs * PREFIX * w.num_kv_heads * w.head_dim * 2 * 2  # each request's prefix K and V, bf16
    floor = (weight_bytes(w) + kv_bytes) / bandwidth * 1e6
    ours, every_row = graph_us(extend_once(w, n, bs)), graph_us(extend_once(w, n, bs, every_row=True))
    return dict(op="lean draft extend", impl="triton (ours)", draft_tokens=n, batch=bs, graph_us=ours,
                every_row_us=every_row, floor_us=floor, over_floor=ours / floor)


def extend_markdown(rows, gpu, bandwidth) -> str:
    lines = [f"# Lean draft extend on {gpu} (Llama-3.1-8B EAGLE-3 draft shapes, {PREFIX}-token prefixes)", "",
             f"Copy bandwidth {bandwidth / 1e12:.2f} TB/s. Device time in a CUDA graph, us (median). Floor: the draft "
             "weights and each request's prefix KV read once. Every row: the layer and LM head over all n rows "
             "(SGLang's extend's GPU work, our kernels).", "",
             "| n | batch | lean us | every row us | floor us | lean / floor | lean / every row |",
             "|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['draft_tokens']} | {r['batch']} | {r['graph_us']:.0f} | {r['every_row_us']:.0f} | "
                     f"{r['floor_us']:.0f} | {r['over_floor']:.2f} | {r['graph_us'] / r['every_row_us']:.2f} |")
    return "\n".join(lines) + "\n"


def kv_name(kv_dtype) -> str:
    return "bf16" if kv_dtype is None else {torch.float8_e4m3fn: "fp8_e4m3", torch.float8_e5m2: "fp8_e5m2"}[kv_dtype]


def bench_kv_formats(w, bandwidth) -> list[dict]:
    """Whole-draft rows per KV format and page size: every format timed twice, in ``KV_FORMATS`` order and then
    reversed, the row keeping the mean (and both timings)."""
    cases = [(cfg, bs, kv) for cfg in CONFIGS for bs in BATCHES for kv in KV_FORMATS]
    timings: dict = {}
    for order in (cases, cases[::-1]):
        for cfg, bs, (kv_dtype, page) in order:
            row = bench_draft(w, *cfg, bs, bandwidth, kv_dtype, page)
            timings.setdefault((cfg, bs, kv_dtype, page), []).append(row)
            print(row, flush=True)
    rows = []
    for first, second in timings.values():
        t = (first["graph_us"] + second["graph_us"]) / 2
        rows.append({**first, "graph_us": t, "runs_us": [first["graph_us"], second["graph_us"]],
                     "over_floor": t / first["floor_us"]})
    return rows


def kv_markdown(rows, gpu, bandwidth) -> str:
    base = {(r["steps"], r["topk"], r["draft_tokens"], r["batch"]): r["graph_us"] for r in rows
            if r["kv_cache_dtype"] == "bf16" and r["page_size"] == 1}
    lines = [f"# Fused drafter per KV format on {gpu} (Llama-3.1-8B EAGLE-3 draft shapes, {PREFIX}-token prefixes)",
             "", f"Copy bandwidth {bandwidth / 1e12:.2f} TB/s. Whole draft of one cycle in a CUDA graph, us (mean of "
             "two timings, formats run forward then reversed). FP8 pools: scales 0.5 / 0.25; floor counts 1-byte KV.",
             "", "| steps,topk,n | batch | KV | page | ours us | floor us | ours / floor | vs bf16 page 1 |",
             "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        cfg = (r["steps"], r["topk"], r["draft_tokens"], r["batch"])
        lines.append(f"| {r['steps']},{r['topk']},{r['draft_tokens']} | {r['batch']} | {r['kv_cache_dtype']} | "
                     f"{r['page_size']} | {r['graph_us']:.0f} | {r['floor_us']:.0f} | {r['over_floor']:.2f} | "
                     f"{r['graph_us'] / base[cfg]:.3f} |")
    return "\n".join(lines) + "\n"


def chain_kernels(w, steps, topk, n, bs, rank=None) -> list[dict]:
    """Device time of every kernel of one draft, in launch order (torch profiler over one eager draft after a
    warm-up): the ops as they run in the chain, to set beside the isolated per-op rows."""
    run = draft_once(w, steps, topk, n, bs, rank=rank)
    run()
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        run()
        torch.cuda.synchronize()
    kernels = sorted((e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA),
                     key=lambda e: e.time_range.start)
    return [dict(kernel=e.name, us=e.device_time) for e in kernels]


def op_cases(w, rows_n, rank=None, device="cuda") -> dict:
    """``{op: (ours(weight), cuBLAS + torch(weight), weight)}`` for ``rows_n`` rows of random inputs (``rank``'s
    shards, :func:`rank_weights`: the LM head as :func:`lm_head_topk_shard` + :func:`merge_shards` of ``tp`` copies
    against cuBLAS over the shard + softmax + top-8, the part of stock's LM head before its gather)."""
    w, parallel, _ = rank or rank_weights(w, 1)
    H = w.hidden_size
    x2 = torch.randn(rows_n, 2 * H, device=device, dtype=torch.bfloat16)
    x = torch.randn(rows_n, H, device=device, dtype=torch.bfloat16)
    xo = torch.randn(rows_n, w.o_proj.shape[1], device=device, dtype=torch.bfloat16)  # attention out (this rank's)
    x_sum = torch.randn(rows_n, H, device=device, dtype=torch.float32)  # the chain's fp32 residual sum
    act = torch.randn(rows_n, w.down.shape[1], device=device, dtype=torch.bfloat16)
    res = torch.randn(rows_n, H, device=device, dtype=torch.bfloat16)
    out = {name: torch.empty(rows_n, n, device=device, dtype=torch.bfloat16)
           for name, n in (("qkv", w.qkv.shape[0]), ("h", H), ("act", w.gate_up.shape[0] // 2))}
    def norm(v):  # SGLang's post-attention RMSNorm of the fp32 residual sum, in torch
        return F.rms_norm(v, (H,), w.post_norm.float(), 1e-5).bfloat16()

    cases = {  # op: (ours(weight), cuBLAS(weight), weight)
        "qkv": (lambda wt: linear(x2, wt, out["qkv"]), lambda wt: F.linear(x2, wt), w.qkv),
        "o_proj + residual": (lambda wt: linear(xo, wt, out["h"], residual=res, out_sum=x_sum),
                              lambda wt: F.linear(xo, wt) + res, w.o_proj),
        "gate_up + silu_mul": (lambda wt: linear(x_sum, wt, out["act"], norm_weight=w.post_norm, eps=1e-5,
                                                 silu_mul=True),
                               lambda wt: F.silu((g := F.linear(norm(x_sum), wt)).chunk(2, -1)[0]) * g.chunk(2, -1)[1],
                               w.gate_up),
        "down + residual": (lambda wt: linear(act, wt, out["h"], residual=res),
                            lambda wt: F.linear(act, wt) + res, w.down),
        "lm_head + softmax + top-8": (
            lambda wt: lm_head_topk(x, wt, 8, norm_weight=w.final_norm, eps=1e-5, token_map=w.token_map),
            lambda wt: torch.softmax(F.linear(x, wt).float(), -1).topk(8), w.lm_head),
    }
    if parallel is not None:
        offset, valid = parallel.lm_head_shard

        def shard_head(wt):
            keys, sums = lm_head_topk_shard(x, wt, 8, norm_weight=w.final_norm, eps=1e-5, vocab_offset=offset,
                                            valid=valid)
            return merge_shards(parallel.all_gather(keys), parallel.all_gather(sums), wt.shape[0], 8,
                                token_map=w.token_map)

        cases["lm_head + softmax + top-8"] = (shard_head, cases["lm_head + softmax + top-8"][1], w.lm_head)
        # row-parallel: the rank's product alone, its residual epilogue after the (here absent) all-reduce, as
        # drafter._row_parallel runs them
        cases["o_proj + residual"] = (lambda wt: epilogue(linear(xo, wt, out["h"]), out["h"], residual=res,
                                                          out_sum=x_sum), *cases["o_proj + residual"][1:])
        cases["down + residual"] = (lambda wt: epilogue(linear(act, wt, out["h"]), out["h"], residual=res),
                                    *cases["down + residual"][1:])
    return cases


def bench_ops(w, rows_n, bandwidth, rank=None):
    """Per-op rows for ``rows_n = bs * topk`` rows (:func:`op_cases`): ours vs cuBLAS, device time in a CUDA graph."""
    cases = op_cases(w, rows_n, rank)
    ours_impl = "triton (ours)" if rows_n < CUBLAS_MIN_ROWS else "ours (cuBLAS GEMM + Triton norm / epilogue / top-k)"
    rows = []
    for op, (ours, cublas, weight) in cases.items():
        nbytes = weight.numel() * weight.element_size()
        # Cycle through copies of the weight, COLD_BYTES in all: a weight re-read from L2 (o_proj's 33.5 MB
        # fits an H100's 50 MB) would beat HBM; in the chain every weight comes from HBM.
        copies = [weight] + [weight.clone() for _ in range(triton.cdiv(COLD_BYTES, nbytes) - 1)]
        floor = nbytes / bandwidth * 1e6
        for impl, fn in ((ours_impl, ours), ("cuBLAS + torch", cublas)):
            def run_all(fn=fn, copies=copies):
                return [fn(wt) for wt in copies]

            t = graph_us(run_all) / len(copies)
            rows.append(dict(op=op, impl=impl, rows=rows_n, tp=tp_size(rank), graph_us=t, floor_us=floor,
                             over_floor=t / floor))
        del copies
    return rows


def markdown(draft_rows, op_rows, gpu, bandwidth, chain=None, tp=1) -> str:
    lines = [
        f"# Fused drafter on {gpu} (Llama-3.1-8B EAGLE-3 draft shapes, {PREFIX}-token prefixes)",
        "",
        *([f"Rank 0 of `--tp {tp}`: its shards of the weights and KV heads, the collectives replaced by local "
           "stand-ins (no link, no other ranks): one rank's GPU work; floors count the shard's bytes.", ""]
          if tp > 1 else []),
        f"Copy bandwidth {bandwidth / 1e12:.2f} TB/s (read + write). Device times in a CUDA graph, microseconds,",
        "median. Floor: draft weights (+ prefix KV) read once per draft forward at that bandwidth.",
        "",
        "| draft (whole cycle) | batch | ours us | floor us | ours / floor |",
        "|---|---|---|---|---|",
    ]
    for r in draft_rows:
        lines.append(f"| {r['steps']},{r['topk']},{r['draft_tokens']} | {r['batch']} | {r['graph_us']:.0f} | "
                     f"{r['floor_us']:.0f} | {r['over_floor']:.2f} |")
    lines += ["", f"Per op, ours = Triton below {CUBLAS_MIN_ROWS} rows, from there a cuBLAS GEMM between our Triton "
              "RMSNorm and epilogue / top-k kernels." + (" Row-parallel o_proj and down: the rank's product, then "
              "the residual epilogue (a second launch, after the all-reduce when served)." if tp > 1 else ""), "",
              "| op | rows | ours us | cuBLAS + torch us | floor us | ours / floor | ours / cuBLAS |",
              "|---|---|---|---|---|---|---|"]
    for ours, ref in zip(op_rows[::2], op_rows[1::2], strict=True):
        lines.append(f"| {ours['op']} | {ours['rows']} | {ours['graph_us']:.1f} | {ref['graph_us']:.1f} | "
                     f"{ours['floor_us']:.1f} | {ours['over_floor']:.2f} | {ours['graph_us'] / ref['graph_us']:.2f} |")
    for case, kernels in (chain or {}).items():
        totals: dict = {}  # kernel -> [launches, us], in first-launch order
        for k in kernels:
            entry = totals.setdefault(k["kernel"], [0, 0.0])
            entry[0] += 1
            entry[1] += k["us"]
        lines += ["", f"Kernels of one draft at {case} (eager, profiler device time): "
                  + ", ".join(f"{name} {n}x {us:.1f} us" for name, (n, us) in totals.items())]
    return "\n".join(lines) + "\n"


def write_results(out_dir, gpu: str, suffix: str, payload: dict, table: str) -> None:
    """``<date>-<gpu>-drafter<suffix>.json`` (``payload``) and ``.md`` (``table``, also printed) in ``out_dir``."""
    stamp = f"{datetime.date.today()}-{gpu.replace(' ', '_')}-drafter{suffix}"
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / f"{stamp}.json").write_text(json.dumps(payload, indent=1))
    (out_dir / f"{stamp}.md").write_text(table)
    print(table)


def main():
    out_dir, gpu, bandwidth, args = gpu_run_setup(__doc__, ("--kv-formats", "--extend"), {"--tp": 1})
    if (args.kv_formats or args.extend) and args.tp > 1:
        raise SystemExit("bench.drafter: --kv-formats and --extend run on one GPU; leave out --tp")
    w, _ = random_draft(True, "cuda", **DIMS)
    if args.extend:
        rows = []
        for n in EXTEND_TOKENS:
            for bs in BATCHES:
                rows.append(bench_extend(w, n, bs, bandwidth))
                print(rows[-1], flush=True)
        write_results(out_dir, gpu, "-extend", dict(gpu=gpu, bandwidth=bandwidth, extend=rows),
                      extend_markdown(rows, gpu, bandwidth))
        return
    if args.kv_formats:
        rows = bench_kv_formats(w, bandwidth)
        write_results(out_dir, gpu, "-kv", dict(gpu=gpu, bandwidth=bandwidth, draft=rows),
                      kv_markdown(rows, gpu, bandwidth))
        return
    tp = args.tp
    rank = rank_weights(w, tp)  # rank 0's shards, made once
    draft_rows = []
    for steps, topk, n in CONFIGS:
        for bs in BATCHES:
            draft_rows.append(bench_draft(w, steps, topk, n, bs, bandwidth, rank=rank))
            print(draft_rows[-1], flush=True)
    stamp = f"{datetime.date.today()}-{gpu.replace(' ', '_')}-drafter" + (f"-tp{tp}" if tp > 1 else "")
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / f"{stamp}.json").write_text(json.dumps(dict(gpu=gpu, bandwidth=bandwidth, draft=draft_rows, tp=tp),
                                                      indent=1))  # kept if a later part fails
    chain = {f"{','.join(map(str, cfg))}, batch {bs}": chain_kernels(w, *cfg, bs, rank)
             for cfg in (CONFIGS[:2] if tp > 1 else CONFIGS[:1]) for bs in (1, 32)}
    op_rows = [r for rows_n in (1, 8, 64, 256) for r in bench_ops(w, rows_n, bandwidth, rank)]
    for r in op_rows:
        r["gpu"] = gpu
    (out_dir / f"{stamp}.json").write_text(json.dumps(dict(gpu=gpu, bandwidth=bandwidth, draft=draft_rows,
                                                           ops=op_rows, chain=chain, tp=tp), indent=1))
    (out_dir / f"{stamp}.md").write_text(markdown(draft_rows, op_rows, gpu, bandwidth, chain, tp))
    print(markdown(draft_rows, op_rows, gpu, bandwidth, chain, tp))


if __name__ == "__main__":
    main()
