"""Adaptive speculation sweep: output tokens per second of the whole batch against batch size, for no speculation,
static trees and ``--speculative-adaptive``, stock EAGLE3 and EAGLE_TRITON.

    python -m bench.adaptive --workdir /tmp/bench-models --out bench/results/adaptive.json \\
        [--systems nospec eagle3 eagle_triton eagle3_adaptive eagle_triton_adaptive eagle_triton_cost
                   eagle_triton_cost_plain eagle_triton_cost_sglang_off eagle_triton_cost_trees
                   eagle_triton_cost_mixed eagle_triton_off
                   eagle_triton_off_plain eagle_triton_off_nonspec eagle_triton_cost_nonspec
                   eagle_triton_cost_spec_path eagle3_off
                   eagle3_off_skip nospec_twin] \\
        [--shapes 5,8,32 3,1,4] \\
        [--batches 1 4 8 16 32 64] [--simulate-acc-len 3.5 | --acceptance-profile llama31-8b-eagle3 | --real-pair]
    python -m bench.adaptive --report bench/results/adaptive.json     # table + plot from collected rows
    python -m bench.adaptive --merge lane0.json lane1.json --out bench/results/adaptive.json   # lanes' rows
    python -m bench.adaptive ... --server-flags "--attention-backend flashinfer"   # every server with these flags
    python -m bench.adaptive ... --server-env SGLANG_EAGLE_TRITON_VERIFY_ATTENTION=0   # and this environment
    python -m bench.adaptive --real-pair --interleave ...   # every server at once, batches measured in turn
    python -m bench.adaptive --real-pair --interleave --pin-cores ...   # and each on cores of its own
    python -m bench.adaptive --real-pair --interleave --pin-cores --rotate-cores ...   # the shares turned each run

On a GPU host, from the repository root: the Llama-3.1-8B target of :mod:`bench.serve` (``--load-format dummy``)
and its random EAGLE-3 draft. Random weights accept nothing, so every server runs under SGLang's simulated
acceptance, the same for all (``SGLANG_SIMULATE_ACC_LEN`` = ``--simulate-acc-len`` with method
``match-expected``: each verify accepts the floor or the ceiling of that length, averaging it, capped by the
tree's depth + 1; token mode ``fixed``). Rows say so: ``acceptance`` is ``"simulated:sglang-<method>-<len>"``.
It is a depth-only model (a chain of 3 accepts as much as a tree of 5 levels up to 4 tokens): it prices each
shape's cost, not its tree's extra acceptance. ``--acceptance-profile`` runs every server (stock ones too) under
the tree-aware model of :mod:`sgl_eagle_triton.simulated_acceptance` instead (label ``"simulated:<profile>"``);
``--real-pair`` serves the trained tiny pair (``sgl_eagle_triton.devtools.TRAINED_PAIR``, tiny-code-v1) on the code
prompts with its real acceptance instead (label ``"real:tiny-code-v1"``).

Measurement: ``batch`` concurrent streamed ``/generate`` requests of random 128-token prompts, ``MAX_NEW_TOKENS``
each (EOS ignored), after one warm-up request and one warm-up batch (adaptive servers settle their EMA there);
batches under ``MIN_REQUESTS`` run several rounds (row key ``rounds``). An EAGLE_TRITON adaptive server's rows also
keep what its policy chose and priced, read after the batch (row key ``policy``: :func:`policy_state`); under
``SGLANG_EAGLE_TRITON_CYCLE_TIMING`` (``--server-env``) each state's own cycle as the server ran it (row key ``states``:
:func:`states_state`; the report's "Cycles by state", beside the cost policy's price of each), and under
``--interleave`` each run's own per-state cycles and prices (row key ``run_cycles``: :func:`run_with_cycles`; the
report's price over the period, run by run).
``tok_per_s`` = the sum over requests of (output tokens - 1) / (last chunk - first chunk): the batch's decode
rate once every request is past its prefill. Stock adaptive starts at its widest candidate (SGLang 0.5.17
crashes at start otherwise; docs/design.md). Every server runs the triton attention backend unless
``--server-flags`` names another. Rows go to ``--out`` (merged by system, shape, batch, card, env and flags) with
``.md`` and ``.png`` beside it. On a host of several GPUs a sweep may run in lanes (``.ci/gpu-lanes``), each on its
own card with ``--systems`` a share and ``nospec`` in every lane; rows record ``card`` (``CUDA_VISIBLE_DEVICES``, or
``--card``: shares run in separate calls of one GPU each need their own label) and the report compares each system
with the no-spec of its own card.

``--interleave`` (:mod:`bench.interleave`): every system's server starts on the one GPU (``SHARED_GPU_FLAGS``: a
KV pool capped at 65536 tokens, schedulers that sleep while idle; an 8B-shaped server then holds ~16 GB of weights
and ~8.6 GB of KV: by SGLang's memory check, which keeps 0.3 of the card free of each server, about two fit an 80 GB
card, three an H200), then batch
by batch every server is measured twice (``--repeats``), the systems in one order and then in the reverse (the
first order alternating between batches); a row keeps the mean and every timing (``runs``). With ``--round-robin``
a run is a single round of the batch (at batch 1 one request): the servers take turns round by round, seconds apart
instead of a whole measurement apart, and run ``r`` of every server serves the same prompts, so the report's
run-by-run ratios pair like with like (``--repeats`` rounds per server, e.g. 16). ``--rounds-per-run N`` makes a run
N rounds (run ``r`` rounds ``rN .. rN + N - 1``): at batch 1 one request's acceptance and the adaptive policy's
transients set a one-round run's rate (one H200, trained pair: the same cost-policy source 0.57-1.11x itself run by
run), N rounds average them while the servers still take turns.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import shlex
import shutil
import statistics
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from bench.interleave import (
    bring_up,
    combine_runs,
    core_shares,
    measure_in_turn,
    measurement_order,
    one_after_another,
    paired_line,
    paired_ratio,
    paired_section,
    pinned,
    repin,
    rotated,
)
from bench.serve import (
    MAX_NEW_TOKENS,
    line_plot,
    random_prompts,
    server_args,
    server_env,
    timed_request,
    verify_attention,
    write_models,
)
from sgl_eagle_triton.devtools import TRAINED_PAIR  # real acceptance (about 2 tokens per verify)
from sgl_eagle_triton.devtools.launcher import LAUNCH_SERVER, Server, exit_on_sigterm
from sgl_eagle_triton.devtools.testing import CODE_PROMPTS

ROOT = Path(__file__).resolve().parent.parent
SYSTEMS = {  # name: (algorithm, adaptive policy or None)
    "nospec": (None, None),
    # a second no-spec server beside it (--interleave): an A/A control, their ratio the spread of servers side by side
    "nospec_twin": (None, None),
    "eagle3": ("EAGLE3", None),
    "eagle_triton": ("EAGLE_TRITON", None),
    "eagle3_adaptive": ("EAGLE3", "sglang"),
    "eagle_triton_adaptive": ("EAGLE_TRITON", "sglang"),
    # the cost-aware policy (docs/adaptive.md); its steps 0 a plain decode step, held as SGLang's non-speculative
    # decode, where it can run (the defaults)
    "eagle_triton_cost": ("EAGLE_TRITON", "cost"),
    # the same with the plain step required on the speculative path (SYSTEM_ENV: SGLANG_EAGLE_TRITON_PLAIN_OFF=1
    # SGLANG_EAGLE_TRITON_OFF_NONSPEC=0), and with SGLang's steps-0 verify (PLAIN_OFF=0), beside it in one call
    "eagle_triton_cost_plain": ("EAGLE_TRITON", "cost"),
    "eagle_triton_cost_sglang_off": ("EAGLE_TRITON", "cost"),
    "eagle_triton_cost_trees": ("EAGLE_TRITON", "cost-trees"),  # the same over tree candidates (topk TREE_TOPK)
    "eagle_triton_cost_mixed": ("EAGLE_TRITON", "cost-mixed"),  # over chains and trees in one server
    # steps 0 for good (SGLang's policy with the one candidate 0) with SGLang's one-node verify (SYSTEM_ENV:
    # SGLANG_EAGLE_TRITON_PLAIN_OFF=0): what "off" costs against no-spec's plain decode step where the host sets the
    # cycle (the trained pair), the speculative scheduling path around every step
    "eagle_triton_off": ("EAGLE_TRITON", "off"),
    # the same with steps 0 as a plain decode step on the speculative path (SYSTEM_ENV: SGLANG_EAGLE_TRITON_PLAIN_OFF=1
    # SGLANG_EAGLE_TRITON_OFF_NONSPEC=0; off_step.py)
    "eagle_triton_off_plain": ("EAGLE_TRITON", "off"),
    # the same held as SGLang's non-speculative decode (SYSTEM_ENV: SGLANG_EAGLE_TRITON_OFF_NONSPEC=1, the default
    # wherever it can run; off_route.py)
    "eagle_triton_off_nonspec": ("EAGLE_TRITON", "off"),
    # the cost policy with its held steps 0 so required (SYSTEM_ENV), and on the speculative path (=0)
    "eagle_triton_cost_nonspec": ("EAGLE_TRITON", "cost"),
    "eagle_triton_cost_spec_path": ("EAGLE_TRITON", "cost"),
    # stock's steps 0 under the same config: SGLang's one-node verify and its full draft extend (a CUDA graph)
    "eagle3_off": ("EAGLE3", "off"),
    # the same without the draft extend (SYSTEM_ENV): SGLang's speculative path at steps 0 and nothing else, the floor
    # of any EAGLE V2 worker's "off" (its draft KV goes stale: fine for a server that never drafts again)
    "eagle3_off_skip": ("EAGLE3", "off"),
    # EAGLE_TRITON served from another source tree (--before-tree: e.g. the previous commit's sgl_eagle_triton), for an
    # A/B of a change beside eagle_triton under --interleave; the same for the steps-0 systems
    "eagle_triton_before": ("EAGLE_TRITON", None),
    "eagle_triton_cost_before": ("EAGLE_TRITON", "cost"),
    "eagle_triton_off_before": ("EAGLE_TRITON", "off"),
    "eagle_triton_off_plain_before": ("EAGLE_TRITON", "off"),
    "eagle_triton_off_nonspec_before": ("EAGLE_TRITON", "off"),
    # the lean draft phase required (SYSTEM_ENV: SGLANG_EAGLE_TRITON_LEAN_DRAFT=1; the default wherever it can run),
    # and SGLang's draft phase instead (=0), beside eagle_triton / eagle_triton_cost
    "eagle_triton_lean": ("EAGLE_TRITON", None),
    "eagle_triton_cost_lean": ("EAGLE_TRITON", "cost"),
    "eagle_triton_sglang_draft": ("EAGLE_TRITON", None),
    "eagle_triton_cost_sglang_draft": ("EAGLE_TRITON", "cost"),
    # greedy chains verified after the target's graph (SYSTEM_ENV: SGLANG_EAGLE_TRITON_VERIFY_IN_GRAPH=0) instead of
    # inside it (verify_epilogue.py, the default), beside eagle_triton(_cost)
    "eagle_triton_verify_after": ("EAGLE_TRITON", None),
    "eagle_triton_cost_verify_after": ("EAGLE_TRITON", "cost"),
    # the lean draft extend required (SYSTEM_ENV: SGLANG_EAGLE_TRITON_LEAN_EXTEND=1; the default wherever it can run),
    # and SGLang's draft extend instead (=0), beside eagle_triton(_cost)
    "eagle_triton_lean_extend": ("EAGLE_TRITON", None),
    "eagle_triton_cost_lean_extend": ("EAGLE_TRITON", "cost"),
    "eagle_triton_sglang_extend": ("EAGLE_TRITON", None),
    "eagle_triton_cost_sglang_extend": ("EAGLE_TRITON", "cost"),
}
SYSTEM_ENV = {"eagle3_off_skip": {"SGLANG_SPEC_SKIP_ZERO_STEP_DRAFT_EXTEND": "1"},  # a system's own server env
              "eagle_triton_cost_plain": {"SGLANG_EAGLE_TRITON_PLAIN_OFF": "1", "SGLANG_EAGLE_TRITON_OFF_NONSPEC": "0"},
              "eagle_triton_cost_sglang_off": {"SGLANG_EAGLE_TRITON_PLAIN_OFF": "0"},
              "eagle_triton_off": {"SGLANG_EAGLE_TRITON_PLAIN_OFF": "0"},
              "eagle_triton_off_before": {"SGLANG_EAGLE_TRITON_PLAIN_OFF": "0"},
              "eagle_triton_off_plain": {"SGLANG_EAGLE_TRITON_PLAIN_OFF": "1", "SGLANG_EAGLE_TRITON_OFF_NONSPEC": "0"},
              "eagle_triton_off_plain_before": {"SGLANG_EAGLE_TRITON_PLAIN_OFF": "1",
                                                "SGLANG_EAGLE_TRITON_OFF_NONSPEC": "0"},
              "eagle_triton_off_nonspec": {"SGLANG_EAGLE_TRITON_PLAIN_OFF": "1",
                                           "SGLANG_EAGLE_TRITON_OFF_NONSPEC": "1"},
              "eagle_triton_off_nonspec_before": {"SGLANG_EAGLE_TRITON_PLAIN_OFF": "1",
                                                  "SGLANG_EAGLE_TRITON_OFF_NONSPEC": "1"},
              "eagle_triton_cost_nonspec": {"SGLANG_EAGLE_TRITON_PLAIN_OFF": "1",
                                            "SGLANG_EAGLE_TRITON_OFF_NONSPEC": "1"},
              "eagle_triton_cost_spec_path": {"SGLANG_EAGLE_TRITON_OFF_NONSPEC": "0"},
              "eagle_triton_lean": {"SGLANG_EAGLE_TRITON_LEAN_DRAFT": "1"},
              "eagle_triton_cost_lean": {"SGLANG_EAGLE_TRITON_LEAN_DRAFT": "1"},
              "eagle_triton_sglang_draft": {"SGLANG_EAGLE_TRITON_LEAN_DRAFT": "0"},
              "eagle_triton_cost_sglang_draft": {"SGLANG_EAGLE_TRITON_LEAN_DRAFT": "0"},
              "eagle_triton_verify_after": {"SGLANG_EAGLE_TRITON_VERIFY_IN_GRAPH": "0"},
              "eagle_triton_cost_verify_after": {"SGLANG_EAGLE_TRITON_VERIFY_IN_GRAPH": "0"},
              "eagle_triton_lean_extend": {"SGLANG_EAGLE_TRITON_LEAN_EXTEND": "1"},
              "eagle_triton_cost_lean_extend": {"SGLANG_EAGLE_TRITON_LEAN_EXTEND": "1"},
              "eagle_triton_sglang_extend": {"SGLANG_EAGLE_TRITON_LEAN_EXTEND": "0"},
              "eagle_triton_cost_sglang_extend": {"SGLANG_EAGLE_TRITON_LEAN_EXTEND": "0"}}
BEFORE_SYSTEMS = [system for system in SYSTEMS if system.endswith("_before")]  # served from --before-tree
# asked for by name only: the draft phase and the draft extend pinned either way, the greedy verify after the graph
LEAN_SYSTEMS = [system for system in SYSTEMS
                if system.endswith(("_lean", "_sglang_draft", "_verify_after", "_lean_extend", "_sglang_extend"))]


def before_tree_env(tree: Path | None, pythonpath: str) -> dict:
    """The *_before systems' server environment: ``tree`` (holding an ``sgl_eagle_triton`` package) first on the
    server's ``sys.path``, ahead of the working directory (``PYTHONSAFEPATH``: ``python -m`` would put it first)."""
    if tree is None:
        return {}
    return {"PYTHONSAFEPATH": "1", "PYTHONPATH": os.pathsep.join(p for p in (str(tree), pythonpath) if p)}
