"""Decode-cycle speed of real SGLang servers: no speculation, stock EAGLE3 and EAGLE_TRITON.

    python -m bench.serve --workdir /tmp/bench-models --out bench/results/serve.json \\
        [--systems nospec eagle3 eagle_triton] [--configs 5,8,32 3,1,4] [--batches 1 8 32]
    python -m bench.serve --report bench/results/serve.json      # table + plot from collected rows
    python -m bench.serve ... --server-flags "--kv-cache-dtype fp8_e4m3"   # every server with these flags too
    python -m bench.serve ... --tp 2                  # every server tensor-parallel (rows: tp, flags "--tp-size 2")
    python -m bench.serve ... --model llama-3.1-70b --tp 4   # 70B shapes (four GPUs)
    python -m bench.serve ... --tp 4 --interleave     # every server up at once, batches measured in turn
    python -m bench.serve ... --sampling temperature=0.7 top_p=0.9 top_k=20   # sampled requests (rows: in flags)

On a GPU host, from the repository root: Llama-3.1-8B target shapes served with ``--load-format dummy``,
and an EAGLE-3 draft checkpoint of the real shape with random weights written here first (dummy init would
leave its d2t map meaningless), all systems with the same attention backend, each server started by
:class:`sgl_eagle_triton.devtools.launcher.Server` (log: ``<workdir>/<server>.log``). Each server runs alone, or with
``--interleave`` all at once, each batch measured twice (``--repeats``) per server in alternating order
(:mod:`bench.interleave`: host-bound cycles, e.g. small batches under ``--tp``, moved with the order of the servers);
rows are merged into ``--out`` so a long sweep can span several calls.

Measurement (black box, no host sync inside SGLang): ``batch`` concurrent streamed ``/generate``
requests of random 128-token prompts, ``MAX_NEW_TOKENS`` each, EOS ignored. SGLang streams one chunk per
decode cycle, so ``cycle_ms`` is the median over requests of the median gap between chunks (steady state:
the prefills of requests admitted later and the ramp-up do not count); ``mean_cycle_ms`` is the median over
requests of (last chunk - first) / cycles (``spec_verify_ct``, or tokens - 1 without speculation), which
does count them; ``chunks_per_cycle`` is 1.0 unless outputs were coalesced. Acceptance with random weights
is ~1, which changes token ids but not cost. Requests are greedy unless ``--sampling`` gives SGLang sampling
parameters (every system, the same): the sampled verify (ours: target probabilities and tree sampling in Triton;
stock: sgl-kernel's renorm ops and tree sampling) is then part of every cycle.

With ``--server-env SGLANG_EAGLE_TRITON_CYCLE_TIMING=N`` every server (stock ones too) logs its ranks' decode-step
timing; rows keep each rank's means after the warm-up request (``cycle_timing``, :func:`cycle_timing_by_rank`).

Breakdown (``--profile-steps N``, default 20; 0 disables it): after the timed batch, the same load runs
again under SGLang's torch profiler (``POST /start_profile`` for N forward passes); the trace lands in
``<workdir>/traces/<server>-b<batch>/`` and :mod:`bench.trace_breakdown` turns it into per-cycle costs of
SGLang's stages (``draft``, ``draft_extend``, ``verify_forward``, ``decode``: GPU busy time of their kernels,
GPU span, CPU time; ``compute_busy_ms`` without collectives). ``draft_ms`` is the draft stage's GPU busy time per
cycle; the profiler slows the host, so ``cycle_ms`` always comes from the unprofiled run. Under ``--tp`` every
rank writes a trace: ``stages`` is rank 0's, ``stages_by_rank`` every rank's (a rank's collectives spin while it
waits for the others, so busy times differ by rank; compare ``compute_busy_ms``).
"""

from __future__ import annotations

import argparse
import datetime
import json
import random
import re
import shlex
import shutil
import statistics
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from bench.interleave import (
    SHARED_GPU_ENV,
    SHARED_GPU_FLAGS,
    bring_up,
    combine_runs,
    measure_in_turn,
    one_after_another,
    paired_line,
    paired_ratio,
    paired_section,
)
from bench.trace_breakdown import load_trace, stage_times
from sgl_eagle_triton.config import EXPERIMENTAL_TP_ENV, TESTED_TP_SIZES, VERIFY_ATTENTION_IN_USE
from sgl_eagle_triton.cycle_timing import parse_summaries
from sgl_eagle_triton.devtools.launcher import Client, Server, exit_on_sigterm

