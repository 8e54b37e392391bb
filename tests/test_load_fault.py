"""Load and fault test: 1000 mixed requests (tests/load_mix.py) at concurrency 64 against an
EAGLE_TRITON server on the trained tiny pair, run twice.

Pass: no 5xx, client errors or exception/leak lines in the server log; every request that is not
cancelled completes with its expected length and finish reason; invalid requests get a 4xx and
the server stays healthy; greedy /generate answers are tie-aware equal to a no-spec server's
(tests/lossless.py); after each run the KV pool's used tokens return to 0 (``/v1/loads``
``num_used_tokens`` and ``/metrics`` ``sglang:num_used_tokens``); the server's RSS (its process tree)
and the GPU's used memory grow by at most ``TOLERANCE_MIB`` from the first run to the second.
Writes ``load-fault.json`` to ``$E2E_REPORT_DIR`` (else the test's tmp dir).
"""

from __future__ import annotations

import asyncio
import json
import os
import time
from pathlib import Path

import aiohttp
import psutil
import pytest
import torch

from sgl_eagle_triton import config
from sgl_eagle_triton.devtools.demo import parse_metrics
from sgl_eagle_triton.devtools.launcher import Server
from tests.e2e import MIXED_DRAFT_TOKENS, TREE_RESERVED, adaptive_tree_flags, e2e_server, tensor_parallel
from tests.load_mix import (
    ADAPTIVE_RESERVED,
    CONTEXT_LEN,
    NONSPEC_BRACKETS,
    NONSPEC_RESERVED,
    SPEC_TREE,
    apply_payload,
    build_mix,
    greedy_verdicts,
    growth_problems,
    log_problems,
    new_outcome,
    reference_body,
    reference_key,
    reserved_tokens,
    summarize,
)
from tests.tiny_models import TRAINED_PAIR

pytestmark = [
    pytest.mark.e2e, pytest.mark.slow, pytest.mark.gpu,
]

N_REQUESTS, CONCURRENCY, REPEATS, REQUEST_TIMEOUT_S = 1000, 64, 2, 180
TOLERANCE_MIB = {"server_rss": 256, "gpu_used": 128}
LOAD_ARGS = ["--context-length", str(CONTEXT_LEN), "--max-running-requests", str(CONCURRENCY),
             "--cuda-graph-max-bs", str(CONCURRENCY)]


async def _send(session, url: str, req, rid: str) -> dict:
    """One request of the mix; every failure is recorded in the outcome, never raised."""
    out, body, abort = new_outcome(), dict(req.body), None
    if req.abort_after_s:
        body["rid"] = rid

        async def abort_later():
            await asyncio.sleep(req.abort_after_s)
            async with session.post(url + "/abort_request", json={"rid": rid}) as r:
                out["abort_status"] = r.status

        abort = asyncio.create_task(abort_later())
    try:
        async with session.post(url + req.endpoint, json=body) as resp:
            out["status"] = resp.status
            if resp.status != 200 or not req.stream:
                text = await resp.text()
                if resp.status == 200:
                    apply_payload(out, req.endpoint, json.loads(text))
                    out["done"] = True
                else:
                    out["body"] = text[:300]
                return out
            chunks = 0
            async for raw in resp.content:
                line = raw.decode().strip()
                if not line.startswith("data: "):
                    continue
                if line == "data: [DONE]":
                    out["done"] = True
                    break
                apply_payload(out, req.endpoint, json.loads(line[len("data: "):]))
                chunks += 1
                if req.disconnect_after and chunks >= req.disconnect_after:
                    out["disconnected"] = True
                    resp.close()
                    break
    except Exception as e:  # a client-side failure is an outcome to report
        out["error"] = f"{type(e).__name__}: {e}"[:300]
    finally:
        if abort is not None:
            await abort
    return out


