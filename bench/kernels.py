"""Micro-benchmarks: our Triton kernels vs sgl-kernel's CUDA ops and SGLang's serial Triton ports.

    python -m bench.kernels [--out bench/results] [--verify-attention-only | --embed-shard-only | --sampling-only]
                                                          (on a GPU with SGLang 0.5.17, from the repository root)

Each row times one implementation of one op, median of ``triton.testing.do_bench``: ``eager_us``
as served (a Python call with its launches and allocations), ``graph_us`` inside a CUDA graph
(device time). The floor is the op's unavoidable bytes over the measured copy bandwidth, and the
launch floor is an empty Triton kernel's eager time. Writes ``<date>-<gpu>-kernels.json`` and ``.md``.
"""

from __future__ import annotations

import argparse
import datetime
import json
from pathlib import Path

import torch
import triton

from sgl_eagle_triton import simulated_acceptance
from sgl_eagle_triton.devtools.reference.embed_shard import embed_shard as embed_shard_torch
from sgl_eagle_triton.devtools.testing import draft_tree, random_tree_mask
from sgl_eagle_triton.kernels import (
    build_tree,
    embed_shard,
    simulated_walk,
    target_probs,
    tree_sampling,
    verify_attention,
    verify_greedy,
)

CONFIGS = [(5, 1, 6), (5, 4, 16), (5, 8, 32), (8, 8, 64)]  # (steps, topk, draft tokens)
BATCHES = [1, 8, 32, 64]
TARGET_PROBS_BATCHES = [1, 8, 32]
TARGET_VOCAB = 128256  # Llama-3
MEAN_PREFIX, MAX_CONTEXT = 1024, 4096
LONG_PREFIX = 8192
LONG_CASES = [(3, 1, 4, bs) for bs in (1, 4, 16)] + [(5, 8, 32, bs) for bs in (1, 4, 16)]


@triton.jit
def _empty_kernel(x_ptr):
    pass