ROOT = Path(__file__).resolve().parent.parent

MAX_NEW_TOKENS, PROMPT_TOKENS = 256, 128
SYSTEMS = {"nospec": None, "eagle3": "EAGLE3", "eagle_triton": "EAGLE_TRITON"}
SERVER_ARGS = [
    "--load-format", "dummy", "--skip-tokenizer-init", "--speculative-draft-load-format", "auto",
    "--attention-backend", "triton", "--sampling-backend", "pytorch", "--grammar-backend", "none",
    "--context-length", "4096", "--mem-fraction-static", "0.7",
]
LLAMA_8B = {
    "model_type": "llama", "hidden_size": 4096, "intermediate_size": 14336, "num_hidden_layers": 32,
    "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 128, "hidden_act": "silu",
    "max_position_embeddings": 131072, "rms_norm_eps": 1e-5, "rope_theta": 500000.0,
    "rope_scaling": {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                     "original_max_position_embeddings": 8192, "rope_type": "llama3"},
    "vocab_size": 128256, "tie_word_embeddings": False, "bos_token_id": 128000, "eos_token_id": 128009,
    "torch_dtype": "bfloat16",
}
LLAMA_70B = {**LLAMA_8B, "hidden_size": 8192, "intermediate_size": 28672, "num_hidden_layers": 80,
             "num_attention_heads": 64}
MODELS = {"llama-3.1-8b": LLAMA_8B, "llama-3.1-70b": LLAMA_70B}  # served with dummy weights; drafts: EAGLE-3 shapes
DRAFT_VOCAB = 32000
# The random draft's LM head gives logits of std ~5 (weights of std 5 / sqrt(hidden): the final RMSNorm makes the
# hidden state's RMS 1): a confident draft, whose trees grow deep along its best candidates as a trained draft's do.
# With all weights at 0.02 (logit std 1.3, nearly uniform) EAGLE's (5,8,32) selection made trees only 2 deep; under
# the tree-aware simulated acceptance they then committed less than a chain of 3 (bench/README.md).
DRAFT_LOGIT_STD, WEIGHT_STD = 5.0, 0.02


def draft_shapes(model: dict) -> dict[str, tuple[int, int]]:
    """The EAGLE-3 draft's weight shapes for a Llama target config (one layer of the target's widths)."""
    h, i = model["hidden_size"], model["intermediate_size"]
    q, kv = model["num_attention_heads"] * model["head_dim"], model["num_key_value_heads"] * model["head_dim"]
    return {
        "fc.weight": (h, 3 * h), "midlayer.self_attn.q_proj.weight": (q, 2 * h),
        "midlayer.self_attn.k_proj.weight": (kv, 2 * h), "midlayer.self_attn.v_proj.weight": (kv, 2 * h),
        "midlayer.self_attn.o_proj.weight": (h, q), "midlayer.mlp.gate_proj.weight": (i, h),
        "midlayer.mlp.up_proj.weight": (i, h), "midlayer.mlp.down_proj.weight": (h, i),
        "lm_head.weight": (DRAFT_VOCAB, h),
    }