# eagle_triton_cost's candidate step counts: SGLang 0.5.17's default brackets' union (0, 1, 3, 7) and 5, the chain
# of the real pair's best static shape (5,1,6) (rows: 'candidates'; rows without it ran 0, 1, 3, 7)
COST_CANDIDATES = [0, 1, 3, 5, 7]
# eagle_triton_cost_trees: (steps, TREE_TOPK, draft tokens) per candidate, and steps 0, all at topk TREE_TOPK: at
# large batches narrow trees (2, 8, 3), (3, 8, 4) verify as few tokens as the chains (2,1,3), (3,1,4) (their nodes
# the best of 8-wide levels), drafting 8 rows per request a level
TREE_TOPK, TREE_DRAFT_TOKENS = 8, {1: 2, 2: 3, 3: 4, 4: 16, 5: 32, 7: 64}
# eagle_triton_cost_mixed: chains (1,1,2), (2,1,3), (3,1,4) for large batches among the trees (candidates narrower
# than the server's topk, docs/adaptive.md)
MIXED_DRAFT_TOKENS = {1: [1, 2], 2: [1, 3], 3: [1, 4], 4: 16, 5: 32, 7: 64}
STOCK_ADAPTIVE_FIRST_STEPS = 7  # the widest candidate of SGLang 0.5.17's default brackets
SIMULATE_METHOD = "match-expected"


