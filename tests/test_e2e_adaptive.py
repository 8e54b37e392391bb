"""End to end with ``--speculative-adaptive``: servers without speculation, with stock EAGLE3 adaptive and with
EAGLE_TRITON adaptive (SGLang's default batch brackets, candidate steps {0, 1, 3, 7}, chains), plus EAGLE_TRITON
adaptive with the cycle knob (``config.ADAPTIVE_CYCLE_ENV``: the step count changes before every decode step,
mid-request, through 0 = no draft, which fills the draft KV without the draft extend and hands back to drafting
through one step at 0 with the full extend) and with the cost-aware policy (sgl_eagle_triton/adaptive.py), serve the
trained tiny pair through ``/generate`` (greedy, deterministic inference; one by one and all at once); tree and
mixed-topk candidates, the cycle knob with an EAGLE-1 draft (the random pair), and the cycle knob and cost policy
at ``--tp 2``, likewise.

Steps 0 runs as a plain decode step by default (sgl_eagle_triton/off_step.py); the server under SGLang's policy
keeps SGLang's steps-0 verify (``SGLANG_EAGLE_TRITON_PLAIN_OFF=0``), so both flows are served beside stock. Sampled
requests (seeded) through steps 0 for good: the plain step samples as no speculation does, token for token.

Pass: each EAGLE_TRITON server is tie-aware equal to no speculation (tests/lossless.py), its ``/server_info``
report shows our kernels ran with no error and the step counts it ran at (the cycling server: every candidate);
EAGLE_TRITON adaptive accepts at least ``tests.e2e.accept_share`` of stock adaptive's accept length. ``E2E_REPORT_DIR``
receives ``adaptive.json`` (and one report per other test).
"""

from __future__ import annotations

import json
import os
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from sgl_eagle_triton import config
from sgl_eagle_triton.off_route import NONSPEC_ENTERED, NONSPEC_LEFT, NONSPEC_STEP
from sgl_eagle_triton.off_step import PLAIN_OFF_STEP
from sgl_eagle_triton.worker import DRAFT_KV_FILL, GRAPH_EPILOGUE
from tests.e2e import (
    MAX_NEW_TOKENS,
    MIXED_DRAFT_TOKENS,
    PROMPTS,
    TREE_DRAFT_TOKENS,
    TREE_TOPK,
    accept_share,
    adaptive_tree_flags,
    e2e_server,
    lean_draft_problem,
    lean_extend_problem,
    serve_concurrently,
    serve_generate,
    tensor_parallel,
    verdicts,
    verify_in_graph_problem,
)
from tests.tiny_models import TRAINED_PAIR, write_random_eagle1_pair

pytestmark = [pytest.mark.e2e, pytest.mark.gpu]

TARGET, DRAFT = str(TRAINED_PAIR / "target"), str(TRAINED_PAIR / "eagle3")
ADAPTIVE = ["--speculative-adaptive", "--speculative-draft-model-path", DRAFT]
# Stock SGLang 0.5.17 adaptive crashes at start unless it starts at its widest candidate (its shared logits buffer is
# sized for the initial one; config.shared_logits_rows mends that for EAGLE_TRITON, which starts at SGLang's default 3)
STOCK_WIDEST_FIRST = ["--speculative-num-steps", "7"]
CANDIDATES = {"0", "1", "3", "7"}  # SGLang 0.5.17's default brackets
# Stock and ours adapt by the same EMA of what they accept, so their step sequences may part after a near-tie
# token. Measured with SGLang's verify attention (H100, 2026-11-26): equal, 1.820 and 1.820, token for token; ours
# must reach tests.e2e.accept_share of stock's, as in tests/test_e2e_deploy.py.


def _report(summary: dict, name: str) -> None:
    """Print ``summary`` and write it as ``name`` into ``E2E_REPORT_DIR`` where that is set."""
    print(json.dumps(summary, indent=1))
    if os.environ.get("E2E_REPORT_DIR"):
        with open(os.path.join(os.environ["E2E_REPORT_DIR"], name), "w") as f:
            json.dump(summary, f, indent=1)


def _cost_config(tmp_path):
    """A ``--speculative-adaptive-config`` file: the cost-aware policy over SGLang's default candidates."""
    path = tmp_path / "cost.json"
    path.write_text(json.dumps({config.ADAPTIVE_POLICY_KEY: "cost", "1": {"candidate_steps": [0, 1, 3, 7]}}))
    return path