def write_models(workdir: Path, model: str = "llama-3.1-8b") -> tuple[Path, Path]:
    """The target config of ``model`` (weights: dummy) and a random-weight EAGLE-3 draft checkpoint of its shape."""
    import torch
    from safetensors.torch import save_file

    spec = MODELS[model]
    target, draft = workdir / model, workdir / f"{model}-eagle3"
    target.mkdir(parents=True, exist_ok=True)
    (target / "config.json").write_text(json.dumps({**spec, "architectures": ["LlamaForCausalLM"]}))
    if (draft / "model.safetensors").exists() and json.loads((draft / "config.json").read_text()).get(
            "bench_draft_logit_std") == DRAFT_LOGIT_STD:
        return target, draft
    draft.mkdir(parents=True, exist_ok=True)
    h, v = spec["hidden_size"], spec["vocab_size"]
    cfg = {**spec, "architectures": ["LlamaForCausalLMEagle3"], "num_hidden_layers": 1,
           "draft_vocab_size": DRAFT_VOCAB, "target_hidden_size": h, "bench_draft_logit_std": DRAFT_LOGIT_STD}
    (draft / "config.json").write_text(json.dumps(cfg))
    device = "cuda" if torch.cuda.is_available() else "cpu"
    gen = torch.Generator(device).manual_seed(0)
    head_std = DRAFT_LOGIT_STD / h**0.5
    tensors = {name: (torch.randn(shape, generator=gen, device=device)
                      * (head_std if name == "lm_head.weight" else WEIGHT_STD)).bfloat16().cpu()
               for name, shape in draft_shapes(spec).items()}
    for norm in ("midlayer.hidden_norm", "midlayer.input_layernorm", "midlayer.post_attention_layernorm", "norm"):
        tensors[f"{norm}.weight"] = torch.ones(h, dtype=torch.bfloat16)
    hot = torch.randperm(v, generator=torch.Generator().manual_seed(0))[:DRAFT_VOCAB].sort().values
    tensors["d2t"] = hot - torch.arange(DRAFT_VOCAB)
    tensors["t2d"] = torch.zeros(v, dtype=torch.bool).index_fill_(0, hot, True)
    save_file(tensors, str(draft / "model.safetensors"))
    return target, draft


def spec_args(system: str, draft: Path, config: tuple[int, int, int]) -> list[str]:
    if SYSTEMS[system] is None:
        return []
    steps, topk, n = config
    return ["--speculative-algorithm", SYSTEMS[system], "--speculative-draft-model-path", str(draft),
            "--speculative-num-steps", str(steps), "--speculative-eagle-topk", str(topk),
            "--speculative-num-draft-tokens", str(n)]


def timed_request(url: str, prompt: list[int], **sampling) -> dict:
    """One streamed /generate of ``MAX_NEW_TOKENS`` tokens (EOS ignored), greedy unless ``sampling`` params say
    otherwise: arrival time of every chunk, meta_info of the last chunk."""
    times, meta = [], {}
    for chunk in Client(url).generate_stream(prompt, MAX_NEW_TOKENS, timeout=600, **sampling):  # each as it arrives
        times.append(time.perf_counter())
        meta = chunk.get("meta_info", meta)
    return {"times": times, "meta": meta}


def _cycles(meta: dict) -> int:
    return meta.get("spec_verify_ct") or meta["completion_tokens"] - 1  # verify cycles, or decode steps


def cycle_ms(results: list[dict]) -> float:
    """Steady-state decode cycle: median over requests of the median gap between streamed chunks (one chunk
    per cycle after the prefill's), so neither other requests' prefills nor the ramp-up count."""
    return statistics.median(statistics.median(b - a for a, b in zip(r["times"], r["times"][1:], strict=False)) * 1e3
                             for r in results)


def mean_cycle_ms(results: list[dict]) -> float:
    """Median over requests of decode time (first chunk to last) / decode cycles: prefills of other requests
    that interrupt a request's decode count against it."""
    return statistics.median((r["times"][-1] - r["times"][0]) * 1e3 / _cycles(r["meta"]) for r in results)


def chunks_per_cycle(results: list[dict]) -> float:
    """Streamed chunks after the first per decode cycle: 1.0 unless the server coalesced outputs."""
    return statistics.mean((len(r["times"]) - 1) / _cycles(r["meta"]) for r in results)


def random_prompts(batch: int, seed: int) -> list[list[int]]:
    """``batch`` prompts of ``PROMPT_TOKENS`` random token ids."""
    rng = random.Random(seed)
    return [[rng.randrange(1000, 100000) for _ in range(PROMPT_TOKENS)] for _ in range(batch)]


def measure(url: str, batch: int, seed: int = 0, after_warm_up=None, sampling: dict | None = None) -> dict:
    """One warm-up request, then ``batch`` concurrent ones (``after_warm_up()`` called between), all with the
    ``sampling`` params (default greedy)."""
    sampling = sampling or {}
    prompts = random_prompts(batch, seed)
    timed_request(url, prompts[0], **sampling)  # warm-up
    if after_warm_up is not None:
        after_warm_up()
    with ThreadPoolExecutor(batch) as pool:
        results = list(pool.map(lambda p: timed_request(url, p, **sampling), prompts))
    accept = [r["meta"].get("spec_accept_length", 1.0) for r in results]
    return {"cycle_ms": cycle_ms(results), "mean_cycle_ms": mean_cycle_ms(results),
            "chunks_per_cycle": chunks_per_cycle(results), "accept_length": statistics.mean(accept)}


