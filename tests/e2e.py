"""What the end-to-end tests share (tests/test_e2e_server.py, test_e2e_deploy.py, test_load_fault.py): the flags
of every test server, :func:`e2e_server`, which starts one through
:class:`sgl_eagle_triton.devtools.launcher.Server`, the code prompts and the request patterns sent to each server
(:func:`serve_all`), and the tie-aware comparison of a speculative server's greedy outputs with no speculation's
(:func:`verdicts`)."""

from __future__ import annotations

import os
import statistics
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import torch

from sgl_eagle_triton import config
from sgl_eagle_triton.devtools.launcher import Server
from sgl_eagle_triton.devtools.testing import CODE_PROMPTS
from sgl_eagle_triton.verify_epilogue import VERIFY_IN_GRAPH
from sgl_eagle_triton.worker import BUILD_TREE, LEAN_DRAFT, LEAN_EXTEND
from tests.lossless import (
    CONTROL_CEILING,
    TIE_MARGIN,
    TOP_LOGPROBS,
    deficits,
    rescore_body,
    rescored_bugs,
    tie_aware_compare,
    top_logprobs,
)

# The GPU bundle has no FA3 or xgrammar kernels; FlashInfer's JIT-compile on the host (docs/gpu.md).
# Deterministic inference makes greedy outputs comparable across servers (tests/lossless.py).
COMMON_ARGS = (
    "--attention-backend", "triton",
    "--sampling-backend", "pytorch",
    "--grammar-backend", "none",
    "--enable-deterministic-inference",
    "--cuda-graph-max-bs", "16",
    "--max-running-requests", "16",
    "--mem-fraction-static", "0.85",
    "--max-total-tokens", "65536",
)


# EAGLE_TRITON attends the target verify through our kernel by default (the triton backend, 16-bit pools of page 1),
# stock EAGLE3 through SGLang's: they round differently, outputs part at bf16 ties and the accept length follows the
# continuation. Measured on the trained pair, ours with our attention / with SGLang's (4 x H200, 2026-11-27,
# tests/GPU.md): -1.0 % and +3.3 % at (5,1,6) / (5,4,16), -1.5 % and -0.3 % on ~1800-token prompts; with SGLang's
# attention ours stayed within 0.7 % of stock. Ours must reach this share of stock's accept length; a drafter or a
# verify that loses acceptance drops further (a random draft accepts about 1 token a cycle against 2).
ACCEPT_SHARE = {"ours": 0.95, "sglang": 0.98}


def accept_share(report: Mapping) -> float:
    """:data:`ACCEPT_SHARE` for an EAGLE_TRITON server by the verify attention its ``/server_info`` report
    (``internal_states[0]["eagle_triton"]``) says it ran."""
    ours = report["kernels"].get("verify attention") == config.VERIFY_ATTENTION_IN_USE
    return ACCEPT_SHARE["ours" if ours else "sglang"]


def lean_draft_problem(report: Mapping, one_gpu: bool = True, paged_tree: bool = False) -> str | None:
    """What is wrong with the draft phases an EAGLE_TRITON server's kernel report (``/server_info``) counts, None if
    nothing: the lean draft phase (the default) is each draft's (one per tree built) on one GPU without a paged tree;
    none where tensor parallelism or paged trees rule it out, or ``SGLANG_EAGLE_TRITON_LEAN_DRAFT=0`` is exported
    for the run (the servers inherit it), and then the report names SGLang's draft phase."""
    expected = config.lean_draft_mode() != "off" and one_gpu and not paged_tree
    ran = report["ran"]
    lean, trees = ran.get(LEAN_DRAFT, 0), ran.get(BUILD_TREE, 0)
    if expected and not lean == trees > 0:
        return f"lean draft phases {lean} of {trees} drafts"
    if not expected and lean:
        return f"{lean} lean draft phases where SGLang's draft phase should run"
    phase = report["kernels"].get("draft phase", "")
    if config.lean_draft_mode() != "off" and not phase.startswith("lean" if expected else "SGLang's"):
        return f"the kernel report's draft phase is {phase!r}"
    return None


def lean_extend_env(env: Mapping[str, str] | None, served: bool) -> Mapping[str, str] | None:
    """A server's environment ``env`` where ``SGLANG_EAGLE_TRITON_LEAN_EXTEND=1`` exported for the run would refuse a
    server that the lean extend does not serve (``served``: a chain on one GPU): that server gets ``=0`` (SGLang's
    draft extend); else ``env`` as it is."""
    if served or config.lean_extend_mode() != "on":
        return env
    return {**(env or {}), config.LEAN_EXTEND_ENV: "0"}