def copy_bandwidth() -> float:
    """Bytes per second of a large device-to-device copy, counting read + written bytes."""
    src = torch.empty(1 << 30, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    ms = triton.testing.do_bench(lambda: dst.copy_(src), warmup=50, rep=200, return_mode="median")
    return 2 * src.numel() / (ms * 1e-3)


def time_us(fn) -> tuple[float, float]:
    eager = triton.testing.do_bench(fn, warmup=25, rep=100, return_mode="median") * 1e3
    with torch.cuda.stream(torch.cuda.Stream()):
        graph = triton.testing.do_bench_cudagraph(fn, rep=100, return_mode="median") * 1e3
    return eager, graph


def tree_inputs(bs: int, steps: int, topk: int, n: int):
    gen = torch.Generator().manual_seed(bs * 1000 + n)
    parent_list, selected = draft_tree(bs, topk, steps, n, gen)
    seq_lens = torch.randint(MEAN_PREFIX // 2, MEAN_PREFIX * 3 // 2, (bs,), generator=gen)
    return parent_list.cuda(), selected.cuda(), seq_lens.cuda(), int(seq_lens.sum())


def verify_tree(bs: int, steps: int, topk: int, n: int, vocab: int):
    """Verify inputs from a build_tree output: ``(candidates [bs, n], retrieve_index, next_token,
    next_sibling)``, draft tokens drawn from ``vocab``."""
    parent_list, selected, seq_lens, seq_sum = tree_inputs(bs, steps, topk, n)
    bonus = torch.zeros(bs, dtype=torch.long, device="cuda")
    draft = torch.randint(0, vocab, (bs, n - 1), device="cuda")
    _, _, index, next_token, next_sibling, candidates = build_tree.build_tree_kernel_efficient(
        bonus, parent_list, selected, draft, seq_lens, seq_sum, topk, steps, n, 1
    )
    return candidates.view(bs, n), index, next_token, next_sibling


def verify_outputs(bs: int, n: int, steps: int):
    """Fresh ``(predicts, accept_index, accept_token_num)`` as SGLang pre-fills them."""
    return (torch.zeros(bs * n, dtype=torch.int32, device="cuda"),
            torch.full((bs, steps + 1), -1, dtype=torch.int32, device="cuda"),
            torch.zeros(bs, dtype=torch.int32, device="cuda"))


def bench_build_tree(bs, steps, topk, n):
    """The whole per-step build as SGLang's triton attention backend runs it: preallocated uint8
    FULL_MASK buffer sized for MAX_CONTEXT, prefix columns set True, retrieve arrays and positions."""
    from sglang.srt.speculative import eagle_utils

    parent_list, selected, seq_lens, seq_sum = tree_inputs(bs, steps, topk, n)
    bonus = torch.zeros(bs, dtype=torch.long, device="cuda")
    draft = torch.zeros(bs, n - 1, dtype=torch.long, device="cuda")
    buf = torch.zeros(bs * n * (MAX_CONTEXT + n), dtype=torch.uint8, device="cuda")
    args = (bonus, parent_list, selected, draft, seq_lens, seq_sum, topk, steps, n, 0, buf, True)
    touched = seq_sum * n + bs * n * n + 4 * bs * n * 8 + (parent_list.numel() + selected.numel()) * 8
    impls = {
        "triton (ours)": lambda: build_tree.build_tree_kernel_efficient(*args),
        "sgl-kernel CUDA (stock)": lambda: eagle_utils.build_tree_kernel_efficient(*args),
    }
    return {name: time_us(fn) for name, fn in impls.items()}, touched


def bench_verify(bs, steps, topk, n):
    """Greedy verify on a build_tree output, target argmax matching the draft along one branch."""
    from sgl_kernel import verify_tree_greedy as sgl_verify
    from sglang.srt.speculative.eagle_utils import verify_tree_greedy_triton

    candidates, index, next_token, next_sibling = verify_tree(bs, steps, topk, n, vocab=4)
    target = torch.randint(0, 4, (bs, n), device="cuda")
    outs = verify_outputs(bs, n, steps)
    ins = (candidates, index, next_token, next_sibling, target)
    impls = {
        "triton (ours)": lambda: verify_greedy.verify_tree_greedy(*outs, *ins),
        "sgl-kernel CUDA (stock)": lambda: sgl_verify(*outs, *ins),
        "SGLang serial triton": lambda: verify_tree_greedy_triton(*outs, *ins),
    }
    touched = 5 * bs * n * 8 + (bs * n + bs * (steps + 2)) * 4
    return {name: time_us(fn) for name, fn in impls.items()}, touched


def bench_simulated_walk(bs, steps, topk, n):
    """The benchmark-only simulated verification (sgl_eagle_triton.simulated_acceptance) on a build_tree output:
    the walk with the Llama-3.1-8B profile, coins drawn per call as the server draws them."""
    candidates, index, next_token, next_sibling = verify_tree(bs, steps, topk, n, vocab=1000)
    table = simulated_acceptance.cumulative_probs(**simulated_acceptance.PROFILES["llama31-8b-eagle3"]).cuda()
    outs = verify_outputs(bs, n, steps)

    def run():
        coins = torch.rand(bs, steps + 1, device="cuda")
        simulated_walk.simulated_walk(*outs, candidates, index, next_token, next_sibling, coins, table)

    touched = 4 * bs * n * 8 + (bs * n + bs * (steps + 2)) * 4 + bs * (steps + 1) * 4
    return {"triton (ours, benchmark-only)": time_us(run)}, touched


def bench_target_probs(bs, n, vocab=TARGET_VOCAB, scale=3.0):
    """Target distribution of sampled verification for bs * n rows, typical sampling parameters
    (T 0.7, top_k 20, top_p 0.9, min_p 0): ours (joint filters, one kernel) vs stock SGLang's sequence in
    eagle_sample (softmax of logits / T, then sgl-kernel top_k_renorm_prob, then top_p_renorm_prob, with
    per-row parameters by repeat_interleave). Logits N(0, scale**2): 3 a peaked row; 1e-4 the flat rows of a
    dummy-weight target (``--load-format dummy``, bench.serve), our search's worst case: every token stays inside
    the key bracket pass after pass."""
    from sgl_kernel import top_k_renorm_prob, top_p_renorm_prob

    gen = torch.Generator(device="cuda").manual_seed(bs * 1000 + n)
    logits = torch.randn(bs * n, vocab, device="cuda", generator=gen) * scale
    temperatures = torch.full((bs, 1), 0.7, device="cuda")
    top_ks = torch.full((bs,), 20, dtype=torch.int32, device="cuda")
    top_ps = torch.full((bs,), 0.9, device="cuda")
    min_ps = torch.zeros(bs, device="cuda")
    out = torch.empty_like(logits)

    def stock():
        probs = torch.softmax(logits / torch.repeat_interleave(temperatures, n, dim=0), dim=-1)
        probs = top_k_renorm_prob(probs, torch.repeat_interleave(top_ks, n, dim=0))
        return top_p_renorm_prob(probs, torch.repeat_interleave(top_ps, n, dim=0))

    impls = {
        "triton (ours)": lambda: target_probs.prepare_target_probs(
            logits, temperatures, top_ks, top_ps, min_ps, n, out=out),
        "sgl-kernel CUDA (stock)": stock,
    }
    touched = 2 * logits.numel() * 4  # logits read once, probabilities written once
    return {name: time_us(fn) for name, fn in impls.items()}, touched


def bench_tree_sampling(bs, steps, topk, n, vocab=TARGET_VOCAB):
    """Sampled tree verification given target probabilities [bs, n, V]: ours vs stock SGLang's
    per-step sequence (a zeroed dense draft_probs [bs, n, V], then sgl-kernel's
    tree_speculative_sampling_target_only)."""
    from sgl_kernel import tree_speculative_sampling_target_only

    candidates, index, next_token, next_sibling = verify_tree(bs, steps, topk, n, vocab)
    probs = torch.softmax(torch.randn(bs, n, vocab, device="cuda") * 3, dim=-1)
    coins, final_coins = torch.rand(bs, n, device="cuda"), torch.rand(bs, device="cuda")
    outs = verify_outputs(bs, n, steps)

    def stock():
        tree_speculative_sampling_target_only(
            predicts=outs[0], accept_index=outs[1], accept_token_num=outs[2], candidates=candidates,
            retrive_index=index, retrive_next_token=next_token, retrive_next_sibling=next_sibling,
            uniform_samples=coins, uniform_samples_for_final_sampling=final_coins, target_probs=probs,
            draft_probs=torch.zeros_like(probs), threshold_single=1.0, threshold_acc=1.0, deterministic=True)

    impls = {
        "triton (ours)": lambda: tree_sampling.tree_speculative_sampling(
            *outs, candidates, index, next_token, next_sibling, coins, final_coins, probs),
        "sgl-kernel CUDA (stock)": stock,
    }
    touched = 2 * bs * vocab * 4  # one probability row per request, read twice (sum, then scan)
    return {name: time_us(fn) for name, fn in impls.items()}, touched


def verify_attention_inputs(bs: int, n: int, chain: bool, prefix: int = MEAN_PREFIX, heads=(32, 8), dim=128):
    """A target verify's attention inputs at Llama-3.1-8B shapes on one GPU: ``bs`` requests of ``prefix`` tokens
    (pool slots shuffled) and ``n`` draft tokens in a random tree, or a ``chain`` (SGLang's FULL_MASK rows, prefix
    columns True)."""
    hq, hkv = heads
    gen = torch.Generator(device="cuda").manual_seed(0)
    slots = bs * (prefix + n) + 1
    pool = [torch.randn(slots, hkv, dim, device="cuda", dtype=torch.bfloat16, generator=gen) for _ in range(2)]
    extend = [torch.randn(bs * n, h, dim, device="cuda", dtype=torch.bfloat16, generator=gen) for h in (hq, hkv, hkv)]
    kv_indices = torch.randperm(slots - 1, device="cuda", generator=gen)[:bs * prefix] + 1
    kv_indptr = torch.arange(bs + 1, device="cuda", dtype=torch.int32) * prefix
    qo_indptr = torch.arange(bs + 1, device="cuda", dtype=torch.int32) * n
    tree = torch.ones(n, n, dtype=torch.bool).tril() if chain else random_tree_mask(n, torch.Generator().manual_seed(0))
    rows = torch.cat([torch.ones(n, prefix, dtype=torch.bool), tree], dim=1).to(torch.uint8).flatten()
    mask = rows.repeat(bs).cuda()
    mask_indptr = torch.arange(bs + 1, device="cuda", dtype=torch.int32) * rows.numel()
    q, k_ext, v_ext = extend
    return (q, k_ext, v_ext, torch.empty_like(q), *pool, qo_indptr, kv_indptr, kv_indices, mask, mask_indptr, n)


def bench_verify_attention(bs, steps, topk, n, prefix=MEAN_PREFIX, num_splits=None):
    """One layer of the target verify's attention, Llama-3.1-8B shapes, ``prefix`` tokens a request: ours (grouped
    per kv head; ``num_splits`` as the launcher takes it, None: its own choice) vs SGLang's two-stage extend kernel,
    which the triton backend runs there."""
    from sglang.kernels.ops.attention.extend_attention import extend_attention_fwd

    q, k_ext, v_ext, o, k_buf, v_buf, qo, kv, idx, mask, mask_indptr, n = verify_attention_inputs(bs, n, topk == 1,
                                                                                                  prefix)
    scale = q.shape[2] ** -0.5
    impls = {
        "triton (ours)": lambda: verify_attention.verify_attention(q, k_ext, v_ext, o, k_buf, v_buf, qo, kv, idx,
                                                                   mask, mask_indptr, n, scale,
                                                                   num_splits=num_splits),
        "SGLang extend triton (stock)": lambda: extend_attention_fwd(q, k_ext, v_ext, o, k_buf, v_buf, qo, kv, idx,
                                                                     mask, True, mask_indptr, n, 1.0, 1.0,
                                                                     sm_scale=scale),
    }
    # the prefixes' K and V once per kv head; q, o and the draft tokens' K / V; the mask's tree part (its prefix
    # columns are not read)
    touched = (2 * 2 * bs * prefix * k_buf.shape[1] * k_buf.shape[2] + 2 * 2 * (q.numel() + k_ext.numel())
               + bs * n * n)
    return {name: time_us(fn) for name, fn in impls.items()}, touched


def bench_embed_shard(bs, steps, topk, n, ranks=4, hidden=4096):
    """Rank 0's embedding lookup of a draft step's ``bs * topk`` rows under ``--tp 4`` (Llama-3's vocabulary, 8B
    hidden size): ours (one kernel) vs the torch mask chain it replaced (the twin)."""
    rows = -(-TARGET_VOCAB // 64) * 64 // ranks  # SGLang: the vocabulary padded to 64, then split
    table = torch.randn(rows, hidden, device="cuda", dtype=torch.bfloat16)
    ids = torch.randint(0, TARGET_VOCAB, (bs * topk,), device="cuda")
    out = torch.empty(bs * topk, hidden, device="cuda", dtype=torch.bfloat16)
    impls = {
        "triton (ours)": lambda: embed_shard.embed_shard(ids, table, 0, rows, out),
        "torch mask chain (before)": lambda: embed_shard_torch(ids, table, 0, rows),
    }
    # every row written, about one in ``ranks`` read (the others are another rank's: zeros), the ids
    return ({name: time_us(fn) for name, fn in impls.items()},
            out.numel() * out.element_size() * (1 + 1 / ranks) + ids.numel() * 8)


def cases(batches):
    """(steps, topk, draft tokens, batch) of every config at every batch size."""
    return [(steps, topk, n, bs) for steps, topk, n in CONFIGS for bs in batches]


# (op, bench(bs, steps, topk, n) -> ({impl: (eager_us, graph_us)}, touched bytes), cases)
OPS = [
    ("build_tree", bench_build_tree, cases(BATCHES)),
    ("verify_tree_greedy", bench_verify, cases(BATCHES)),
    ("simulated_walk", bench_simulated_walk, cases(BATCHES)),
    ("target_probs", lambda bs, steps, topk, n: bench_target_probs(bs, n), cases(TARGET_PROBS_BATCHES)),
    ("target_probs_flat", lambda bs, steps, topk, n: bench_target_probs(bs, n, scale=1e-4),
     cases(TARGET_PROBS_BATCHES)),
    ("tree_sampling", bench_tree_sampling, cases(TARGET_PROBS_BATCHES)),
    ("verify_attention", bench_verify_attention, cases(BATCHES) + [(3, 1, 4, bs) for bs in BATCHES]),
    ("embed_shard_tp4", bench_embed_shard, cases(BATCHES)),
    # long prefixes at small batches: the prefix split over several programs (the launcher's choice), and one pass
    ("verify_attention_8k", lambda bs, steps, topk, n: bench_verify_attention(bs, steps, topk, n, LONG_PREFIX),
     LONG_CASES),
    ("verify_attention_8k_one_pass",
     lambda bs, steps, topk, n: bench_verify_attention(bs, steps, topk, n, LONG_PREFIX, num_splits=1), LONG_CASES),
]


# switch -> the ops it runs alone (their names' prefixes)
ONLY = {"--verify-attention-only": ("verify_attention",), "--embed-shard-only": ("embed_shard",),
        "--sampling-only": ("target_probs", "tree_sampling")}


def gpu_run_setup(doc: str, switches: tuple[str, ...] = (), numbers: dict[str, int] | None = None
                  ) -> tuple[Path, str, float, argparse.Namespace]:
    """What every GPU benchmark starts with: ``(--out folder, default bench/results; the GPU's name; its
    measured copy bandwidth in bytes/s; the parsed CLI)``, its CLI described by the module docstring ``doc``
    and taking ``--out``, the on/off ``switches`` (e.g. ``"--kv-formats"``) and integer options ``numbers``
    ({option: default})."""
    parser = argparse.ArgumentParser(description=doc.splitlines()[0])
    parser.add_argument("--out", default=str(Path(__file__).parent / "results"))
    for switch in switches:
        parser.add_argument(switch, action="store_true")
    for option, default in (numbers or {}).items():
        parser.add_argument(option, type=int, default=default)
    args = parser.parse_args()
    return Path(args.out), torch.cuda.get_device_name(), copy_bandwidth(), args


def main():
    import sglang

    out_dir, gpu, bandwidth, args = gpu_run_setup(__doc__, tuple(ONLY))
    x = torch.empty(1, device="cuda")
    launch_us = triton.testing.do_bench(lambda: _empty_kernel[(1,)](x), warmup=25, rep=100,
                                        return_mode="median") * 1e3
    rows = []
    for op, bench, op_cases in OPS:
        if any(getattr(args, switch[2:].replace("-", "_")) and not op.startswith(prefixes)
               for switch, prefixes in ONLY.items()):
            continue
        for steps, topk, n, bs in op_cases:
            timings, touched = bench(bs, steps, topk, n)
            floor_us = touched / bandwidth * 1e6
            for impl, (eager, graph) in timings.items():
                rows.append(dict(op=op, impl=impl, steps=steps, topk=topk, draft_tokens=n, batch=bs,
                                 eager_us=eager, graph_us=graph, bytes=touched, floor_us=floor_us,
                                 graph_over_floor=graph / floor_us, launch_floor_us=launch_us,
                                 gpu=gpu, sglang_version=sglang.__version__))
            print(op, steps, topk, n, bs, {k: (round(e, 1), round(g, 1)) for k, (e, g) in timings.items()},
                  flush=True)

    stamp = f"{datetime.date.today()}-{gpu.replace(' ', '_')}-kernels"
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / f"{stamp}.json").write_text(json.dumps(rows, indent=1))
    (out_dir / f"{stamp}.md").write_text(markdown(rows, gpu, bandwidth, launch_us))
    print(markdown(rows, gpu, bandwidth, launch_us))


def markdown(rows, gpu, bandwidth, launch_us) -> str:
    lines = [
        f"# Tree kernels on {gpu}, SGLang {rows[0]['sglang_version']}",
        "",
        f"Copy bandwidth {bandwidth / 1e12:.2f} TB/s (read + write); empty Triton launch {launch_us:.1f} us "
        "eager.",
        "Times are medians in microseconds: eager (as served) / CUDA graph (device). build_tree: the whole",
        f"step as SGLang's triton backend runs it (FULL_MASK uint8 buffer for {MAX_CONTEXT} context, prefix",
        f"columns set, ~{MEAN_PREFIX}-token ragged prefixes). target_probs: batch * n rows of {TARGET_VOCAB}",
        "logits, N(0, 9) (target_probs_flat: N(0, 1e-4**2), a dummy-weight target's near-flat rows), T 0.7, top_k 20, "
        "top_p 0.9; stock = softmax, sgl-kernel top_k_renorm_prob, top_p_renorm_prob.",
        "Ratio: ours / stock, eager.",
        "",
        "Stock: sgl-kernel's CUDA op; for verify_attention SGLang's two-stage Triton extend kernel (what its",
        "triton backend runs for a target verify), one layer at Llama-3.1-8B shapes (32 / 8 heads of 128) over",
        f"{MEAN_PREFIX}-token prefixes ({LONG_PREFIX} for verify_attention_8k: ours splitting long prefixes as",
        "served, and in one pass); for embed_shard (a TP 4 rank's masked embedding lookup, 4096 wide) the torch mask",
        "chain it replaced in our drafter (before).",
        "",
        "| op | steps,topk,n | batch | ours | stock | SGLang serial triton | ours/stock "
        "| ours graph / floor |",
        "|---|---|---|---|---|---|---|---|",
    ]
    def key(r):
        return r["op"], r["steps"], r["topk"], r["draft_tokens"], r["batch"]

    groups: dict = {}
    for r in rows:
        groups.setdefault(key(r), {})[r["impl"]] = r
    def cell(r):
        return f"{r['eager_us']:.1f} / {r['graph_us']:.1f}" if r else "-"

    for (op, steps, topk, n, bs), g in groups.items():
        ours = g["triton (ours)"]
        stock = next(r for impl, r in g.items() if impl.endswith(("(stock)", "(before)")))
        serial = g.get("SGLang serial triton")
        lines.append(f"| {op} | {steps},{topk},{n} | {bs} | {cell(ours)} | {cell(stock)} | {cell(serial)} | "
                     f"{ours['eager_us'] / stock['eager_us']:.2f} | {ours['graph_over_floor']:.0f} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