def cycle_timing_by_rank(log_text: str) -> dict | None:
    """``{rank: {host_period, host_in_forward, gpu_step, gpu_idle}}`` (ms, each summary line weighted by its decode
    steps, or by its paired steps for the period and the idle) of the ``SGLANG_EAGLE_TRITON_CYCLE_TIMING`` lines in
    a slice of a server's log; None without any (the variable unset, or too few decode steps)."""
    by_rank: dict = {}
    for line in parse_summaries(log_text):
        by_rank.setdefault(line["rank"], []).append(line)
    if not by_rank:
        return None

    def mean(lines, key, weight):
        pairs = [(line[key], line[weight]) for line in lines if line[key] is not None and line[weight]]
        total = sum(w for _, w in pairs)
        return round(sum(v * w for v, w in pairs) / total, 3) if total else None

    return {rank: {key: mean(lines, key, "paired" if key in ("host_period", "gpu_idle") else "steps")
                   for key in ("host_period", "host_in_forward", "gpu_step", "gpu_idle")}
            for rank, lines in sorted(by_rank.items())}


def timed_measure(server: Server, batch: int, sampling: dict | None = None) -> dict:
    """:func:`measure`, with ``cycle_timing`` (:func:`cycle_timing_by_rank`) of the log lines the server wrote from
    the end of the warm-up request on."""
    mark = {}
    result = measure(server.url, batch, after_warm_up=lambda: mark.setdefault("at", len(server.log())),
                     sampling=sampling)
    return {**result, "cycle_timing": cycle_timing_by_rank(server.log()[mark.get("at", 0):])}


def trace_rank(path: Path) -> int:
    """The tensor-parallel rank of SGLang's trace file (``...-TP-<rank>.trace.json.gz``; 0 without one)."""
    m = re.search(r"-TP-(\d+)", path.name)
    return int(m[1]) if m else 0


def profile_stages(url: str, batch: int, out_dir: Path, steps: int, ranks: int = 1,
                   sampling: dict | None = None) -> list[dict]:
    """Per-cycle stage costs (:func:`bench.trace_breakdown.stage_times`) over ``steps`` profiled forward passes
    while ``batch`` fresh requests decode, one per tensor-parallel rank in rank order (each rank writes its own
    trace; under TP a rank's collectives also count the time it waits for the others: compare ``compute_busy_ms``).
    ``out_dir`` is emptied first (a folder of an earlier run would mix its traces in); a rank whose trace does not
    appear within 180 s fails the breakdown."""
    shutil.rmtree(out_dir, ignore_errors=True)
    out_dir.mkdir(parents=True, exist_ok=True)
    prompts = random_prompts(batch, seed=1)
    with ThreadPoolExecutor(batch) as pool:
        running = [pool.submit(timed_request, url, p, **(sampling or {})) for p in prompts]
        time.sleep(1.0)  # past the prefills: profile decode cycles only
        Client(url).post("/start_profile", {"output_dir": str(out_dir), "num_steps": steps,
                                            "activities": ["CPU", "GPU"]}, timeout=60)
        for r in running:
            r.result()
    deadline = time.time() + 180
    while len(traces := sorted(out_dir.glob("*.json*"), key=trace_rank)) < ranks and time.time() < deadline:
        time.sleep(2)
    if [trace_rank(t) for t in traces] != list(range(ranks)):
        raise RuntimeError(f"profiler traces of ranks {[trace_rank(t) for t in traces]} in {out_dir}, expected "
                           f"0..{ranks - 1}")
    time.sleep(5)  # let the writers finish their files
    return [stage_times(load_trace(trace)) for trace in traces]


def draft_ms(stages: dict) -> float | None:
    """The draft phase's device time per cycle: GPU busy time of its kernels (the union of their intervals).
    Not its GPU span: at small batches the span is bound by the host (doubly so under the profiler's Python
    tracing), the same for every system, and hides the kernels' cost."""
    draft = stages.get("draft")
    return draft["gpu_busy_ms"] if draft else None


