"""Accuracy of the target verify's attention: ours against SGLang's kernels, each against an fp64 reference.

    python -m bench.verify_accuracy kernels [--out bench/results] [--quick]      (GPU; --quick: a CPU smoke grid)
    python -m bench.verify_accuracy e2e --pair NAME=DIR [--pair ...] [--prompts 240] [--out bench/results]

``kernels``: the attention output's error against the same computation in fp64 on the same rounded inputs (the
exact answer the bf16 / fp16 kernels approximate), max abs and mean abs over every output element, for

- ``ours``: :func:`sgl_eagle_triton.kernels.verify_attention.verify_attention` as served (``splits auto``: the
  launcher's choice at this batch; ``splits 1``: one pass, as under deterministic inference);
- ``sglang_extend``: SGLang's ``extend_attention_fwd`` with the tree mask (what stock EAGLE's verify runs on the
  triton backend);
- ``sglang_decode``: SGLang's ``decode_attention_fwd`` (what a decode step without speculation runs), each draft token
  its own decode request over its prefix and its tree ancestors (the draft tokens' K / V written into the pool), KV
  split into 8 stretches or 1.

over head_dim 64 / 128, GQA 1 / 4 / 8, prefixes 16 ... 8192, a chain (topk 1, 4 draft tokens) and a random tree of
32, bf16 and fp16, scores of standard deviation 1 (flat attention) and 4 (peaked). Three seeds a point; the rows
keep the max of the max errors and the mean of the mean errors.

``e2e``: acceptance length (completion tokens / verify steps, summed over prompts) of EAGLE_TRITON with our verify
attention on and off (``SGLANG_EAGLE_TRITON_VERIFY_ATTENTION=1`` / ``0``: SGLang's kernel), greedy, deterministic
inference, on each trained pair, two tree shapes, ``--prompts`` code prompts cut from the Python standard library's
sources (the same for every server). Writes ``<date>-<gpu>-verify-attention-accuracy.json`` / ``.md`` (``kernels``
and ``e2e`` rows in one file: a second run merges into it).
"""

from __future__ import annotations

import argparse
import datetime
import functools
import json
import math
import sys
from pathlib import Path

import torch
import triton

from sgl_eagle_triton.devtools.reference.verify_attention import verify_attention as verify_attention_ref
from sgl_eagle_triton.devtools.testing import random_tree_mask
from sgl_eagle_triton.kernels.verify_attention import verify_attention

DIMS = (64, 128)
GROUPS = (1, 4, 8)
PREFIXES = (16, 128, 1024, 8192)
SHAPES = {"chain": 4, "tree": 32}  # draft tokens: topk 1 (3 steps), a random tree of 32
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}
SCORE_STDS = (1.0, 4.0)
SEEDS = (0, 1, 2)
BS, KV_HEADS = 4, 2
MAX_KV_SPLITS = 8


def make_inputs(dim, group, prefix, n, dtype, score_std, seed, device, chain):
    """``BS`` requests of ``prefix`` tokens (pool slots shuffled) and ``n`` draft tokens each (a chain, or one random
    tree per request), ``KV_HEADS`` kv heads x ``group`` query heads; q scaled so that the scores' standard
    deviation is ``score_std``. Returns the launcher's keyword arguments (tensors on ``device``) and the [n, n] tree
    rows per request."""
    gen = torch.Generator().manual_seed(seed)
    hq, total = KV_HEADS * group, BS * prefix
    slots = total + 7
    q = (torch.randn(BS * n, hq, dim, generator=gen) * score_std).to(dtype)
    k_ext, v_ext = (torch.randn(BS * n, KV_HEADS, dim, generator=gen).to(dtype) for _ in range(2))
    k_buf, v_buf = (torch.randn(slots, KV_HEADS, dim, generator=gen).to(dtype) for _ in range(2))
    kv_indices = torch.randperm(slots, generator=gen)[:total]
    trees = [torch.ones(n, n, dtype=torch.bool).tril() if chain else random_tree_mask(n, gen) for _ in range(BS)]
    rows = [torch.cat([torch.ones(n, prefix, dtype=torch.bool), t], dim=1).flatten() for t in trees]
    mask_indptr = torch.tensor([0] + [r.numel() for r in rows]).cumsum(0)
    args = dict(q=q, k_extend=k_ext, v_extend=v_ext, k_buffer=k_buf, v_buffer=v_buf,
                qo_indptr=torch.arange(BS + 1) * n, kv_indptr=torch.arange(BS + 1) * prefix, kv_indices=kv_indices,
                custom_mask=torch.cat(rows).to(torch.uint8), mask_indptr=mask_indptr, max_len_extend=n,
                sm_scale=dim ** -0.5)
    args = {k: v.to(device, torch.int32 if k.endswith("indptr") or k == "kv_indices" else v.dtype)
            if isinstance(v, torch.Tensor) else v for k, v in args.items()}
    return args, trees