def lean_extend_problem(report: Mapping, one_gpu: bool = True, chain: bool = True) -> str | None:
    """What is wrong with the draft extends an EAGLE_TRITON server's kernel report counts, None if nothing: by
    default (and under ``SGLANG_EAGLE_TRITON_LEAN_EXTEND=1``) some decode steps' extends were the lean one and the
    report names it on one GPU with a chain (elsewhere the default declines it, =1 refuses to start); none under
    ``SGLANG_EAGLE_TRITON_LEAN_EXTEND=0`` exported for the run."""
    mode = config.lean_extend_mode()
    expected = mode in ("on", "auto") and one_gpu and chain
    ran = report["ran"].get(LEAN_EXTEND, 0)
    if expected and not (ran and report["kernels"].get("draft extend", "").startswith("lean")):
        return f"{ran} lean draft extends, the kernel report's draft extend {report['kernels'].get('draft extend')!r}"
    if not expected and ran:
        return f"{ran} lean draft extends where SGLang's draft extend should run"
    return None


def verify_in_graph_problem(report: Mapping, one_gpu: bool = True, chain: bool = True) -> str | None:
    """What is wrong with where an EAGLE_TRITON server's greedy verifies ran (its ``/server_info`` kernel report),
    None if nothing: inside the target's verify graphs (the default) for some of them on one GPU with a chain (topk 1)
    after greedy requests; none under tensor parallelism, with trees, or ``SGLANG_EAGLE_TRITON_VERIFY_IN_GRAPH=0``
    exported for the run."""
    expected = config.verify_in_graph_mode() != "off" and one_gpu and chain
    ran = report["ran"].get(VERIFY_IN_GRAPH, 0)
    if expected and not ran:
        return "no greedy verify ran inside the target's graph"
    if not expected and ran:
        return f"{ran} greedy verifies inside the target's graph where none should"
    line = report["kernels"].get("greedy verify", "")
    if expected and not line.startswith("inside"):
        return f"the kernel report's greedy verify is {line!r}"
    return None


def e2e_server(name: str, model_path: str, args: Sequence[str], log_dir: Path,
               env: Mapping[str, str] | None = None, deterministic: bool = True) -> Server:
    """A started (not yet ready) server with ``COMMON_ARGS`` (without ``--enable-deterministic-inference`` unless
    ``deterministic``), then ``args`` (a flag given again there wins); its log is ``log_dir/<name>.log``."""
    common = [a for a in COMMON_ARGS if deterministic or a != "--enable-deterministic-inference"]
    return Server(name, model_path, [*common, *args], log_dir, env=env)


def require_gpus(count: int, what: str) -> None:
    """Skip the test unless this host has ``count`` GPUs (the device kind nvidia-h100-x2 has two)."""
    if torch.cuda.device_count() < count:
        pytest.skip(f"{what} needs {count} GPUs (device kind nvidia-h100-x{count})")


def tensor_parallel(size: int, eagle1: bool = False) -> tuple[list[str], dict | None]:
    """The servers' flags and environment for tensor parallelism over ``size`` GPUs (``[], None`` for one); skips
    the test on a host with fewer GPUs. An EAGLE-1 draft at a TP size not yet GPU-tested is an explicit trial
    (config.TESTED_EAGLE1_TP_SIZES)."""
    if size == 1:
        return [], None
    require_gpus(size, f"--tp {size}")
    trial = eagle1 and size not in config.TESTED_EAGLE1_TP_SIZES
    return ["--tp", str(size)], {config.EXPERIMENTAL_TP_ENV: "1"} if trial else None


# Adaptive tree candidates (topk > 1): (steps, TREE_TOPK, draft tokens) each, and
# steps 0 (no draft); every bracket offers all, so that SGLang's policy and the cycle knob reach each
TREE_TOPK, TREE_DRAFT_TOKENS = 4, {1: 2, 3: 8, 5: 16}
TREE_RESERVED = max(max(s * TREE_TOPK, n) for s, n in TREE_DRAFT_TOKENS.items())  # per request (load_mix)


# Mixed topk (candidates narrower than the server's, docs/adaptive.md): chains (topk 1) among TREE_TOPK-wide trees
MIXED_DRAFT_TOKENS = {1: [1, 2], 3: [1, 4], 5: 16}