def spec_args(system: str, draft: Path, shape: tuple[int, int, int] | None, config_dir: Path) -> list[str]:
    """The server's speculative flags; the cost policy's config file is written into ``config_dir``."""
    algorithm, policy = SYSTEMS[system]
    if algorithm is None:
        return []
    args = ["--speculative-algorithm", algorithm, "--speculative-draft-model-path", str(draft)]
    if policy:
        args.append("--speculative-adaptive")
        if algorithm == "EAGLE3" and policy != "off":
            args += ["--speculative-num-steps", str(STOCK_ADAPTIVE_FIRST_STEPS)]
        if policy == "cost":
            config = config_dir / "adaptive-cost.json"
            config.write_text(json.dumps({"eagle_triton_policy": "cost", "1": {"candidate_steps": COST_CANDIDATES}}))
            args += ["--speculative-adaptive-config", str(config)]
        if policy == "off":
            # every batch up to 64 running requests has steps 0 alone; the server starts at the drafting candidate
            # of a bracket no batch reaches (an adaptive start at steps 0 is refused: config.handle_server_args)
            config = config_dir / "adaptive-off.json"
            config.write_text(json.dumps({"1": {"candidate_steps": [0]}, "65": {"candidate_steps": [1]}}))
            args += ["--speculative-adaptive-config", str(config), "--speculative-num-steps", "1"]
        if policy in ("cost-trees", "cost-mixed"):
            config = config_dir / f"adaptive-{policy}.json"
            given = TREE_DRAFT_TOKENS if policy == "cost-trees" else MIXED_DRAFT_TOKENS
            trees = {"eagle_triton_policy": "cost", "1": {"candidate_steps": [0, *given]},
                     "eagle_triton_draft_tokens": {str(s): n for s, n in given.items()}}
            config.write_text(json.dumps(trees))
            args += ["--speculative-adaptive-config", str(config), "--speculative-eagle-topk", str(TREE_TOPK),
                     "--speculative-num-steps", "3"]
        return args
    steps, topk, n = shape
    return [*args, "--speculative-num-steps", str(steps), "--speculative-eagle-topk", str(topk),
            "--speculative-num-draft-tokens", str(n)]


def real_pair_args(batches: list[int]) -> list[str]:
    """:func:`bench.serve.server_args` for real weights: without ``--load-format dummy`` and
    ``--skip-tokenizer-init`` (the trained pair's prompts are text)."""
    args = server_args(batches)
    for flag, values in (("--load-format", 1), ("--skip-tokenizer-init", 0)):
        i = args.index(flag)
        del args[i:i + 1 + values]
    return args


def simulation_env(acc_len: float, profile: str | None = None) -> dict[str, str]:
    """Every server's acceptance: the tree-aware ``profile`` (sgl_eagle_triton.simulated_acceptance, applied to
    stock servers too) or SGLang's depth-only ``SGLANG_SIMULATE_ACC_LEN``."""
    if profile:
        return {"SGLANG_EAGLE_TRITON_SIMULATED_ACCEPTANCE": profile, "SGLANG_EAGLE_TRITON_BENCHMARK": "1"}
    return {"SGLANG_SIMULATE_ACC_LEN": str(acc_len), "SGLANG_SIMULATE_ACC_METHOD": SIMULATE_METHOD,
            "SGLANG_SIMULATE_ACC_TOKEN_MODE": "fixed"}


def acceptance_label(acc_len: float, profile: str | None = None) -> str:
    return f"simulated:{profile}" if profile else f"simulated:sglang-{SIMULATE_METHOD}-{acc_len:g}"


def tok_per_s(results: list[dict]) -> float:
    """The batch's decode rate: per request (output tokens - 1) / (last chunk - first chunk), summed."""
    return sum((r["meta"]["completion_tokens"] - 1) / (r["times"][-1] - r["times"][0]) for r in results
               if len(r["times"]) > 1)