def server_args(batches: list[int]) -> list[str]:
    """The shared flags; decode CUDA graphs captured for exactly the batch sizes measured (a ramp-up batch pads
    to the next one) and no prefill graphs (prefill is not timed): server start-up in about a minute."""
    return [*SERVER_ARGS, "--cuda-graph-bs-decode", *map(str, sorted(batches)), "--disable-prefill-cuda-graph",
            "--max-running-requests", str(max(batches))]


def merge_rows(path: Path, new_rows: list[dict]) -> list[dict]:
    """Rows of ``path`` with ``new_rows`` replacing those of the same (flags, system, steps, topk, n, batch)."""
    key = lambda r: (r.get("flags", ""), r["system"], r["steps"], r["topk"], r["draft_tokens"], r["batch"])  # noqa: E731
    rows = {key(r): r for r in (json.loads(path.read_text()) if path.exists() else [])}
    rows.update({key(r): r for r in new_rows})
    return sorted(rows.values(), key=key)


def report(rows: list[dict]) -> str:
    """Markdown: cycle per system and batch, ratios to stock and no-spec, break-even acceptance length,
    projected tokens/s per request at acceptance lengths 3-6."""
    nospec = {(r.get("flags", ""), r["batch"]): r["cycle_ms"] for r in rows if r["system"] == "nospec"}
    stock_rows = {(r.get("flags", ""), r["steps"], r["topk"], r["draft_tokens"], r["batch"]): r for r in rows
                  if r["system"] == "eagle3"}
    stock = {cfg: r["cycle_ms"] for cfg, r in stock_rows.items()}
    gpu = rows[0]["gpu"] if rows else "?"
    lines = [f"# Decode cycle on {gpu}, SGLang {rows[0]['sglang_version'] if rows else '?'}", "",
             "| flags | system | steps,topk,n | batch | cycle ms | ours/stock | draft ms | draft ours/stock | "
             "break-even accept (cycle / no-spec step) | tok/s/req at accept 3 / 4 / 5 / 6 |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        flags = r.get("flags", "")
        cfg = (flags, r["steps"], r["topk"], r["draft_tokens"], r["batch"])
        base = nospec.get((flags, r["batch"]))
        vs_stock = f"{r['cycle_ms'] / stock[cfg]:.2f}" if r["system"] == "eagle_triton" and cfg in stock else "-"
        vs_nospec = f"{r['cycle_ms'] / base:.2f}" if base and r["system"] != "nospec" else "-"
        draft = f"{r['draft_ms']:.2f}" if r.get("draft_ms") else "-"
        stock_draft = stock_rows[cfg].get("draft_ms") if cfg in stock_rows else None
        draft_vs_stock = (f"{r['draft_ms'] / stock_draft:.2f}" if r["system"] == "eagle_triton" and r.get("draft_ms")
                          and stock_draft else "-")
        projected = ("-" if r["system"] == "nospec"
                     else " / ".join(f"{a * 1e3 / r['cycle_ms']:.0f}" for a in (3, 4, 5, 6)))
        name = "no speculation" if r["system"] == "nospec" else r["system"]
        shape = "-" if r["system"] == "nospec" else "{},{},{}".format(*cfg[1:4])
        lines.append(f"| {flags or '-'} | {name} | {shape} | {r['batch']} | {r['cycle_ms']:.2f} | {vs_stock} | "
                     f"{draft} | {draft_vs_stock} | {vs_nospec} | {projected} |")
    return "\n".join(lines) + "\n" + paired_table(rows, stock_rows) + breakdown(rows) + timing_table(rows)


def paired_table(rows: list[dict], stock_rows: dict) -> str:
    """Markdown: for interleaved rows (``runs``), our cycle over stock's of the same sweep (``session``) run by run
    (:func:`bench.interleave.paired_ratio`), with the geometric mean and its 90 % interval."""
    lines = []
    for r in rows:
        stock = stock_rows.get((r.get("flags", ""), r["steps"], r["topk"], r["draft_tokens"], r["batch"]))
        p = (paired_ratio(r.get("runs", []), stock.get("runs", []))
             if r["system"] == "eagle_triton" and stock and stock.get("session") == r.get("session") else None)
        if p:
            lines.append(paired_line("{},{},{}".format(r["steps"], r["topk"], r["draft_tokens"]), r["batch"], p))
    return paired_section("ours / stock cycle", "steps,topk,n", lines)


def timing_table(rows: list[dict]) -> str:
    """Markdown: each rank's ``SGLANG_EAGLE_TRITON_CYCLE_TIMING`` means per row (each run of an interleaved row)."""
    lines = []
    for r in rows:
        runs = r.get("cycle_timing")
        for run, timing in enumerate(runs if isinstance(runs, list) else [runs]):
            for rank, t in (timing or {}).items():
                cells = " | ".join("-" if t[k] is None else f"{t[k]:.2f}"
                                   for k in ("host_period", "host_in_forward", "gpu_step", "gpu_idle"))
                lines.append(f"| {r['system']} | {r['steps']},{r['topk']},{r['draft_tokens']} | {r['batch']} | "
                             f"{run + 1} | {rank} | {cells} |")
    if not lines:
        return ""
    return "\n".join(["", "Cycle timing (SGLANG_EAGLE_TRITON_CYCLE_TIMING, ms per decode step, every rank; under "
                      "overlap scheduling host period = GPU step + idle when the GPU waits for the host):", "",
                      "| system | steps,topk,n | batch | run | rank | host period | host in forward | GPU step | "
                      "GPU idle |", "|---|---|---|---|---|---|---|---|---|", *lines]) + "\n"


BREAKDOWN_STAGES = ("draft", "draft_extend", "verify_forward", "decode")


def breakdown(rows: list[dict]) -> str:
    """Markdown: per-cycle GPU busy time of each profiled stage, and the rest of the (unprofiled) cycle:
    host gaps, the accept kernels and anything else outside the stage ranges."""
    rows = [r for r in rows if r.get("stages")]
    if not rows:
        return ""
    lines = ["", "Cycle breakdown (GPU busy ms per cycle in each SGLang stage, from the profiled run; rest = "
             "cycle - stages: host gaps, verify's accept kernels, scheduling)", "",
             "| flags | system | steps,topk,n | batch | cycle ms | " + " | ".join(BREAKDOWN_STAGES) + " | rest |",
             "|---|---|---|---|---|" + "---|" * (len(BREAKDOWN_STAGES) + 1)]
    for r in rows:
        busy = [r["stages"].get(s, {}).get("gpu_busy_ms") for s in BREAKDOWN_STAGES]
        rest = r["cycle_ms"] - sum(b for b in busy if b)
        shape = "-" if r["system"] == "nospec" else f"{r['steps']},{r['topk']},{r['draft_tokens']}"
        cells = " | ".join("-" if b is None else f"{b:.2f}" for b in busy)
        lines.append(f"| {r.get('flags') or '-'} | {r['system']} | {shape} | {r['batch']} | {r['cycle_ms']:.2f} | "
                     f"{cells} | {rest:.2f} |")
    return "\n".join(lines) + "\n"


def line_plot(series: dict[str, list[tuple[float, float]]], path: Path, ylabel: str, title: str,
              log_y: bool = False, dashed=lambda label: False) -> None:
    """One line per ``series`` label (points ``(batch, value)``), batch on a log axis, saved to ``path``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    for label, points in sorted(series.items()):
        xs, ys = zip(*sorted(points), strict=True)
        ax.plot(xs, ys, marker="o", label=label, linestyle="--" if dashed(label) else "-")
    ax.set(xscale="log", yscale="log" if log_y else "linear", xlabel="batch", ylabel=ylabel, title=title)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def plot(rows: list[dict], path: Path) -> None:
    series: dict = {}
    for r in rows:
        label = r["system"] if r["system"] == "nospec" else "{} ({},{},{})".format(
            r["system"], r["steps"], r["topk"], r["draft_tokens"])
        label += f" {r['flags']}" if r.get("flags") else ""
        series.setdefault(label, []).append((r["batch"], r["cycle_ms"]))
    line_plot(series, path, "decode cycle (ms)", rows[0]["gpu"])


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workdir", type=Path, default=Path("/tmp/bench-models"))
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "serve.json")
    parser.add_argument("--systems", nargs="+", choices=list(SYSTEMS), default=list(SYSTEMS))
    parser.add_argument("--configs", nargs="+", default=[(5, 8, 32), (3, 1, 4), (8, 8, 64)],
                        type=lambda s: tuple(int(x) for x in s.split(",")))
    parser.add_argument("--batches", nargs="+", type=int, default=[1, 8, 32, 64])
    parser.add_argument("--profile-steps", type=int, default=None,
                        help="forward passes profiled per batch for the stage breakdown (default 20; 0: none)")
    parser.add_argument("--server-flags", default="", help="extra flags for every server (rows keep them: 'flags')")
    parser.add_argument("--server-env", nargs="*", default=[], metavar="KEY=VALUE",
                        help="extra environment of every server, e.g. a trial's knob (rows keep it in 'flags')")
    parser.add_argument("--model", choices=list(MODELS), default="llama-3.1-8b",
                        help="target shapes (dummy weights) and its EAGLE-3 draft's (rows: 'model')")
    parser.add_argument("--tp", type=int, default=1, help="tensor-parallel size of every server (rows: 'tp'; "
                        "EAGLE_TRITON beyond config.TESTED_TP_SIZES runs as a trial under config.EXPERIMENTAL_TP_ENV)")
    parser.add_argument("--repeats", type=int, default=2,
                        help="with --interleave: runs per server and batch, the order reversed each run")
    parser.add_argument("--interleave", action="store_true",
                        help="every server up at once on the same GPUs, each batch measured twice (--repeats) per "
                             "server in alternating order (rows: the mean, 'runs' every cycle); no profiling")
    parser.add_argument("--sampling", nargs="*", default=[], metavar="KEY=VALUE",
                        help="SGLang sampling params of every request, e.g. temperature=0.7 top_p=0.9 top_k=20 "
                             "(default greedy; rows keep them in 'flags')")
    parser.add_argument("--report", type=Path, help="only write the table and plot of this JSON")
    args = parser.parse_args(argv)
    try:
        args.sampling_params = {k: int(v) if v.lstrip("-").isdigit() else float(v)
                                for k, v in server_env(args.sampling).items()}
    except ValueError:
        parser.error(f"--sampling: KEY=NUMBER items, got {args.sampling}")
    if args.sampling and not args.sampling_params.get("temperature"):  # requests default to temperature 0: greedy
        parser.error("--sampling: give a temperature > 0 (at temperature 0 SGLang decodes greedily, whatever else)")
    if args.repeats < 1:
        parser.error("--repeats: at least 1")
    if args.interleave and args.profile_steps:
        parser.error("--interleave measures without the profiler: drop --profile-steps (or run it without "
                     "--interleave)")
    if args.profile_steps is None:
        args.profile_steps = 0 if args.interleave else 20
    if args.tp > 1:  # rows are compared within one flag set: the TP size is part of it
        args.server_flags = f"{args.server_flags} --tp-size {args.tp}".strip()
    args.env = server_env(args.server_env)
    args.flags = " ".join([*args.server_env, args.server_flags]).strip()  # the rows' flag set, environment included
    if args.sampling:  # sampled rows never replace greedy ones; the same params in any order, the same rows
        args.flags = " ".join([args.flags, "sampling:", *(f"{k}={v}" for k, v in sorted(args.sampling_params.items()))
                               ]).strip()
    if args.interleave:  # its rows (capped KV pools, servers side by side) never replace rows of servers run alone
        args.flags = " ".join([args.flags, *SHARED_GPU_FLAGS]).strip()
        args.env = {**SHARED_GPU_ENV, **args.env}
    for steps, topk, n in args.configs:
        if topk == 1 and n != steps + 1:
            parser.error(f"topk 1 needs draft tokens = steps + 1, got {steps},{topk},{n}")
    return args


def server_env(items: list[str]) -> dict[str, str]:
    """``--server-env``'s ``KEY=VALUE`` items as an environment."""
    return dict(item.split("=", 1) for item in items)


def verify_attention(server: Server) -> str:
    """Row key ``verify_attention``: ``"ours"`` where an EAGLE_TRITON server's ``/server_info`` says its target
    verify attends through our kernel, else ``"sglang"`` (stock and no-spec servers: SGLang's backend)."""
    state = server.get_json("/server_info")["internal_states"][0]
    kernel = state.get("eagle_triton", {}).get("kernels", {}).get("verify attention")
    return "ours" if kernel == VERIFY_ATTENTION_IN_USE else "sglang"


def write_report(rows: list[dict], json_path: Path) -> None:
    json_path.with_suffix(".md").write_text(report(rows))
    plot(rows, json_path.with_suffix(".png"))


def main(argv=None):
    args = parse_args(argv)
    exit_on_sigterm()  # a `timeout` around a sweep still stops the server it started
    if args.report:
        write_report(json.loads(args.report.read_text()), args.report)
        return
    import sglang
    import torch

    target, draft = write_models(args.workdir, args.model)
    meta = dict(flags=args.flags, tp=args.tp, model=args.model, gpu=torch.cuda.get_device_name(),
                sglang_version=sglang.__version__, date=str(datetime.date.today()))
    if args.interleave:  # the report pairs runs of one sweep only (bench.interleave.paired_ratio)
        meta["session"] = datetime.datetime.now().isoformat(timespec="seconds")
    servers = [(system, config) for system in args.systems
               for config in ([(0, 0, 0)] if system == "nospec" else args.configs)]

    def start(system, config, extra=()):
        return Server(f"{system}-{'-'.join(map(str, config))}", str(target),
                      [*server_args(args.batches), *spec_args(system, draft, config), *shlex.split(args.server_flags),
                       *extra], args.workdir,
                      env={**args.env, **({EXPERIMENTAL_TP_ENV: "1"} if args.tp not in TESTED_TP_SIZES else {})})

    if args.interleave:
        return interleaved(servers, start, args, meta)

    def measure_batch(system, config, server, attention, batch):
        result = timed_measure(server, batch, args.sampling_params)
        stages, by_rank = {}, []
        if args.profile_steps:
            try:
                by_rank = profile_stages(server.url, batch, args.workdir / "traces" / f"{server.name}-b{batch}",
                                         args.profile_steps, args.tp, args.sampling_params)
                stages = by_rank[0]  # rank 0's
            except Exception as e:  # the cycle time stands without its breakdown
                print(f"{server.name} b{batch}: no stage breakdown: {e!r}", flush=True)
        print(server.name, batch, result, json.dumps(stages), flush=True)
        return row(system, config, batch, meta, attention, result, stages, by_rank if args.tp > 1 else None)

    # a server that fails ends the sweep (its rows so far saved)
    one_after_another(servers, start, verify_attention, measure_batch, args.batches, lambda rows: save(args.out, rows),
                      keep_going=False)


def row(system: str, config: tuple, batch: int, meta: dict, attention: str, result: dict, stages: dict | None = None,
        stages_by_rank: list | None = None) -> dict:
    return dict(system=system, steps=config[0], topk=config[1], draft_tokens=config[2], batch=batch, **meta,
                verify_attention=attention, draft_ms=draft_ms(stages or {}), stages=stages or {},
                stages_by_rank=stages_by_rank, **result)


def interleaved(servers: list[tuple], start, args, meta: dict) -> None:
    """``--interleave`` (:mod:`bench.interleave`): the servers started one after another (each profiles the memory
    the ones before it left; ``SHARED_GPU_FLAGS``) and kept up; per batch each measured ``--repeats`` times, in
    alternating order; a row keeps the mean of the runs (``cycle_ms``, ``mean_cycle_ms``, ``chunks_per_cycle``,
    ``accept_length``) and every cycle (``runs``). No profiling. A server that fails to start is left out; one
    that fails while serving stops the sweep with the rows so far saved."""
    started, rows = [], []
    try:
        ready = bring_up([[s] for s in servers], start, verify_attention, started)
        for i, batch in enumerate(args.batches):
            runs = measure_in_turn(ready, i, batch, args.repeats,
                                   lambda server, n, run: timed_measure(server, n, args.sampling_params))
            for system, config, server, attention in ready:
                result = combine_runs(runs[server.name], keep="cycle_ms",
                                      mean=("cycle_ms", "mean_cycle_ms", "chunks_per_cycle", "accept_length"))
                result["cycle_timing"] = [run["cycle_timing"] for run in runs[server.name]]  # each run's
                rows.append(row(system, config, batch, meta, attention, result))
            save(args.out, rows)
    finally:
        for server in started:
            server.stop()


def save(path: Path, rows: list[dict]) -> None:
    merged = merge_rows(path, rows)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(merged, indent=1))
    write_report(merged, path)


if __name__ == "__main__":
    main()