def adaptive_tree_flags(tmp_path: Path, initial_steps: int = 3, policy: str = "sglang",
                        draft_tokens: dict | None = None) -> list[str]:
    """Server flags (after the draft path) of an EAGLE_TRITON adaptive server over the tree candidates above (or
    ``draft_tokens``: {steps: n or [topk, n]}), deciding by ``policy``; writes its ``--speculative-adaptive-config``
    into ``tmp_path``."""
    import json

    cfg = tmp_path / f"adaptive-trees-{policy}{'-given' if draft_tokens else ''}.json"
    draft_tokens = draft_tokens or TREE_DRAFT_TOKENS
    steps = [0, *sorted(draft_tokens)]
    cfg.write_text(json.dumps({"1": {"candidate_steps": steps}, config.ADAPTIVE_POLICY_KEY: policy,
                               config.ADAPTIVE_DRAFT_TOKENS_KEY: {str(s): n for s, n in draft_tokens.items()}}))
    return ["--speculative-adaptive", "--speculative-adaptive-config", str(cfg), "--speculative-eagle-topk",
            str(TREE_TOPK), "--speculative-num-steps", str(initial_steps)]


PROMPTS = list(CODE_PROMPTS)
MAX_NEW_TOKENS, CHAT_TOKENS = 128, 64


def serve_generate(server: Server, with_logprobs: bool, prompts: Sequence[str] = tuple(PROMPTS)) -> dict:
    """The ``prompts`` through ``/generate``, greedy: one by one (with the no-spec log-probs per position when
    ``with_logprobs``, for :func:`verdicts`), then all at once; and the mean accept length of the former."""
    with ThreadPoolExecutor(len(prompts)) as pool:
        seq = [server.generate(p, MAX_NEW_TOKENS, top_logprobs=TOP_LOGPROBS if with_logprobs else 0) for p in prompts]
        concurrent = list(pool.map(lambda p: server.generate(p, MAX_NEW_TOKENS), prompts))
    return {
        "prompts": list(prompts),
        "generate": [g["output_ids"] for g in seq],
        "generate_concurrent": [g["output_ids"] for g in concurrent],
        "top": [top_logprobs(g["meta_info"]) for g in seq] if with_logprobs else None,
        "accept_length": statistics.mean(g["meta_info"].get("spec_accept_length", 1.0) for g in seq),
    }


def serve_all(server: Server, with_logprobs: bool) -> dict:
    """Every request pattern: :func:`serve_generate`'s, then ``/v1/completions`` one by one and
    ``/v1/chat/completions`` all at once and streamed."""
    result = serve_generate(server, with_logprobs)
    with ThreadPoolExecutor(len(PROMPTS)) as pool:
        result["completions"] = [server.completion(p, MAX_NEW_TOKENS) for p in PROMPTS]
        result["chat_concurrent"] = list(pool.map(lambda p: server.chat(p, CHAT_TOKENS), PROMPTS))
    result["chat_stream"] = [server.chat(p, CHAT_TOKENS, stream=True) for p in PROMPTS]
    return result


GREEDY_PATTERNS = ("generate", "generate_concurrent")  # serve_generate's, rescored
REQUEST_PATTERNS = (*GREEDY_PATTERNS, "completions", "chat_concurrent", "chat_stream")  # serve_all's


def rescore(nospec: Server, results: dict) -> None:
    """Adds ``deficits`` to every result of :func:`serve_generate` in ``results`` (the no-spec one too, as the
    control): per pattern and prompt, each output token's distance below the target's best when ``nospec``
    teacher-forces the prompt and the output (tests/lossless.py)."""
    first = next((r for r in results.values() if isinstance(r, dict) and "prompts" in r), None)
    if first is None:
        return
    ids = [p if isinstance(p, list) else nospec.post_json("/tokenize", {"prompt": p})["tokens"]
           for p in first["prompts"]]
    scored = {}  # (prompt, output) -> deficits: most outputs recur across patterns and servers

    def score(prompt: list[int], out: list[int]) -> list[float]:
        key = (tuple(prompt), tuple(out))
        if key not in scored:
            scored[key] = deficits(nospec.post_json("/generate", rescore_body(prompt, out))["meta_info"], out)
        return scored[key]

    for result in results.values():
        if isinstance(result, dict) and "prompts" in result:
            assert result["prompts"] == first["prompts"], "every server of a test serves the same prompts"
            result["deficits"] = {pattern: [score(p, out) for p, out in zip(ids, result[pattern], strict=True)]
                                  for pattern in GREEDY_PATTERNS}