def call(impl, args, o, **extra):
    """``impl`` (our launcher or its twin: the same arguments) on ``args`` (:func:`make_inputs`) into ``o``."""
    return impl(args["q"], args["k_extend"], args["v_extend"], o, args["k_buffer"], args["v_buffer"],
                args["qo_indptr"], args["kv_indptr"], args["kv_indices"], args["custom_mask"], args["mask_indptr"],
                args["max_len_extend"], args["sm_scale"], **extra)


def exact(args) -> torch.Tensor:
    """The attention in fp64 on the inputs' values (the kernel's twin in fp64): [T, Hq, D] float64."""
    return call(verify_attention_ref, args, torch.empty(args["q"].shape, dtype=torch.float64, device=args["q"].device),
                dtype=torch.float64)


def run_ours(args, **extra):
    """Ours as served (``extra``: the launcher's ``num_splits`` / ``split_tokens``)."""
    return call(verify_attention, args, torch.empty_like(args["q"]), **extra)


def run_sglang_extend(args):
    from sglang.kernels.ops.attention.extend_attention import extend_attention_fwd

    o = torch.empty_like(args["q"])
    extend_attention_fwd(args["q"], args["k_extend"], args["v_extend"], o, args["k_buffer"], args["v_buffer"],
                         args["qo_indptr"], args["kv_indptr"], args["kv_indices"], args["custom_mask"], True,
                         args["mask_indptr"], args["max_len_extend"], 1.0, 1.0, sm_scale=args["sm_scale"])
    return o


def run_sglang_decode(args, trees, splits):
    """Each draft token as one decode request over its prefix and the draft tokens its tree row allows."""
    from sglang.kernels.ops.attention.decode_attention import decode_attention_fwd

    q, n = args["q"], args["max_len_extend"]
    slots = args["k_buffer"].shape[0]
    k_buf = torch.cat([args["k_buffer"], args["k_extend"]])  # draft token t at pool slot slots + t
    v_buf = torch.cat([args["v_buffer"], args["v_extend"]])
    indices, lens = [], []
    for b, tree in enumerate(trees):
        prefix = args["kv_indices"][args["kv_indptr"][b]:args["kv_indptr"][b + 1]]
        for i in range(n):
            own = torch.nonzero(tree[i]).flatten().to(q.device, torch.int32) + slots + b * n
            indices.append(torch.cat([prefix, own]))
            lens.append(indices[-1].numel())
    kv_indptr = torch.tensor([0] + lens, device=q.device).cumsum(0).to(torch.int32)
    tokens, heads, dim = q.shape
    o = torch.empty_like(q)
    logits = torch.empty(tokens, heads, MAX_KV_SPLITS, dim, dtype=torch.float32, device=q.device)
    lse = torch.empty(tokens, heads, MAX_KV_SPLITS, dtype=torch.float32, device=q.device)
    num_splits = torch.full((tokens,), splits, dtype=torch.int32, device=q.device)
    decode_attention_fwd(q, k_buf, v_buf, o, kv_indptr, torch.cat(indices), logits, lse, num_splits, MAX_KV_SPLITS,
                         args["sm_scale"], 1.0, 1.0)
    return o


def errors(got: torch.Tensor, want: torch.Tensor) -> tuple[float, float]:
    diff = (got.double() - want).abs()
    return diff.max().item(), diff.mean().item()


def systems(on_gpu: bool):
    """name -> fn(args, trees): the systems of one grid point (SGLang's kernels on a GPU only: the interpreter
    cannot run them)."""
    out = {
        "ours splits auto": lambda a, t: run_ours(a),
        "ours splits 1": lambda a, t: run_ours(a, num_splits=1),
    }
    if on_gpu:
        out.update({
            "sglang_extend": lambda a, t: run_sglang_extend(a),
            "sglang_decode splits 8": lambda a, t: run_sglang_decode(a, t, MAX_KV_SPLITS),
            "sglang_decode splits 1": lambda a, t: run_sglang_decode(a, t, 1),
        })
    return out


def grid(quick: bool):
    if quick:  # a CPU smoke run: every system and shape once, small
        return [(64, 4, 16, "tree", "bf16", 1.0), (64, 1, 1024, "chain", "fp16", 4.0)]
    return [(d, g, p, s, t, sd) for d in DIMS for g in GROUPS for p in PREFIXES for s in SHAPES for t in DTYPES
            for sd in SCORE_STDS]