async def _run_mix(url: str, mix, tag: str) -> list[dict]:
    """Send the whole mix with at most CONCURRENCY requests in flight; rids are ``<tag>-<idx>``."""
    gate = asyncio.Semaphore(CONCURRENCY)
    timeout = aiohttp.ClientTimeout(total=REQUEST_TIMEOUT_S)
    async with aiohttp.ClientSession(timeout=timeout, read_bufsize=1 << 20) as session:

        async def one(req):
            async with gate:
                return await _send(session, url, req, f"{tag}-{req.idx:04d}")

        return await asyncio.gather(*(one(r) for r in mix))


async def _reference(url: str, bodies: list[dict]) -> list[dict]:
    """The no-spec server's /generate responses to ``bodies``."""
    gate = asyncio.Semaphore(CONCURRENCY)
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=REQUEST_TIMEOUT_S)) as session:

        async def one(body):
            async with gate, session.post(url + "/generate", json=body) as r:
                r.raise_for_status()
                return await r.json()

        return await asyncio.gather(*(one(b) for b in bodies))


def _idle_state(server: Server, timeout_s: float = 90) -> dict:
    """Wait until nothing runs and no KV token is in use (or ``timeout_s``); return the last readings."""
    deadline = time.time() + timeout_s
    while True:
        loads = server.get_json("/v1/loads?include=core,spec")["loads"][0]
        state = {"running": loads["num_running_reqs"], "waiting": loads["num_waiting_reqs"],
                 "num_used_tokens": loads["num_used_tokens"],
                 "metrics_num_used_tokens": parse_metrics(server.get("/metrics")).get("sglang:num_used_tokens"),
                 "accept_length": (loads.get("speculative") or {}).get("accept_length")}
        idle = state["running"] == state["waiting"] == state["num_used_tokens"] == state["metrics_num_used_tokens"] == 0
        if idle or time.time() > deadline:
            return state
        time.sleep(2)


def _memory_mib(server: Server) -> dict:
    procs = [psutil.Process(server.proc.pid), *psutil.Process(server.proc.pid).children(recursive=True)]
    free, total = torch.cuda.mem_get_info()
    return {"server_rss": sum(p.memory_info().rss for p in procs) / 2**20, "gpu_used": (total - free) / 2**20}


# held steps 0 as SGLang's non-speculative decode under load: batch-size brackets that alternate steps 0 and drafting,
# so that as requests come, finish, abort and disconnect the batch turns non-speculative and back


@pytest.mark.parametrize("mode", ["static", "adaptive_cycle", "adaptive_trees_cycle", "adaptive_mixed_cycle", "tp2",
                                  "adaptive_nonspec"])