def longest_gap_ms(results: list[dict]) -> float:
    """The longest wait between two chunks of one request: a stall of the whole batch (e.g. a kernel compiled mid
    round) shows here, where the rate of a round only drops."""
    return 1e3 * max((b - a for r in results for a, b in zip(r["times"], r["times"][1:], strict=False)), default=0.0)


def prompts_for(batch: int, seed: int, real: bool) -> list:
    """``batch`` prompts: random 128-token ids for dummy weights, the code prompts in turn for the trained pair
    (which accepts what it was trained on)."""
    if not real:
        return random_prompts(batch, seed)
    return [CODE_PROMPTS[(seed + i) % len(CODE_PROMPTS)] for i in range(batch)]


# A batch smaller than this is measured over several rounds (batch 1: 16 requests one after another): one request's
# simulated acceptance is noisy (H100 sweep 2026-11-27: two servers in the same 7-step chain at batch 1 accepted 3.56
# and 4.34 tokens per verify over one 256-token request each, and their tok/s differed by exactly that ratio), and
# 8 requests were too few at batch 4 (H200 sweep 2026-11-27: two rounds of about 0.5 s, one 104 ms stall = 5 %)
MIN_REQUESTS = 16


def rounds_for(batch: int) -> int:
    return max(1, -(-MIN_REQUESTS // batch))


def warm_up(url: str, batch: int, real: bool = False) -> None:
    """One request alone, then one batch of ``batch`` (adaptive servers settle their EMA here)."""
    timed_request(url, prompts_for(1, 99, real)[0])
    with ThreadPoolExecutor(batch) as pool:
        list(pool.map(lambda p: timed_request(url, p), prompts_for(batch, 1, real)))


def freeze_gc(ready: list[tuple], real: bool) -> None:
    """``--freeze-gc``: each ready ``(system, shape, server, attention)`` serves one request, then its tokenizer,
    scheduler and detokenizer freeze their garbage collectors (SGLang's ``/freeze_gc``): the objects alive then are
    never collected again, so full collections no longer walk the models and graph runners."""
    for _, _, server, _ in ready:
        timed_request(server.url, prompts_for(1, 98, real)[0])
        server.post("/freeze_gc", {})


def measure(url: str, batch: int, real: bool = False, first_round: int = 0, rounds: int | None = None,
            warm: bool = True) -> dict:
    """After :func:`warm_up` (unless ``warm`` is False), ``rounds`` (default :func:`rounds_for`) rounds of ``batch``
    concurrent requests, round ``r`` on the prompts of seed ``0`` (r = 0) or ``100 + r``, from ``first_round`` on:
    ``tok_per_s`` the mean over rounds of each round's :func:`tok_per_s`, ``accept_len`` the mean over requests,
    ``longest_gap_ms`` the longest :func:`longest_gap_ms` of the rounds."""
    if warm:
        warm_up(url, batch, real)
    rounds = rounds_for(batch) if rounds is None else rounds
    with ThreadPoolExecutor(batch) as pool:
        results = [list(pool.map(lambda p: timed_request(url, p), prompts_for(batch, 0 if r == 0 else 100 + r, real)))
                   for r in range(first_round, first_round + rounds)]
    return {"tok_per_s": statistics.mean(tok_per_s(round_) for round_ in results),
            "accept_len": statistics.mean(r["meta"].get("spec_accept_length", 1.0) for round_ in results
                                          for r in round_),
            "rounds": rounds, "longest_gap_ms": max(longest_gap_ms(round_) for round_ in results)}


def card(r: dict) -> str:
    """The card a row ran on (rows written before rows recorded it: "0", one card)."""
    return str(r.get("card", "0"))


# --interleave's run modes: the row key a mode sets (True) and its label. Rows of other modes never replace one
# another nor pair in a ratio.
RUN_MODES = {"round_robin": "round-robin", "freeze_gc": "freeze-gc", "pin_cores": "pinned", "rotate_cores": "rotated"}


def run_modes(r: dict) -> tuple:
    return (*(r.get(key, False) for key in RUN_MODES), r.get("rounds_per_run", 1))


def row_key(r: dict) -> tuple:
    return (r["system"], r["steps"], r["topk"], r["draft_tokens"], r["batch"], r["acceptance"], card(r),
            r.get("env", ""), r.get("flags", ""), *run_modes(r))


def merge_rows(path: Path, new_rows: list[dict]) -> list[dict]:
    rows = {row_key(r): r for r in (json.loads(path.read_text()) if path.exists() else [])}
    rows.update({row_key(r): r for r in new_rows})
    return sorted(rows.values(), key=lambda r: tuple(str(k) for k in row_key(r)))


def label(r: dict, cards: bool = False) -> str:
    """The system and its shape; with ``cards``, also the card it ran on."""
    name = r["system"] if r["system"] == "nospec" or r["steps"] is None else (
        f"{r['system']} ({r['steps']},{r['topk']},{r['draft_tokens']})")
    modes = [mode for key, mode in RUN_MODES.items() if r.get(key)]
    if r.get("rounds_per_run", 1) > 1:
        modes.append(f"{r['rounds_per_run']} rounds a run")
    extra = " ".join(x for x in (r.get("env"), r.get("flags"), *modes) if x)  # --server-env, --server-flags, run modes
    if extra:
        name = f"{name} {{{extra}}}"
    return f"{name} [card {card(r)}]" if cards else name


def report(rows: list[dict]) -> str:
    """Markdown: tok/s per system and batch, over no-spec and over the best other system at that batch. Where the
    sweep ran in lanes on several cards of one host, both ratios use each system's tok/s over its own card's no-spec
    (card-to-card differences cancel; a row without its card's no-spec gets no ratio)."""
    if not rows:
        return ""
    by_batch: dict = {}
    for r in rows:
        by_batch.setdefault((r["batch"], r["acceptance"]), []).append(r)
    cards = sorted({card(r) for r in rows})
    lines = [f"# Adaptive sweep on {rows[0]['gpu']}, SGLang {rows[0]['sglang_version']}", ""]
    if len(cards) > 1:
        lines += [f"Systems ran in shares labelled {', '.join(cards)} (lanes on cards of one host, or calls), no-spec "
                  "in each: `/ nospec` is against the same share's no-spec, and `/ best other` compares those ratios "
                  "(each card's speed cancels).", ""]
    lines += ["| acceptance | batch | system | tok/s | accept len | / nospec | / best other | longest gap ms |",
              "|---|---|---|---|---|---|---|---|"]
    for (batch, acceptance), group in sorted(by_batch.items()):
        nospec = {card(r): r["tok_per_s"] for r in group if r["system"] == "nospec"}

        def speed(r, nospec=nospec):  # tok/s; across cards: over the card's own no-spec (None without one)
            if len(cards) == 1:
                return r["tok_per_s"]
            base = nospec.get(card(r))
            return r["tok_per_s"] / base if base else None

        for r in sorted(group, key=lambda r: -r["tok_per_s"]):
            others = [speed(o) for o in group if o is not r and speed(o) is not None]
            base = nospec.get(card(r))  # none on this card: no ratio
            vs_nospec = f"{r['tok_per_s'] / base:.2f}" if base and r["system"] != "nospec" else "-"
            vs_best = f"{speed(r) / max(others):.2f}" if others and speed(r) is not None else "-"
            gap = f"{r['longest_gap_ms']:.0f}" if "longest_gap_ms" in r else "-"  # older rows have none
            lines.append(f"| {acceptance} | {batch} | {label(r, len(cards) > 1)} | {r['tok_per_s']:.0f} | "
                         f"{r['accept_len']:.2f} | {vs_nospec} | {vs_best} | {gap} |")
    return ("\n".join(lines) + "\n" + targets_table(by_batch) + paired_table(by_batch) + arms_section(rows)
            + states_section(rows) + price_runs_section(rows))


# the issue's targets (docs/off-step-design.md): (title, system, what it is measured against, floor)
TARGETS = (("cost / no-spec", "eagle_triton_cost", "nospec", 1.0),
           ("cost / best static", "eagle_triton_cost", "static", 0.97),
           ("steps 0 on the speculative path / no-spec", "eagle_triton_off_plain", "nospec", 0.97),
           ("steps 0 held as no-spec decode (the default) / no-spec", "eagle_triton_off_nonspec", "nospec", 0.97))


def targets_table(by_batch: dict) -> str:
    """Markdown: per batch, the run-by-run geometric mean and 90 % interval of each of :data:`TARGETS` among
    interleaved rows of one card and sweep (``static``: the static EAGLE_TRITON shape of most tok/s at that batch),
    marked against its floor: ``met`` (the mean at or above it), ``below`` (the interval under it), else
    ``unresolved``. "" where no target's systems ran together."""
    lines = []
    for (batch, _), group in sorted(by_batch.items()):
        cells, found = [], False
        for _, system, against, floor in TARGETS:
            mine = next((r for r in group if r["system"] == system), None)
            if against == "static":
                static = [o for o in group if o["system"] == "eagle_triton" and o.get("steps")]
                other = max(static, key=lambda o: o["tok_per_s"], default=None)
            else:
                other = next((o for o in group if o["system"] == against), None)
            p = paired_runs(mine, other) if mine and other else None
            if p is None:
                cells.append("-")
                continue
            found = True
            verdict = "met" if p["geomean"] >= floor else "below" if p["high"] < floor else "unresolved"
            cells.append(f"{p['geomean']:.2f} ({p['low']:.2f}-{p['high']:.2f}) {verdict}")
        if found:
            lines.append(f"| {batch} | " + " | ".join(cells) + " |")
    if not lines:
        return ""
    head = " | ".join(f"{title} (floor {floor})" for title, _, _, floor in TARGETS)
    intro = ("The issue's targets, run by run (geometric mean, 90 % interval; met: the mean at or above the floor, "
             "below: the interval under it):")
    return "\n".join(["", intro, "", f"| batch | {head} |", "|---|" + "---|" * len(TARGETS), *lines, ""])


def arms_section(rows: list[dict]) -> str:
    """Markdown: rows of servers that ran an A/B inside themselves (``arms``: SGLANG_EAGLE_TRITON_AB_STEPS), each
    arm's median host time and the on / off ratios summary line by line; "" without any."""
    armed = [r for r in rows if r.get("arms")]
    if not armed:
        return ""
    lines = ["", "A/B inside each server (the arms alternate every SGLANG_EAGLE_TRITON_AB_STEPS decode steps; host "
             "ms, medians of the cycle timing's arm lines over the batch's runs; ratios on / off line by line, "
             "geometric mean and 90 % interval):", "",
             "| batch | system | arms (on / off) | lines | host period on / off | in forward on / off | "
             "period ratio | in forward ratio |", "|---|---|---|---|---|---|---|---|"]
    for r in sorted(armed, key=lambda r: (r["batch"], r["system"])):
        a = r["arms"]

        def pair(key, a=a):
            on, off = a["on"][key], a["off"][key]
            return "-" if on is None or off is None else f"{on:.3f} / {off:.3f}"

        def ratio(key, a=a):
            p = a["ratio"][key]
            return "-" if p is None else f"{p['geomean']:.3f} ({p['low']:.3f}-{p['high']:.3f})"

        lines.append(f"| {r['batch']} | {label(r)} | {' / '.join(a['names'])} | {a['lines']} | {pair('host_period')} "
                     f"| {pair('host_in_forward')} | {ratio('host_period')} | {ratio('host_in_forward')} |")
    return "\n".join(lines) + "\n"


def arms_state(server, seen: dict) -> dict | None:
    """Row key ``arms`` of a server running an A/B inside itself (SGLANG_EAGLE_TRITON_AB_STEPS): the cycle timing's
    arm lines its log gained since the last call (``seen``: lines already read, by server name), folded by
    :func:`bench.stage_split.arms` (``names``: on, off; per arm the median host period and time in
    ``forward_batch_generation``; their ratios line by line); None without new lines."""
    from bench import stage_split

    lines = [line for line in server.log().splitlines() if "cycle timing arms" in line]
    new, seen[server.name] = lines[seen.get(server.name, 0):], len(lines)
    folded = stage_split.arms("\n".join(new), skip=0) if new else None
    if not folded or not folded["lines"]:
        return None
    on, off = folded["names"]
    return {"names": [on, off], "lines": folded["lines"],
            "on": {key: folded[on, key] for key in stage_split.ARM_KEYS},
            "off": {key: folded[off, key] for key in stage_split.ARM_KEYS},
            "ratio": {key: folded["ratio", key] for key in stage_split.ARM_KEYS}}


def states_state(server, seen: dict) -> dict | None:
    """Row key ``states`` of an adaptive EAGLE server whose worker the cycle timing times
    (SGLANG_EAGLE_TRITON_CYCLE_TIMING without the scheduler-only scope): rank 0's per-state lines
    (``CycleTiming.states_summary``) its log gained since the last call (``seen``: lines already read, by server
    name); per state the decode steps it ran and, weighted by each line's steps, the mean host period and host time
    in ``forward_batch_generation`` (ms), and where the lines give them the median period (``median_period``, ms) and
    the share of the period's time in pauses (``paused``: the cost policy's pause rule; weighted by each line's period
    time); None without new lines."""
    from sgl_eagle_triton.cycle_timing import parse_arm_summaries

    lines = [line for line in server.log().splitlines() if "cycle timing states" in line]
    new, seen[server.name] = lines[seen.get(server.name, 0):], len(lines)
    parsed = [line["arms"] for line in parse_arm_summaries("\n".join(new), states=True) if line["rank"] == 0]
    if not parsed:
        return None
    out = {}
    for state in sorted({state for line in parsed for state in line}):
        ran = [line[state] for line in parsed if state in line]
        steps = sum(r["steps"] for r in ran)
        timed = [r for r in ran if r["host_period"] is not None]
        weight = sum(r["steps"] for r in timed)
        out[state] = {"steps": steps, "lines": len(ran),
                      "host_period": round(sum(r["host_period"] * r["steps"] for r in timed) / weight, 3)
                      if weight else None,
                      "host_in_forward": round(sum(r["host_in_forward"] * r["steps"] for r in ran) / steps, 3)}
        spread = [r for r in timed if "median_period" in r]
        if spread:
            time_ms = sum(r["host_period"] * r["steps"] for r in spread)
            out[state]["median_period"] = round(sum(r["median_period"] * r["steps"] for r in spread)
                                                / sum(r["steps"] for r in spread), 3)
            paused = sum(r["paused"] * r["host_period"] * r["steps"] for r in spread)
            out[state]["paused"] = round(paused / time_ms, 3) if time_ms > 0 else 0.0
    return out


def run_with_cycles(server, seen: dict, run) -> dict:
    """The result of ``run()``, one run of ``server`` (``--interleave``), with key ``cycles`` where the cycle timing's
    per-state lines (``states``: :func:`states_state` of the lines its log gained during the run; ``seen`` by server
    name; the lines logged before it, start-up's and warm-ups', belong to no run) or the cost policy's prices
    (``prices``: per "steps,bucket" its graphs' replay + learnt rest in ms at the run's end) exist: each run's prices
    beside the periods the same run's cycles had (a spell of a slow host moves both; a price at the end of a batch's
    runs beside the mean period of all of them does not compare)."""
    states_state(server, seen)
    result = run()
    cycles = {}
    states = states_state(server, seen)
    if states:
        cycles["states"] = states
    policy = policy_state(server) or {}
    replay, rest = policy.get("replay_ms") or {}, policy.get("rest_ms") or {}
    if rest:
        cycles["prices"] = {key: round(replay[key] + ms, 3) for key, ms in rest.items() if key in replay}
    if cycles:
        result["cycles"] = cycles
    return result


def price_key(state: str, batch: int) -> str | None:
    """The cost policy's "steps,bucket" key of a per-state line's ``state`` ("steps5", "steps0-held") at ``batch``;
    None for a resume step, which the policy does not time."""
    steps, _, kind = state.removeprefix("steps").partition("-")
    return None if kind == "resume" else f"{steps},{batch}"


def price_runs_section(rows: list[dict]) -> str:
    """Markdown: per cost-policy row with per-run cycles (``run_cycles``: :func:`run_with_cycles`), each state's price
    over the median period its cycles had in the same run, run by run (runs where the state ran and has a price),
    with the geometric mean and its 90 % interval: 1.0 where the policy prices the state at its cycle; "" without
    such rows."""
    lines = []
    for r in sorted(rows, key=lambda r: (r["batch"], r["system"])):
        runs = r.get("run_cycles") or []
        names = sorted({state for c in runs for state in c.get("states", {})})
        for state in names:
            key = price_key(state, r["batch"])
            if key is None:
                continue
            # steps 0's price where it is held is the held cycles' (a step 0 on the speculative path: a turn into it)
            pairs = [(c["prices"][key], c["states"][state]["median_period"]) for c in runs
                     if key in c.get("prices", {}) and c.get("states", {}).get(state, {}).get("median_period")
                     and not (state == "steps0" and "steps0-held" in c["states"])]
            p = paired_ratio([a for a, _ in pairs], [b for _, b in pairs])
            if p:
                lines.append(paired_line(f"{label(r)}: {state}", r["batch"], p))
    if not lines:
        return ""
    return paired_section("the cost policy's price of a state at the run's end over the median period of the "
                          "state's cycles in that run (the cycle timing's per-state lines)", "system: state", lines)


def states_section(rows: list[dict]) -> str:
    """Markdown: rows whose server logged the cycle timing per state (``states``): each state's steps, host period and
    time in ``forward_batch_generation``, beside the cost policy's price of that state's cycle at the batch (its
    graphs' replay + its learnt rest outside them: ``policy.replay_ms`` + ``policy.rest_ms``, where it has both; none
    beside ``steps0-resume``, a step the policy does not time); "" without any."""
    timed = [r for r in rows if r.get("states")]
    if not timed:
        return ""
    lines = ["", "Cycles by state (the cycle timing's per-state lines, steps-weighted means over the batch's runs; "
             "host ms; median: the lines' median periods; in pauses: the share of the period's time in periods over "
             "the cost policy's pause rule, 2x the median + 1 ms, which it leaves out of a price; policy price: the "
             "cost policy's cycle there, graphs' replay + learnt rest; timed / dropped: the cycles it timed there "
             "and dropped as pauses):", "",
             "| batch | system | state | steps | host period | median | in pauses | in forward | policy price | "
             "timed / dropped |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for r in sorted(timed, key=lambda r: (r["batch"], r["system"])):
        policy = r.get("policy") or {}
        for state, s in r["states"].items():
            key = price_key(state, r["batch"])
            replay, rest = (policy.get("replay_ms") or {}).get(key), (policy.get("rest_ms") or {}).get(key)
            price = "-" if replay is None or rest is None else f"{replay + rest:.3f}"
            period = "-" if s["host_period"] is None else f"{s['host_period']:.3f}"
            median = f"{s['median_period']:.3f}" if "median_period" in s else "-"
            paused = f"{s['paused']:.3f}" if "paused" in s else "-"
            timed_dropped = (policy.get("timed_dropped") or {}).get(key)
            counts = "-" if timed_dropped is None else f"{timed_dropped[0]} / {timed_dropped[1]}"
            lines.append(f"| {r['batch']} | {label(r)} | {state} | {s['steps']} | {period} | {median} | {paused} | "
                         f"{s['host_in_forward']:.3f} | {price} | {counts} |")
    return "\n".join(lines) + "\n"


def paired_table(by_batch: dict) -> str:
    """Markdown: for interleaved rows (``runs``), each cost policy's (and ``eagle_triton_off``'s: steps 0 against a
    plain decode step) tok/s over every other system of its batch, card and sweep (``session``; rows written before
    sessions were recorded pair by key), run by run (:func:`bench.interleave.paired_ratio`), with the geometric mean
    and its 90 % interval."""
    lines = []
    for (batch, _), group in sorted(by_batch.items()):
        for r in group:
            if not str(SYSTEMS.get(r["system"], (None, None))[1]).startswith(("cost", "off")):
                continue
            for other in sorted(group, key=lambda o: -o["tok_per_s"]):
                p = paired_runs(r, other) if other is not r else None
                if p:
                    lines.append(paired_line(f"{label(r)} / {label(other)}", batch, p))
    return paired_section("tok/s ratios", "systems", lines)


def paired_runs(a: dict, b: dict) -> dict | None:
    """Row ``a``'s tok/s over row ``b``'s run by run (:func:`bench.interleave.paired_ratio`), where both ran
    interleaved on one card in one sweep (``session``) under the same run modes; else None."""
    if card(a) != card(b) or a.get("session") != b.get("session") or run_modes(a) != run_modes(b):
        return None
    return paired_ratio(a.get("runs", []), b.get("runs", []))


def plot(rows: list[dict], path: Path) -> None:
    series: dict = {}
    cards = len({card(r) for r in rows}) > 1
    for r in rows:
        series.setdefault(label(r, cards), []).append((r["batch"], r["tok_per_s"]))
    line_plot(series, path, "output tok/s (whole batch)", f"{rows[0]['gpu']}, {rows[0]['acceptance']}", log_y=True,
              dashed=lambda name: "(" in name or name.startswith("nospec"))  # static: dashed


def save(path: Path, rows: list[dict]) -> None:
    merged = merge_rows(path, rows)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(merged, indent=1))
    path.with_suffix(".md").write_text(report(merged))
    plot(merged, path.with_suffix(".png"))


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workdir", type=Path, default=Path("/tmp/bench-models"))
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "adaptive.json")
    parser.add_argument("--systems", nargs="+", choices=list(SYSTEMS),
                        default=[s for s in SYSTEMS if s not in BEFORE_SYSTEMS and s not in LEAN_SYSTEMS])
    parser.add_argument("--shapes", nargs="+", default=[(5, 8, 32), (4, 4, 16), (3, 1, 4)],  # large, mid, chain
                        type=lambda s: tuple(int(x) for x in s.split(",")), help="static systems' trees")
    parser.add_argument("--batches", nargs="+", type=int, default=[1, 4, 8, 16, 32, 64])
    parser.add_argument("--simulate-acc-len", type=float, default=3.5)
    parser.add_argument("--acceptance-profile", help="tree-aware simulated acceptance profile (bench/README.md) "
                        "instead of SGLang's --simulate-acc-len, e.g. llama31-8b-eagle3")
    parser.add_argument("--card", default=os.environ.get("CUDA_VISIBLE_DEVICES", "0"),
                        help="the card label rows carry (default CUDA_VISIBLE_DEVICES): runs on several one-GPU "
                             "machines, merged, need one label each (each compared with its own no-spec)")
    parser.add_argument("--server-env", nargs="*", default=[], metavar="KEY=VALUE",
                        help="extra environment of every server, e.g. a trial's knob (rows: 'env', part of their key)")
    parser.add_argument("--server-flags", default="", help="extra flags of every server, e.g. '--attention-backend "
                        "flashinfer' (rows: 'flags', part of their key)")
    parser.add_argument("--before-tree", type=Path, help="the *_before systems serve the sgl_eagle_triton package of "
                        "this folder (e.g. git archive of an earlier commit), the rest of their path as the others'")
    parser.add_argument("--real-pair", action="store_true",
                        help="serve the trained tiny pair with its real acceptance instead of 8B dummy shapes")
    parser.add_argument("--repeats", type=int, default=2,
                        help="with --interleave: runs per server and batch, the order reversed each run")
    parser.add_argument("--round-robin", action="store_true",
                        help="with --interleave: a run is one round of the batch (servers in turn round by round, "
                             "each round's prompts the same for every server), --repeats rounds per server after "
                             "one warm-up each")
    parser.add_argument("--rounds-per-run", type=int, default=1,
                        help="with --round-robin: rounds in each run (default 1; at batch 1 a round is one request)")
    parser.add_argument("--interleave", action="store_true",
                        help="with --real-pair: start every server at once and measure them batch by batch, each "
                             "batch twice (--repeats) in alternating order (rows: the mean, 'runs' each)")
    parser.add_argument("--pin-cores", action="store_true",
                        help="with --interleave: each server's processes on a share of the host's cores of their own "
                             "(taskset), this process on the rest (rows: 'pin_cores'; bench.interleave.core_shares)")
    parser.add_argument("--rotate-cores", action="store_true",
                        help="with --pin-cores: before each run every server's processes move to the next share, so "
                             "that over a batch's repeats each server runs on every share (rows: 'rotate_cores'; "
                             "bench.interleave.rotated)")
    parser.add_argument("--freeze-gc", action="store_true",
                        help="with --interleave: once every server is up and has served one request, freeze its "
                             "processes' garbage collector (SGLang's POST /freeze_gc), every system alike (rows: "
                             "'freeze_gc')")
    parser.add_argument("--report", type=Path, help="only write the table and plot of this JSON")
    parser.add_argument("--merge", nargs="+", type=Path, help="only merge these sweeps' rows (e.g. lanes on several "
                        "cards, each with its own no-spec) into --out, with its table and plot")
    args = parser.parse_args(argv)
    before = [system for system in args.systems if system in BEFORE_SYSTEMS]
    if before and args.before_tree is None:
        parser.error(f"{', '.join(before)} need --before-tree DIR (a tree holding the sgl_eagle_triton to compare)")
    return args


def main(argv=None):
    args = parse_args(argv)
    exit_on_sigterm()  # a `timeout` around a sweep still stops the server it started
    if args.report:
        rows = json.loads(args.report.read_text())
        args.report.with_suffix(".md").write_text(report(rows))
        plot(rows, args.report.with_suffix(".png"))
        return
    if args.merge:
        save(args.out, [r for path in args.merge for r in json.loads(path.read_text())])
        return
    if args.repeats < 1:
        raise SystemExit("bench.adaptive: --repeats: at least 1")
    if args.round_robin and not args.interleave:
        raise SystemExit("bench.adaptive: --round-robin needs --interleave")
    if args.rounds_per_run < 1 or (args.rounds_per_run > 1 and not args.round_robin):
        raise SystemExit("bench.adaptive: --rounds-per-run: a whole number >= 1, above 1 with --round-robin only")
    if len(set(args.batches)) < len(args.batches):
        raise SystemExit("bench.adaptive: a batch named twice in --batches (one row a batch: the later run would "
                         "replace the earlier); measure repeats with --interleave --repeats N")
    if args.freeze_gc and not args.interleave:
        raise SystemExit("bench.adaptive: --freeze-gc needs --interleave")
    if args.pin_cores and not args.interleave:
        raise SystemExit("bench.adaptive: --pin-cores needs --interleave")
    if args.rotate_cores and not args.pin_cores:
        raise SystemExit("bench.adaptive: --rotate-cores needs --pin-cores")
    if args.pin_cores and shutil.which("taskset") is None:
        raise SystemExit("bench.adaptive: --pin-cores needs taskset (util-linux) on this host")
    import sglang
    import torch

    if args.real_pair:
        target, draft = TRAINED_PAIR / "target", TRAINED_PAIR / "eagle3"
        base_args, env, acceptance = real_pair_args(args.batches), {}, "real:tiny-code-v1"
    else:
        target, draft = write_models(args.workdir)
        base_args = server_args(args.batches)
        env = simulation_env(args.simulate_acc_len, args.acceptance_profile)
        acceptance = acceptance_label(args.simulate_acc_len, args.acceptance_profile)
    args.workdir.mkdir(parents=True, exist_ok=True)
    meta = dict(acceptance=acceptance, gpu=torch.cuda.get_device_name(), sglang_version=sglang.__version__,
                date=str(datetime.date.today()), card=args.card, env=" ".join(args.server_env),
                flags=args.server_flags, max_new_tokens=MAX_NEW_TOKENS)
    if args.interleave:  # the report pairs runs of one sweep only (bench.interleave.paired_ratio)
        meta["session"] = datetime.datetime.now().isoformat(timespec="seconds")
    if args.round_robin:  # its rows never replace, nor are replaced by, rows measured a whole measurement per run
        meta["round_robin"] = True
        if args.rounds_per_run > 1:
            meta["rounds_per_run"] = args.rounds_per_run
    if args.freeze_gc:
        meta["freeze_gc"] = True
    # the working directory (this tree) and everything the servers' path had, after the other tree
    before = before_tree_env(args.before_tree, os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    servers = [(system, shape) for system in args.systems
               for shape in ([None] if SYSTEMS[system][0] is None or SYSTEMS[system][1] else args.shapes)]
    programs = {entry: LAUNCH_SERVER for entry in servers}
    rotate = None
    if args.pin_cores:
        try:
            shares, client = core_shares(list(os.sched_getaffinity(0)), len(servers))
        except ValueError as e:
            raise SystemExit(f"bench.adaptive: --pin-cores: {e}") from None
        programs = {entry: pinned(LAUNCH_SERVER, share) for entry, share in zip(servers, shares, strict=True)}
        os.sched_setaffinity(0, client)
        meta["pin_cores"] = True
        if args.rotate_cores:
            meta["rotate_cores"] = True

            def rotate(entry, run):  # the server's session (process group) onto its share of this run
                repin(entry[2].proc.pid, rotated(shares, servers.index(entry[:2]), run))

    def start(system, shape, extra=()):
        name = f"{system}-{'-'.join(map(str, shape or ()))}".rstrip("-")
        return Server(name, str(target), [*base_args, *spec_args(system, draft, shape, args.workdir),
                                          *shlex.split(args.server_flags), *extra],
                      args.workdir, env={**env, **SYSTEM_ENV.get(system, {}), **server_env(args.server_env),
                                         **(before if system in BEFORE_SYSTEMS else {})},
                      program=programs[system, shape])

    if args.interleave:
        return interleaved(servers, start, args, meta, rotate)

    arm_lines, state_lines = {}, {}

    def measure_batch(system, shape, server, attention, batch):
        result = measure(server.url, batch, args.real_pair)
        print(server.name, batch, result, flush=True)
        return row(system, shape, batch, meta, attention, result, policy_state(server), arms_state(server, arm_lines),
                   states_state(server, state_lines))

    # a server that failed to start or serve: the sweep goes on without it
    one_after_another(servers, start, verify_attention, measure_batch, args.batches, lambda rows: save(args.out, rows),
                      keep_going=True)


def row(system: str, shape, batch: int, meta: dict, attention: str, result: dict, policy: dict | None = None,
        arms: dict | None = None, states: dict | None = None) -> dict:
    out = dict(system=system, steps=shape[0] if shape else None, topk=shape[1] if shape else None,
               draft_tokens=shape[2] if shape else None, batch=batch, **meta, verify_attention=attention,
               candidates=COST_CANDIDATES if SYSTEMS[system][1] == "cost" else None, **result)
    if policy is not None:
        out["policy"] = policy
    if arms is not None:
        out["arms"] = arms
    if states is not None:
        out["states"] = states
    return out


# of the cost policy's report, kept in rows
POLICY_KEYS = ("switches", "probes", "reprices", "depth_rates", "replay_ms", "rest_ms", "rest_spread_ms",
               "timed_dropped")


def policy_state(server) -> dict | None:
    """Row key ``policy`` of an EAGLE_TRITON adaptive server after a batch, from its ``/server_info``: the decode steps
    run at each step count since start (``steps_in_force``), how its steps 0 ran (``steps_0``: plain steps, those
    whose token and fill came from the target graph, resumes, and the plain steps held as a non-speculative batch
    (``held``, where that route runs: the default); all since start) and, under the cost policy, its
    switches, depth rates, graph replays and learnt rests with their spreads (:data:`POLICY_KEYS`): what it chose,
    how its choice ran, and the prices it chose by. None for other servers."""
    from sgl_eagle_triton.off_route import NONSPEC_STEP
    from sgl_eagle_triton.off_step import PLAIN_OFF_STEP
    from sgl_eagle_triton.worker import GRAPH_EPILOGUE

    state = server.get_json("/server_info")["internal_states"][0].get("eagle_triton", {})
    if "adaptive_steps_in_force" not in state:
        return None
    policy, ran = state.get("adaptive_policy") or {}, state.get("ran") or {}
    steps_0 = {"plain": ran.get(PLAIN_OFF_STEP, 0), "graph_epilogue": ran.get(GRAPH_EPILOGUE, 0),
               "resumes": state.get("adaptive_resumes", 0), "held": ran.get(NONSPEC_STEP, 0)}
    return {"steps_in_force": state["adaptive_steps_in_force"], "steps_0": steps_0,
            **{k: policy[k] for k in POLICY_KEYS if k in policy}}


def interleaved(servers: list[tuple], start, args, meta: dict, rotate=None) -> None:
    """``--interleave``: every server up at once; per batch each measured ``--repeats`` times, in alternating order;
    a row keeps the mean ``tok_per_s`` and ``accept_len`` of the runs and every timing (``runs``). The cost policies'
    servers start first, one at a time (each times its states' CUDA graphs at start-up, which other servers compiling
    and capturing on the same GPU would disturb), the others together once those are ready. A server that fails to start
    is left out; one that fails while serving stops the sweep with the rows so far saved. ``rotate(entry, run)``
    (``--rotate-cores``) runs before each measurement."""
    def is_cost(entry):
        return str(SYSTEMS[entry[0]][1]).startswith("cost")

    started, rows, arm_lines, state_lines, run_lines = [], [], {}, {}, {}
    try:
        ready = bring_up([*([s] for s in servers if is_cost(s)), [s for s in servers if not is_cost(s)]], start,
                         verify_attention, started)
        ready.sort(key=lambda r: servers.index((r[0], r[1])))  # measured in --systems order
        if args.freeze_gc:
            freeze_gc(ready, args.real_pair)
        for i, batch in enumerate(args.batches):
            if args.round_robin:  # every server warmed up first, then N rounds a run: run r on rounds rN .. rN + N - 1
                for entry in measurement_order(ready, i, 1):
                    warm_up(entry[2].url, batch, args.real_pair)
            for entry in ready:  # start-up's steps and the warm-ups' (round robin) belong to no batch's runs
                states_state(entry[2], state_lines)
            if args.round_robin:
                runs = measure_in_turn(ready, i, batch, args.repeats, lambda server, n, run: run_with_cycles(
                    server, run_lines, lambda: measure(server.url, n, args.real_pair, first_round=run
                                                       * args.rounds_per_run, rounds=args.rounds_per_run, warm=False)),
                    before=rotate)
            else:
                runs = measure_in_turn(ready, i, batch, args.repeats, lambda server, n, run: run_with_cycles(
                    server, run_lines, lambda: measure(server.url, n, args.real_pair)), before=rotate)
            for system, shape, server, attention in ready:
                cycles = [r.pop("cycles", None) for r in runs[server.name]]
                result = combine_runs(runs[server.name], mean=("tok_per_s", "accept_len"), longest=("longest_gap_ms",),
                                      keep="tok_per_s")
                if any(cycles):
                    result["run_cycles"] = [c or {} for c in cycles]
                if args.round_robin:
                    result["rounds"] = len(runs[server.name]) * args.rounds_per_run
                rows.append(row(system, shape, batch, meta, attention, result, policy_state(server),
                                arms_state(server, arm_lines), states_state(server, state_lines)))
            save(args.out, rows)
    finally:
        for server in started:
            server.stop()


if __name__ == "__main__":
    main()