def test_adaptive_is_lossless_across_switches(tmp_path):
    cost_config = _cost_config(tmp_path)
    servers = {
        "nospec": e2e_server("adaptive-nospec", TARGET, [], tmp_path),
        "stock": e2e_server("adaptive-EAGLE3", TARGET, ["--speculative-algorithm", "EAGLE3", *ADAPTIVE,
                                                        *STOCK_WIDEST_FIRST], tmp_path),
        "ours": e2e_server("adaptive-EAGLE_TRITON", TARGET, ["--speculative-algorithm", "EAGLE_TRITON", *ADAPTIVE],
                           tmp_path, env={config.PLAIN_OFF_ENV: "0"}),  # SGLang's steps-0 verify
        "ours_cycle": e2e_server("adaptive-EAGLE_TRITON-cycle", TARGET,
                                 ["--speculative-algorithm", "EAGLE_TRITON", *ADAPTIVE], tmp_path,
                                 env={config.ADAPTIVE_CYCLE_ENV: "1"}),
        "ours_cost": e2e_server("adaptive-EAGLE_TRITON-cost", TARGET,
                                ["--speculative-algorithm", "EAGLE_TRITON", *ADAPTIVE,
                                 "--speculative-adaptive-config", str(cost_config)], tmp_path),
    }
    results, infos = serve_concurrently(servers, serve_generate, ("ours", "ours_cycle", "ours_cost"))
    reports = {key: info["eagle_triton"] for key, info in infos.items()}

    summary = {key: {"accept_length": results[key]["accept_length"],
                     "vs_nospec": verdicts(results[key], results["nospec"])}
               for key in ("stock", "ours", "ours_cycle", "ours_cost")}
    summary["ours_equal_to_stock"] = {k: results["ours"][k] == results["stock"][k]
                                      for k in ("generate", "generate_concurrent")}
    summary["reports"] = reports
    _report(summary, "adaptive.json")
    for key in ("ours", "ours_cycle", "ours_cost"):
        assert summary[key]["vs_nospec"]["bugs"] == [], (key, summary[key]["vs_nospec"])
        assert reports[key]["errors"] == [] and reports[key]["ran"].get("triton verify_tree_greedy", 0) > 0, key
        # every draft phase was the lean one (the default on one GPU), each building one tree; none under
        # SGLANG_EAGLE_TRITON_LEAN_DRAFT=0 exported for the run (the servers inherit the variable)
        assert lean_draft_problem(reports[key]) is None, reports[key]
        # greedy chains verified inside the target's verify graphs (the default on one GPU)
        assert verify_in_graph_problem(reports[key]) is None, reports[key]
        # the lean draft extend where SGLANG_EAGLE_TRITON_LEAN_EXTEND=1 is exported for the run, else none
        assert lean_extend_problem(reports[key]) is None, reports[key]
    steps = reports["ours_cycle"]["adaptive_steps_in_force"]
    assert set(steps) == CANDIDATES and min(steps.values()) >= 50, steps
    # steps 0 filled the draft KV alone, and every move from 0 to a draft went through one full draft extend
    assert reports["ours_cycle"]["ran"].get(DRAFT_KV_FILL, 0) >= 50, reports["ours_cycle"]["ran"]
    assert reports["ours_cycle"]["adaptive_resumes"] >= 50, reports["ours_cycle"]
    # steps 0 as a plain decode step by default; SGLang's verify where the variable is 0
    assert reports["ours_cycle"]["ran"].get(PLAIN_OFF_STEP, 0) >= 50, reports["ours_cycle"]["ran"]
    # greedy plain steps take the token and the fill from the steps-0 target graph (off_step.GraphEpilogue)
    assert reports["ours_cycle"]["ran"].get(GRAPH_EPILOGUE, 0) >= 50, reports["ours_cycle"]["ran"]
    assert PLAIN_OFF_STEP not in reports["ours"]["ran"], reports["ours"]["ran"]
    assert reports["ours"]["adaptive_steps_in_force"], reports["ours"]
    share = accept_share(reports["ours"])
    assert summary["ours"]["accept_length"] >= share * summary["stock"]["accept_length"], (share, summary)
    policy = reports["ours_cost"]["adaptive_policy"]  # every candidate priced at every captured batch size
    assert {key.split(",")[0] for key in policy["replay_ms"]} == CANDIDATES, policy