def serve_concurrently(servers: dict, serve, info_keys, one_at_a_time: bool = False) -> tuple[dict, dict]:
    """Runs ``serve(server, with_logprobs)`` on every one of ``servers`` (key -> a started :class:`Server`, or a
    callable that starts one: it is called here and the server replaces it in ``servers``), log-probs for the key
    ``"nospec"``, once it is ready; reads ``/server_info``'s ``internal_states[0]`` of the servers of ``info_keys``;
    then the no-spec server rescores every greedy output (:func:`rescore`); stops every server, also on failure.
    All at once, or with ``one_at_a_time`` each started, served and stopped in turn, no-spec last: servers of
    several ranks sharing GPUs stall one another (each card time-slices their NCCL kernels, which spin until their
    peers on the other cards run: at ``--tp 4`` three servers at once decoded a tiny model at about 10 tokens per
    second, 4 x H200). Returns ``(results, infos)``, both keyed as ``servers``."""

    def start(key) -> Server:
        if not isinstance(servers[key], Server):
            servers[key] = servers[key]()
        return servers[key]

    def ready(server: Server) -> Server:
        waited = server.wait_ready()
        if os.environ.get("E2E_REPORT_DIR"):  # start-up times survive an interrupted run
            with open(os.path.join(os.environ["E2E_REPORT_DIR"], "ready.txt"), "a") as f:
                f.write(f"{server.name} ready after {waited:.0f} s\n")
        return server

    def info(key) -> dict:
        return servers[key].get_json("/server_info")["internal_states"][0]

    results, infos = {}, {}
    try:
        if one_at_a_time:
            for key in sorted(servers, key=lambda k: k == "nospec"):
                results[key] = serve(ready(start(key)), key == "nospec")
                if key in info_keys:
                    infos[key] = info(key)
                if key != "nospec":
                    servers[key].stop()
        else:
            for key in servers:
                start(key)
            for key in servers:
                ready(servers[key])
            with ThreadPoolExecutor(len(servers)) as pool:
                results = dict(zip(servers, pool.map(lambda key: serve(servers[key], key == "nospec"), servers),
                                   strict=True))
            infos = {key: info(key) for key in info_keys}
        if "nospec" in servers:
            rescore(servers["nospec"], results)
    finally:
        for server in servers.values():
            if isinstance(server, Server):
                server.stop()
    return results, infos


def verdicts(spec: dict, nospec: dict) -> dict:
    """Tie-aware verdicts of ``spec``'s greedy outputs against ``nospec``'s; ``tie_ranks``: how many ties departed
    to no-spec's n-th listed token (0 = listed first), to set beside stock's. With :func:`rescore`'s deficits, every
    output token further below the target's best than the tie margin, or than any no-spec token lies (the
    control), is a bug too (``("rescored", pattern, prompt, position, deficit)``); ``rescored`` sums them up."""
    assert "deficits" in spec or "prompts" not in spec, "serve_concurrently did not rescore these outputs"
    counts, tie_ranks, bugs = {"identical": 0, "tie": 0, "bug": 0}, {}, []
    unlisted = "tie" if "deficits" in spec else "bug"  # the rescoring judges a token the no-spec list misses
    for key in GREEDY_PATTERNS:
        for i, (ids, ref, top) in enumerate(zip(spec[key], nospec["generate"], nospec["top"], strict=True)):
            v = tie_aware_compare(ids, ref, top, unlisted)
            counts[v.kind] += 1
            if v.kind == "tie":
                tie_ranks[str(v.rank)] = tie_ranks.get(str(v.rank), 0) + 1
            if v.kind == "bug":
                bugs.append((key, i, v.index, v.margin, v.rank))
    out = {"counts": counts, "tie_ranks": tie_ranks, "bugs": bugs}
    if "deficits" in spec:
        control_deficits = nospec.get("deficits", {})
        control = deficit_summary(control_deficits)
        bound = max(TIE_MARGIN, control["max"])
        for key in GREEDY_PATTERNS:
            bugs += [("rescored", key, *bug) for bug in rescored_bugs(spec["deficits"][key], bound)]
            bugs += [("rescored-control", key, *bug)
                     for bug in rescored_bugs(control_deficits.get(key, []), CONTROL_CEILING)]
        out["rescored"] = {"spec": deficit_summary(spec["deficits"]), "nospec_control": control, "bound": bound}
    return out


def deficit_summary(deficits_by_pattern: Mapping[str, list[list[float]]]) -> dict:
    """How many rescored tokens, how many were not the target's argmax, and the largest deficit."""
    rows = [d for pattern in deficits_by_pattern.values() for row in pattern for d in row]
    return {"tokens": len(rows), "off_argmax": sum(d > 0 for d in rows), "max": max(rows, default=0.0)}