def test_load_and_faults(tmp_path, mode):
    """``static``: the tree SPEC_TREE; ``adaptive_cycle``: ``--speculative-adaptive`` with the cycle knob (the step
    count changes before every decode step, through 0 = no draft), so that switches meet aborts and disconnects;
    ``adaptive_trees_cycle``: the same over tree candidates (topk > 1, tests/e2e.py); ``adaptive_mixed_cycle``: over
    chains among trees (MIXED_DRAFT_TOKENS); ``tp2``: SPEC_TREE at ``--tp 2`` (two GPUs); ``adaptive_nonspec``: held
    steps 0 as SGLang's non-speculative decode (the default) under
    :data:`NONSPEC_BRACKETS`."""
    parallel, env = tensor_parallel(2 if mode == "tp2" else 1)
    target, draft = str(TRAINED_PAIR / "target"), str(TRAINED_PAIR / "eagle3")
    steps, topk, n = SPEC_TREE
    algorithm = os.environ.get("LOAD_TEST_ALGORITHM", "EAGLE_TRITON")  # EAGLE3: the same load on stock SGLang
    shape = ["--speculative-num-steps", str(steps), "--speculative-eagle-topk", str(topk),
             "--speculative-num-draft-tokens", str(n)]
    reserved = reserved_tokens(*SPEC_TREE)
    if mode == "adaptive_cycle":
        shape, env, reserved = ["--speculative-adaptive"], {config.ADAPTIVE_CYCLE_ENV: "1"}, ADAPTIVE_RESERVED
    elif mode == "adaptive_trees_cycle":
        shape, env, reserved = adaptive_tree_flags(tmp_path), {config.ADAPTIVE_CYCLE_ENV: "1"}, TREE_RESERVED
    elif mode == "adaptive_nonspec":
        brackets = tmp_path / "brackets.json"
        brackets.write_text(json.dumps(NONSPEC_BRACKETS))
        shape = ["--speculative-adaptive", "--speculative-adaptive-config", str(brackets), "--speculative-num-steps",
                 "1"]
        env, reserved = {}, NONSPEC_RESERVED  # (the route is the default: its server reports that it ran)
    elif mode == "adaptive_mixed_cycle":  # the widest candidate's reservation is the trees' (5 steps x TREE_TOPK)
        shape = adaptive_tree_flags(tmp_path, draft_tokens=MIXED_DRAFT_TOKENS)
        env, reserved = {config.ADAPTIVE_CYCLE_ENV: "1"}, TREE_RESERVED
    spec = e2e_server(f"load-{algorithm}-{mode}", target, [
        "--speculative-algorithm", algorithm, "--speculative-draft-model-path", draft, *shape, "--enable-metrics",
        *LOAD_ARGS, *parallel,
    ], tmp_path, env=env)
    nospec = e2e_server("load-nospec", target, [*LOAD_ARGS, *parallel], tmp_path)
    mix = build_mix(N_REQUESTS, reserved=reserved)
    report = {"requests": N_REQUESTS, "concurrency": CONCURRENCY, "tolerance_mib": TOLERANCE_MIB, "runs": []}
    try:
        spec.wait_ready()
        nospec.wait_ready()
        greedy = {reference_key(r): r for r in mix if r.compare}
        answers = asyncio.run(_reference(nospec.url, [reference_body(r) for r in greedy.values()]))
        reference = dict(zip(greedy, answers, strict=True))
        nospec.stop()
        for run in range(REPEATS):
            start = time.time()
            outcomes = asyncio.run(_run_mix(spec.url, mix, f"run{run}"))
            wall = time.time() - start
            summary = summarize(mix, outcomes)
            summary.update(wall_s=round(wall, 1), greedy_vs_nospec=greedy_verdicts(mix, outcomes, reference),
                           idle=_idle_state(spec), memory_mib=_memory_mib(spec),
                           healthy=spec.healthy("/health_generate", timeout=30) and spec.proc.poll() is None)
            report["runs"].append(summary)
        log = spec.log()
    finally:
        spec.stop()
        nospec.stop()

    first, second = (r["memory_mib"] for r in report["runs"])
    report["memory_growth_problems"] = growth_problems(first, second, TOLERANCE_MIB)
    report["log_problems"] = log_problems(log)
    text = json.dumps(report, indent=1)
    print(text)
    Path(os.environ.get("E2E_REPORT_DIR") or tmp_path, f"load-fault-{mode}.json").write_text(text)

    for i, run in enumerate(report["runs"]):
        assert run["problem_count"] == 0, (i, run["problems"])
        assert not run["greedy_vs_nospec"]["bugs"], (i, run["greedy_vs_nospec"])
        assert run["idle"]["num_used_tokens"] == 0 and run["idle"]["metrics_num_used_tokens"] == 0, (i, run["idle"])
        assert run["healthy"], i
    assert not report["memory_growth_problems"], report["memory_growth_problems"]
    assert not report["log_problems"], report["log_problems"][:20]
    assert "triton tree_speculative_sampling ran" in log and "triton verify_tree_greedy ran" in log
    if mode == "adaptive_nonspec":
        assert "batch turned non-speculative ran" in log and "batch turned speculative again ran" in log