# Sampled requests, seeded (SGLang's positional seeds under --enable-deterministic-inference). No min_p: with
# deterministic inference SGLang 0.5.17's torch sampler asserts on min_p > 0 in the prefill (tests/load_mix.py).
SAMPLED = {"temperature": 1.0, "top_p": 0.9, "top_k": 40}
SAMPLED_REQUESTS, SAMPLED_TOKENS = 48, 64
# steps 0 for good: every batch the servers run (up to 16 requests) has the one candidate 0; the server starts at
# the drafting candidate of a bracket no batch reaches (an adaptive start at steps 0 is refused)
OFF_FOR_GOOD = {"1": {"candidate_steps": [0]}, "65": {"candidate_steps": [1]}}


def _serve_sampled(server, with_logprobs: bool) -> dict:
    """:data:`SAMPLED_REQUESTS` seeded sampled ``/generate`` requests of :data:`SAMPLED_TOKENS` tokens (request ``i``:
    seed ``1000 + i``): one by one, then all at once. Returns their output ids per pattern (``with_logprobs`` unused:
    :func:`tests.e2e.serve_concurrently`'s signature)."""
    prompts = (PROMPTS * (SAMPLED_REQUESTS // len(PROMPTS) + 1))[:SAMPLED_REQUESTS]

    def one(i: int) -> list[int]:
        return server.generate(prompts[i], SAMPLED_TOKENS, sampling_seed=1000 + i, **SAMPLED)["output_ids"]

    one_by_one = [one(i) for i in range(SAMPLED_REQUESTS)]
    with ThreadPoolExecutor(SAMPLED_REQUESTS) as pool:
        concurrent = list(pool.map(one, range(SAMPLED_REQUESTS)))
    return {"one_by_one": one_by_one, "concurrent": concurrent}


def _parted(outputs: list[list[int]], nospec: list[list[int]]) -> list[int]:
    """For each request whose output differs from no-spec's: the index of its first differing token."""
    return [next(i for i, (a, b) in enumerate(zip(out, ref, strict=True)) if a != b)
            for out, ref in zip(outputs, nospec, strict=True) if out != ref]


def test_plain_off_samples_as_no_spec(tmp_path):
    """Steps 0 for good, sampled, on the speculative path (``SGLANG_EAGLE_TRITON_OFF_NONSPEC=0``; the held batch's
    route: :func:`test_held_steps_0_as_a_non_speculative_batch_is_lossless`): the plain decode step samples with
    SGLang's no-spec sampler at no-spec's positions,
    so seeded outputs equal no-spec's token for token, one by one and all at once (batch-invariant kernels under
    deterministic inference). Control: the same server with ``SGLANG_EAGLE_TRITON_PLAIN_OFF=0`` (SGLang's one-node
    verify, whose bonus token our tree sampling draws with its own coins) parts from no-spec on most requests, so the
    comparison can fail. And the cycle knob under sampled traffic (sampled verifies of every candidate, plain steps 0,
    resumes between them) serves every request with no kernel error."""
    off = tmp_path / "off.json"
    off.write_text(json.dumps(OFF_FOR_GOOD))
    spec = ["--speculative-algorithm", "EAGLE_TRITON", *ADAPTIVE]
    off_flags = [*spec, "--speculative-adaptive-config", str(off), "--speculative-num-steps", "1"]
    servers = {
        "nospec": e2e_server("sampled-nospec", TARGET, [], tmp_path),
        "ours_off": e2e_server("sampled-EAGLE_TRITON-off", TARGET, off_flags, tmp_path,
                               env={config.OFF_NONSPEC_ENV: "0"}),  # the plain step on the speculative path
        "ours_off_sglang": e2e_server("sampled-EAGLE_TRITON-off-sglang-verify", TARGET, off_flags, tmp_path,
                                      env={config.PLAIN_OFF_ENV: "0"}),
        "ours_cycle": e2e_server("sampled-EAGLE_TRITON-cycle", TARGET, spec, tmp_path,
                                 env={config.ADAPTIVE_CYCLE_ENV: "1"}),
    }
    ours = ("ours_off", "ours_off_sglang", "ours_cycle")
    results, infos = serve_concurrently(servers, _serve_sampled, ours)
    reports = {key: info["eagle_triton"] for key, info in infos.items()}
    summary = {key: {pattern: _parted(results[key][pattern], results["nospec"][pattern])
                     for pattern in ("one_by_one", "concurrent")} for key in ours}
    summary["reports"] = reports
    _report(summary, "adaptive-sampled.json")
    for key in ours:
        assert reports[key]["errors"] == [], (key, reports[key])
        assert all(len(ids) == SAMPLED_TOKENS for pattern in ("one_by_one", "concurrent")
                   for ids in results[key][pattern]), key
    # every decode step of the sampled requests at steps 0, a plain step (the server's warm-up request, greedy, ran
    # its first decode step at the initial steps 1: measured on an H200, 3271 plain steps and one at 1)
    ran, steps = reports["ours_off"]["ran"], reports["ours_off"]["adaptive_steps_in_force"]
    assert set(steps) <= {"0", "1"} and steps.get("1", 0) <= 1, steps
    assert ran.get(PLAIN_OFF_STEP, 0) >= SAMPLED_REQUESTS * (SAMPLED_TOKENS - 1), ran
    assert summary["ours_off"] == {"one_by_one": [], "concurrent": []}, summary["ours_off"]
    # sampled batches sample with SGLang's sampler, not the graph's argmax (only the greedy warm-up may take it)
    assert ran.get(GRAPH_EPILOGUE, 0) < 100, ran
    assert PLAIN_OFF_STEP not in reports["ours_off_sglang"]["ran"], reports["ours_off_sglang"]
    # the control parted on 48 of 48 requests, one by one and all at once (H200)
    assert len(summary["ours_off_sglang"]["one_by_one"]) > SAMPLED_REQUESTS // 2, summary["ours_off_sglang"]
    # measured: 509 plain steps, 509 resumes, 2031 sampled verifies (H200); a fifth of that at least
    cycle = reports["ours_cycle"]
    assert cycle["ran"].get(PLAIN_OFF_STEP, 0) >= 100 and cycle["adaptive_resumes"] >= 100, cycle
    assert cycle["ran"].get("triton tree_speculative_sampling", 0) >= 400, cycle["ran"]


def _serve_tree_candidates(servers: dict, ours: tuple, report_name: str, shapes: dict) -> dict:
    """Serves ``servers`` (with ``"nospec"``) at once and writes the summary as ``report_name``. Asserts for each of
    ``ours``: tie-aware equal to no speculation, no kernel error, its candidates ``shapes`` ({"steps": [steps, topk,
    draft tokens]}); and that the cycle knob's server (``"ours_cycle"``) ran every candidate >= 50 steps. Returns
    the servers' /server_info reports."""
    results, infos = serve_concurrently(servers, serve_generate, ours)
    reports = {key: info["eagle_triton"] for key, info in infos.items()}
    summary = {key: {"accept_length": results[key]["accept_length"],
                     "vs_nospec": verdicts(results[key], results["nospec"])} for key in ours}
    summary["reports"] = reports
    _report(summary, report_name)
    for key in ours:
        assert summary[key]["vs_nospec"]["bugs"] == [], (key, summary[key]["vs_nospec"])
        assert reports[key]["errors"] == [] and reports[key]["ran"].get("triton verify_tree_greedy", 0) > 0, key
        assert reports[key]["adaptive_trees"] == shapes, reports[key]
        assert lean_draft_problem(reports[key]) is None, reports[key]  # one GPU, page size 1: the lean draft phase
    steps = reports["ours_cycle"]["adaptive_steps_in_force"]
    assert set(steps) == set(shapes) and min(steps.values()) >= 50, steps
    return reports


def test_adaptive_eagle1_draft_is_lossless_across_switches(tmp_path):
    """An EAGLE-1 draft (the random pair: its ``fc`` takes embedding and hidden state, the target hands over its
    hidden state alone) under the cycle knob over the default chain candidates: steps 0's KV fill replayed from its
    CUDA graphs at the target's hidden width (a fill shaped by the ``fc`` input crashed at the first fill), every
    candidate run; tie-aware equal to no speculation."""
    target, draft = (str(path) for path in write_random_eagle1_pair(tmp_path / "pair"))
    servers = {
        "nospec": e2e_server("adaptive-eagle1-nospec", target, [], tmp_path),
        "ours_cycle": e2e_server("adaptive-EAGLE_TRITON-eagle1-cycle", target,
                                 ["--speculative-algorithm", "EAGLE_TRITON", "--speculative-adaptive",
                                  "--speculative-draft-model-path", draft], tmp_path,
                                 env={config.ADAPTIVE_CYCLE_ENV: "1"}),
    }
    chains = {steps: [int(steps), 1, int(steps) + 1] for steps in CANDIDATES}
    reports = _serve_tree_candidates(servers, ("ours_cycle",), "adaptive-eagle1.json", chains)
    assert reports["ours_cycle"]["ran"].get(DRAFT_KV_FILL, 0) >= 50, reports["ours_cycle"]["ran"]


def test_adaptive_tree_candidates_are_lossless_across_switches(tmp_path):
    """Tree candidates (topk > 1, tests/e2e.py's TREE_DRAFT_TOKENS): SGLang's policy, the cycle knob (which moves
    between trees of different depth and width, through steps 0, before every decode step) and the cost policy.
    Pass: tie-aware equal to no speculation; every candidate ran (cycle knob) with its own draft tokens; the cost
    policy's per-rank rates rank the draft's best child first; no kernel error."""
    flags, cost_flags = adaptive_tree_flags(tmp_path), adaptive_tree_flags(tmp_path, policy="cost")
    spec = ["--speculative-algorithm", "EAGLE_TRITON", "--speculative-draft-model-path", DRAFT]
    servers = {
        "nospec": e2e_server("trees-nospec", TARGET, [], tmp_path),
        "ours": e2e_server("adaptive-trees-EAGLE_TRITON", TARGET, [*spec, *flags], tmp_path),
        "ours_cycle": e2e_server("adaptive-trees-EAGLE_TRITON-cycle", TARGET, [*spec, *flags], tmp_path,
                                 env={config.ADAPTIVE_CYCLE_ENV: "1"}),
        "ours_cost": e2e_server("adaptive-trees-EAGLE_TRITON-cost", TARGET, [*spec, *cost_flags], tmp_path),
    }
    trees = {"0": [0, TREE_TOPK, 1], **{str(s): [s, TREE_TOPK, n] for s, n in TREE_DRAFT_TOKENS.items()}}
    reports = _serve_tree_candidates(servers, ("ours", "ours_cycle", "ours_cost"), "adaptive-trees.json", trees)
    # the cost policy learnt per-rank acceptance from the device counts: the trained pair's best child is
    # accepted far more often than its second
    rates = reports["ours_cost"]["adaptive_policy"]["rank_rates"]
    assert rates[0][0] > 2 * rates[0][1], rates


def test_adaptive_mixed_topk_candidates_are_lossless_across_switches(tmp_path):
    """Chains among trees in one server (tests/e2e.py's MIXED_DRAFT_TOKENS: (1,1,2), (3,1,4), (5,TREE_TOPK,16), off):
    the cycle knob moves between them before every decode step, the cost policy picks by cost.
    Pass: tie-aware equal to no speculation; every candidate ran (cycle knob) at its own topk and draft tokens; no
    kernel error."""
    mixed = adaptive_tree_flags(tmp_path, draft_tokens=MIXED_DRAFT_TOKENS)
    cost = adaptive_tree_flags(tmp_path, policy="cost", draft_tokens=MIXED_DRAFT_TOKENS)
    spec = ["--speculative-algorithm", "EAGLE_TRITON", "--speculative-draft-model-path", DRAFT]
    servers = {
        "nospec": e2e_server("mixed-nospec", TARGET, [], tmp_path),
        "ours_cycle": e2e_server("adaptive-mixed-EAGLE_TRITON-cycle", TARGET, [*spec, *mixed], tmp_path,
                                 env={config.ADAPTIVE_CYCLE_ENV: "1"}),
        "ours_cost": e2e_server("adaptive-mixed-EAGLE_TRITON-cost", TARGET, [*spec, *cost], tmp_path),
    }
    shapes = {"0": [0, TREE_TOPK, 1]}
    for s, entry in MIXED_DRAFT_TOKENS.items():
        k, n = entry if isinstance(entry, list) else (TREE_TOPK, entry)
        shapes[str(s)] = [s, k, n]
    _serve_tree_candidates(servers, ("ours_cycle", "ours_cost"), "adaptive-mixed.json", shapes)


def test_adaptive_under_tensor_parallelism(tmp_path):
    """``--tp 2`` (two GPUs): SGLang's policy with the cycle knob (every rank changes step count before the same
    decode step) and the cost policy (every rank adopts rank 0's choice, worker.rank_zero_decides),
    over the default chain candidates. Pass: tie-aware equal to no speculation at the same TP, every candidate ran
    (cycle knob), every candidate priced (cost policy), no kernel error. Servers one at a time (TP servers sharing
    cards stall one another)."""
    parallel, env = tensor_parallel(2)
    cost_config = _cost_config(tmp_path)
    spec = [*parallel, "--speculative-algorithm", "EAGLE_TRITON", *ADAPTIVE]
    servers = {
        "nospec": lambda: e2e_server("tp2-adaptive-nospec", TARGET, parallel, tmp_path, env=env),
        "ours_cycle": lambda: e2e_server("tp2-adaptive-EAGLE_TRITON-cycle", TARGET, spec, tmp_path,
                                         env={**(env or {}), config.ADAPTIVE_CYCLE_ENV: "1"}),
        "ours_cost": lambda: e2e_server("tp2-adaptive-EAGLE_TRITON-cost", TARGET,
                                        [*spec, "--speculative-adaptive-config", str(cost_config)], tmp_path,
                                        env=env),
    }
    results, infos = serve_concurrently(servers, serve_generate, ("ours_cycle", "ours_cost"), one_at_a_time=True)
    reports = {key: info["eagle_triton"] for key, info in infos.items()}
    summary = {key: {"accept_length": results[key]["accept_length"],
                     "vs_nospec": verdicts(results[key], results["nospec"])} for key in ("ours_cycle", "ours_cost")}
    summary["reports"] = reports
    _report(summary, "adaptive-tp2.json")
    for key in ("ours_cycle", "ours_cost"):
        assert summary[key]["vs_nospec"]["bugs"] == [], (key, summary[key]["vs_nospec"])
        assert reports[key]["errors"] == [] and reports[key]["ran"].get("triton verify_tree_greedy", 0) > 0, key
        assert lean_draft_problem(reports[key], one_gpu=False) is None, reports[key]  # declined under TP
    steps = reports["ours_cycle"]["adaptive_steps_in_force"]
    assert set(steps) == CANDIDATES and min(steps.values()) >= 50, steps
    policy = reports["ours_cost"]["adaptive_policy"]
    assert {key.split(",")[0] for key in policy["replay_ms"]} == CANDIDATES, policy


# Batches of one request at steps 0, larger ones drafting at 1: one by one the batch is held at steps 0 (turned
# non-speculative: off_route), all at once it drafts, and it turns back and forth as requests join and
# finish
ONE_OFF_MORE_DRAFT = {"1": {"candidate_steps": [0]}, "2": {"candidate_steps": [1]}}


def _serve_staggered(server, with_logprobs: bool) -> dict:
    """:func:`tests.e2e.serve_generate`'s greedy requests, one by one (with no-spec's log-probs), then each arriving
    three quarters of a request's time at batch 1 (timed here, on this server) after the one before, in place of all at
    once: each request shares its first and last quarter with its neighbours and runs alone for the middle half (held
    at steps 0 under a bracket of steps 0 at batch 1) until the next joins it (at half a request's time the batch stays
    at two, alone for a step or two between requests: too short to turn it); then :func:`_serve_sampled`'s seeded
    sampled requests."""
    result = serve_generate(server, with_logprobs)
    start = time.perf_counter()
    server.generate(PROMPTS[0], MAX_NEW_TOKENS)
    stagger = 0.75 * (time.perf_counter() - start)

    def late(i: int) -> list[int]:
        time.sleep(i * stagger)
        return server.generate(PROMPTS[i], MAX_NEW_TOKENS)["output_ids"]

    with ThreadPoolExecutor(len(PROMPTS)) as pool:
        result["generate_concurrent"] = list(pool.map(late, range(len(PROMPTS))))
    return {**result, **_serve_sampled(server, with_logprobs)}


def _serve_held(servers: dict, ours: tuple, report_name: str) -> tuple[dict, dict]:
    """Serves ``servers`` (with ``"nospec"``) at once with :func:`_serve_staggered` and writes the summary as
    ``report_name``. Asserts for each of ``ours``: greedy tie-aware equal to no speculation, no kernel error, every
    sampled request served whole. Returns the summary (accept length, verdicts, where each sampled output first
    parted from no-spec's) and the servers' kernel reports."""
    results, infos = serve_concurrently(servers, _serve_staggered, ours)
    reports = {key: info["eagle_triton"] for key, info in infos.items()}
    summary = {key: {"accept_length": results[key]["accept_length"],
                     "vs_nospec": verdicts(results[key], results["nospec"]),
                     "sampled_parted": {p: _parted(results[key][p], results["nospec"][p])
                                        for p in ("one_by_one", "concurrent")}} for key in ours}
    summary["reports"] = reports
    _report(summary, report_name)
    for key in ours:
        assert summary[key]["vs_nospec"]["bugs"] == [], (key, summary[key]["vs_nospec"])
        assert reports[key]["errors"] == [], (key, reports[key])
        assert all(len(ids) == SAMPLED_TOKENS for p in ("one_by_one", "concurrent") for ids in results[key][p]), key
    return summary, reports


def test_held_steps_0_as_a_non_speculative_batch_is_lossless(tmp_path):
    """The batch held at steps 0 is a non-speculative batch for the scheduler (sgl_eagle_triton/off_route.py; the
    default, required under ``SGLANG_EAGLE_TRITON_OFF_NONSPEC=1``). Steps 0 for good (required), batches of one at
    steps 0 and larger ones drafting (staggered arrivals turn the batch at every change of size: a request merged into
    a non-speculative batch, the batch back to drafting, and back), and the cost policy (both by default): greedy
    outputs tie-aware equal to no-spec's, and seeded sampled ones token for token no-spec's (steps 0 for good: the
    plain step samples as no-spec)."""
    off, bracket = tmp_path / "off.json", tmp_path / "bracket.json"
    off.write_text(json.dumps(OFF_FOR_GOOD))
    bracket.write_text(json.dumps(ONE_OFF_MORE_DRAFT))
    spec = ["--speculative-algorithm", "EAGLE_TRITON", *ADAPTIVE]
    servers = {
        "nospec": e2e_server("nonspec-nospec", TARGET, [], tmp_path),
        "ours_off": e2e_server("nonspec-EAGLE_TRITON-off", TARGET, [
            *spec, "--speculative-adaptive-config", str(off), "--speculative-num-steps", "1"], tmp_path,
            env={config.OFF_NONSPEC_ENV: "1"}),
        "ours_bracket": e2e_server("nonspec-EAGLE_TRITON-bracket", TARGET, [
            *spec, "--speculative-adaptive-config", str(bracket), "--speculative-num-steps", "1"], tmp_path),
        "ours_cost": e2e_server("nonspec-EAGLE_TRITON-cost", TARGET, [
            *spec, "--speculative-adaptive-config", str(_cost_config(tmp_path))], tmp_path),
    }
    summary, reports = _serve_held(servers, ("ours_off", "ours_bracket", "ours_cost"), "adaptive-nonspec.json")
    assert summary["ours_off"]["sampled_parted"] == {"one_by_one": [], "concurrent": []}, summary["ours_off"]
    ran = reports["ours_off"]["ran"]
    # all but each batch's first decode step (a plain step on the speculative path) non-speculative
    assert ran.get(NONSPEC_STEP, 0) >= SAMPLED_REQUESTS * (SAMPLED_TOKENS - 2) and ran.get(NONSPEC_ENTERED, 0), ran
    # measured with the staggered arrivals (H200): entered 69 times, back 2 (an arrival into a held batch of one;
    # most arrivals find it drafting or empty); without them never back. Floors: half the entries, one turn back
    ran = reports["ours_bracket"]["ran"]
    assert ran.get(NONSPEC_ENTERED, 0) >= 30 and ran.get(NONSPEC_LEFT, 0) >= 1 and ran.get(NONSPEC_STEP, 0), ran
    assert {"0", "1"} <= set(reports["ours_bracket"]["adaptive_steps_in_force"]), reports["ours_bracket"]
    # measured (H200): the cost policy's batch turned 19 times and back 14; 12 and 11 in a second run
    ran = reports["ours_cost"]["ran"]
    assert ran.get(NONSPEC_ENTERED, 0) >= 3 and ran.get(NONSPEC_LEFT, 0) >= 3, ran


# a bracket of steps 0 at batch 1 and a tree of TREE_TOPK above: the batch turns back to a tree
ONE_OFF_MORE_TREE = {"1": {"candidate_steps": [0]}, "2": {"candidate_steps": [3]},
                     config.ADAPTIVE_DRAFT_TOKENS_KEY: {"3": TREE_DRAFT_TOKENS[3]}}


def _turned_both_ways(report: dict) -> None:
    """The server's batch turned non-speculative and back, each held step counted. Measured (H200) with arrivals three
    quarters of a request apart (:func:`_serve_staggered`): the tree bracket turned 80 times and back 11, the EAGLE-1
    chain bracket 68 and back 1. Floors: under half the turns, one back."""
    ran = report["ran"]
    assert ran.get(NONSPEC_ENTERED, 0) >= 30 and ran.get(NONSPEC_LEFT, 0) >= 1 and ran.get(NONSPEC_STEP, 0), ran


def test_held_steps_0_over_tree_candidates_is_lossless(tmp_path):
    """The route (the default) over tree candidates: a bracket of steps 0 at batch 1 and a (3, TREE_TOPK, 8) tree
    above (the turn back's stubs and the resume are a tree's), and the cost policy over chains among trees. Greedy
    tie-aware equal to no-spec's on both; the bracket's batch turned both ways."""
    bracket = tmp_path / "tree-bracket.json"
    bracket.write_text(json.dumps(ONE_OFF_MORE_TREE))
    spec = ["--speculative-algorithm", "EAGLE_TRITON", "--speculative-draft-model-path", DRAFT]
    servers = {
        "nospec": e2e_server("nonspec-trees-nospec", TARGET, [], tmp_path),
        "ours_bracket": e2e_server("nonspec-trees-EAGLE_TRITON-bracket", TARGET, [
            *spec, "--speculative-adaptive", "--speculative-adaptive-config", str(bracket), "--speculative-eagle-topk",
            str(TREE_TOPK), "--speculative-num-steps", "3"], tmp_path),
        "ours_cost": e2e_server("nonspec-mixed-EAGLE_TRITON-cost", TARGET, [
            *spec, *adaptive_tree_flags(tmp_path, policy="cost", draft_tokens=MIXED_DRAFT_TOKENS)], tmp_path),
    }
    _, reports = _serve_held(servers, ("ours_bracket", "ours_cost"), "adaptive-nonspec-trees.json")
    _turned_both_ways(reports["ours_bracket"])
    assert reports["ours_bracket"]["adaptive_trees"]["3"] == [3, TREE_TOPK, TREE_DRAFT_TOKENS[3]], reports
    assert reports["ours_cost"]["kernels"]["steps 0 held"].startswith("SGLang's non-speculative decode"), reports
    assert reports["ours_cost"]["ran"].get(NONSPEC_ENTERED, 0) >= 1, reports["ours_cost"]["ran"]


def test_held_steps_0_with_an_eagle1_draft_is_lossless(tmp_path):
    """The route (the default) with an EAGLE-1 draft (the random pair: no hidden-state stub of EAGLE-3's width), under
    the chain bracket of steps 0 at batch 1. Greedy tie-aware equal to no-spec's; the batch turned both ways."""
    target, draft = (str(path) for path in write_random_eagle1_pair(tmp_path / "pair"))
    bracket = tmp_path / "bracket.json"
    bracket.write_text(json.dumps(ONE_OFF_MORE_DRAFT))
    servers = {
        "nospec": e2e_server("nonspec-eagle1-nospec", target, [], tmp_path),
        "ours_bracket": e2e_server("nonspec-eagle1-EAGLE_TRITON-bracket", target, [
            "--speculative-algorithm", "EAGLE_TRITON", "--speculative-draft-model-path", draft,
            "--speculative-adaptive", "--speculative-adaptive-config", str(bracket), "--speculative-num-steps", "1"],
            tmp_path),
    }
    _, reports = _serve_held(servers, ("ours_bracket",), "adaptive-nonspec-eagle1.json")
    _turned_both_ways(reports["ours_bracket"])