def kernel_rows(device: torch.device, quick: bool) -> list[dict]:
    rows = []
    impls = systems(device.type == "cuda")
    seeds = SEEDS[:1] if quick else SEEDS
    try:
        for point in grid(quick):
            rows += _point_rows(impls, seeds, device, *point)
    except KeyboardInterrupt:  # (timeout -s INT: keep the points done)
        print(f"interrupted after {len(rows) // len(impls)} points", flush=True)
    return rows


def _point_rows(impls, seeds, device, dim, group, prefix, shape, dtype_name, score_std) -> list[dict]:
    """One grid point: every system's worst max error and mean mean error over ``seeds``."""
    stats = {name: [] for name in impls}
    for seed in seeds:
        args, trees = make_inputs(dim, group, prefix, SHAPES[shape], DTYPES[dtype_name], score_std, seed, device,
                                  shape == "chain")
        want = exact(args)
        for name, fn in impls.items():
            stats[name].append(errors(fn(args, trees), want))
    point = dict(head_dim=dim, gqa=group, prefix=prefix, shape=shape, dtype=dtype_name, score_std=score_std)
    print(point, {name: f"{max(e[0] for e in errs):.2e}/{sum(e[1] for e in errs) / len(errs):.2e}"
                  for name, errs in stats.items()}, flush=True)
    return [dict(kind="kernel", **point, system=name, max_abs=max(e[0] for e in errs),
                 mean_abs=sum(e[1] for e in errs) / len(errs)) for name, errs in stats.items()]


# --- end to end --------------------------------------------------------------------------------------------------

E2E_SHAPES = ((2, 1, 3), (6, 4, 16))


def code_prompts(count: int, chars: int = 600) -> list[str]:
    """``count`` prompts: the start of the Python standard library's modules, sorted by path (the same list on any
    host with the same Python)."""
    import sysconfig

    root = Path(sysconfig.get_paths()["stdlib"])
    prompts = []
    for path in sorted(root.glob("*.py")) + sorted(root.glob("*/*.py")):
        try:
            text = path.read_text(encoding="utf-8")
        except (UnicodeDecodeError, OSError):
            continue
        if len(text) >= chars:
            prompts.append(text[:chars])
        if len(prompts) == count:
            break
    return prompts


def e2e_rows(pairs: dict[str, str], prompts: int, max_new_tokens: int, workdir: Path) -> list[dict]:
    from concurrent.futures import ThreadPoolExecutor

    from bench.interleave import SHARED_GPU_FLAGS
    from sgl_eagle_triton.devtools.launcher import Server
    from sgl_eagle_triton.glue.versions import cuda_graph_max_bs_flag

    texts = code_prompts(prompts)
    servers = {}
    for pair, path in pairs.items():
        for steps, topk, n in E2E_SHAPES:
            for on in ("1", "0"):
                args = ["--speculative-algorithm", "EAGLE_TRITON", "--speculative-draft-model-path", f"{path}/eagle3",
                        "--speculative-num-steps", str(steps), "--speculative-eagle-topk", str(topk),
                        "--speculative-num-draft-tokens", str(n), "--attention-backend", "triton",
                        "--enable-deterministic-inference", "--max-running-requests", "16",
                        cuda_graph_max_bs_flag(), "16", "--context-length", "2048", "--disable-radix-cache",
                        "--grammar-backend", "none",
                        *SHARED_GPU_FLAGS]
                name = f"{pair}-{steps}-{topk}-{n}-va{on}"
                servers[name] = (dict(pair=pair, steps=steps, topk=topk, draft_tokens=n,
                                      verify_attention="ours" if on == "1" else "sglang"),
                                 Server(name, f"{path}/target", args, workdir,
                                        env={"SGLANG_EAGLE_TRITON_VERIFY_ATTENTION": on}))
    rows = []
    try:
        for _, server in servers.values():
            server.wait_ready(900)
        for name, (meta, server) in servers.items():
            with ThreadPoolExecutor(16) as pool:
                outs = list(pool.map(functools.partial(server.generate, max_new_tokens=max_new_tokens), texts))
            tokens = sum(o["meta_info"]["completion_tokens"] for o in outs)
            verifies = sum(o["meta_info"]["spec_verify_ct"] for o in outs)
            rows.append(dict(kind="e2e", **meta, prompts=len(texts), max_new_tokens=max_new_tokens,
                             accept=tokens / verifies, outputs=[o["output_ids"] for o in outs]))
            print(name, f"accept {tokens / verifies:.4f}", flush=True)
    finally:
        for _, server in servers.values():
            server.stop()
    by_key = {(r["pair"], r["steps"], r["topk"]): {} for r in rows}
    for r in rows:
        by_key[(r["pair"], r["steps"], r["topk"])][r["verify_attention"]] = r
    for pair_rows in by_key.values():
        if len(pair_rows) == 2:
            ours, theirs = pair_rows["ours"], pair_rows["sglang"]
            same = sum(a == b for a, b in zip(ours["outputs"], theirs["outputs"], strict=True))
            for r in pair_rows.values():
                r["identical_outputs"] = same
            ours["accept_vs_sglang"] = ours["accept"] / theirs["accept"] - 1
    for r in rows:
        r.pop("outputs")
    return rows


# --- report ------------------------------------------------------------------------------------------------------

def summary(rows: list[dict]) -> list[str]:
    lines = []
    kernel = [r for r in rows if r["kind"] == "kernel"]
    if kernel:
        key = ("head_dim", "gqa", "prefix", "shape", "dtype", "score_std")
        points = {}
        for r in kernel:
            points.setdefault(tuple(r[k] for k in key), {})[r["system"]] = r
        names = list(next(iter(points.values())))
        lines += ["## Error against fp64 (max abs / mean abs, worst of three seeds / mean)", "",
                  "| " + " | ".join(key) + " | " + " | ".join(names) + " |",
                  "|" + "---|" * (len(key) + len(names))]
        for point, by in points.items():
            lines.append("| " + " | ".join(str(v) for v in point) + " | "
                         + " | ".join(f"{by[n]['max_abs']:.2e} / {by[n]['mean_abs']:.2e}" for n in names) + " |")
        lines += ["", "Ratios to SGLang's extend kernel over the grid (worst per-point ratio, geometric mean):", ""]
        if "sglang_extend" in names:
            for n in names:
                maxr = [by[n]["max_abs"] / by["sglang_extend"]["max_abs"] for by in points.values()]
                meanr = [by[n]["mean_abs"] / by["sglang_extend"]["mean_abs"] for by in points.values()]
                geo = math.exp(sum(map(math.log, meanr)) / len(meanr))
                lines.append(f"- {n}: max-error ratio worst {max(maxr):.3f}; mean-error ratio worst {max(meanr):.3f},"
                             f" geometric mean {geo:.3f}")
        lines.append("")
    e2e = [r for r in rows if r["kind"] == "e2e"]
    if e2e:
        lines += ["## End to end: acceptance length, our verify attention vs SGLang's (deterministic, greedy)", "",
                  "| pair | shape | verify attention | prompts | accept | vs SGLang's | identical outputs |",
                  "|---|---|---|---|---|---|---|"]
        lines += [f"| {r['pair']} | ({r['steps']},{r['topk']},{r['draft_tokens']}) | {r['verify_attention']} | "
                  f"{r['prompts']} | {r['accept']:.4f} | "
                  f"{'%+.2f %%' % (100 * r['accept_vs_sglang']) if 'accept_vs_sglang' in r else '-'} | "
                  f"{r.get('identical_outputs', '-')} |" for r in e2e]
    return lines


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("what", choices=("kernels", "e2e"))
    parser.add_argument("--out", type=Path, default=Path("bench/results"))
    parser.add_argument("--quick", action="store_true", help="kernels: a two-point smoke grid, one seed")
    parser.add_argument("--pair", action="append", default=[], help="e2e: NAME=DIR (DIR/target, DIR/eagle3)")
    parser.add_argument("--prompts", type=int, default=240)
    parser.add_argument("--max-new-tokens", type=int, default=96)
    parser.add_argument("--workdir", type=Path, default=Path("/tmp/verify-accuracy"))
    args = parser.parse_args(argv)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    gpu = torch.cuda.get_device_name() if device.type == "cuda" else "cpu"
    if args.what == "kernels":
        rows = kernel_rows(device, args.quick)
    else:
        rows = e2e_rows(dict(p.split("=", 1) for p in args.pair), args.prompts, args.max_new_tokens, args.workdir)
    stem = f"{datetime.date.today()}-{gpu.replace(' ', '_')}-verify-attention-accuracy"
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / f"{stem}.json"
    old = json.loads(path.read_text())["rows"] if path.exists() else []
    kinds = {r["kind"] for r in rows}
    rows = [r for r in old if r["kind"] not in kinds] + rows
    import sglang

    path.write_text(json.dumps(dict(gpu=gpu, sglang=sglang.__version__, torch=torch.__version__,
                                    triton=triton.__version__, rows=rows), indent=1))
    (args.out / f"{stem}.md").write_text("\n".join([f"# Verify attention accuracy on {gpu}, SGLang "
                                                    f"{sglang.__version__}", ""] + summary(rows)) + "\n")
    print("\n".join(summary(rows)))
    sys.stdout.flush()


if __name__ == "__main__":
    main()
