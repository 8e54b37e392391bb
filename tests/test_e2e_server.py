"""End to end: real SGLang servers without speculation, with stock EAGLE and with EAGLE_TRITON.

For each model pair and each (steps, topk, draft tokens), the three servers answer the same 16
prompts through /generate (one by one and 16 at once), /v1/completions and /v1/chat/completions
(16 at once, and streamed). Pass: EAGLE_TRITON's acceptance length reaches tests.e2e.accept_share of
stock's (its fused drafter builds SGLang's trees up to bf16 near-ties; its verify attention rounds
differently from SGLang's), it is tie-aware equal to no-spec
(tests/lossless.py), and its log shows our kernels in use; equality with stock EAGLE token for
token is reported. Draft check: with SGLANG_EAGLE_TRITON_DRAFT_CHECK every draft also runs SGLang's
own draft forward on the same batch; trees must agree except after near-ties. Verify attention: ours
(the default) against SGLang's (SGLANG_EAGLE_TRITON_VERIFY_ATTENTION=0), both lossless.
Sampling: 50 concurrent requests at temperature 0.8 / top-p 0.9 with per-request seeds reproduce
run to run, and greedy requests mixed into sampled batches keep their greedy output.
Observability: with --enable-metrics, what README tells users to read is there (per-request
meta_info, /metrics, /server_info, /v1/loads, the log's kernel lines).
Set ``E2E_REPORT_DIR`` to also write a JSON summary there.
"""

from __future__ import annotations

import functools
import json
import os
import shutil
import statistics
from concurrent.futures import ThreadPoolExecutor

import pytest

from sgl_eagle_triton import config
from sgl_eagle_triton.devtools.demo import kernel_lines, parse_metrics
from tests.e2e import (
    ACCEPT_SHARE,
    CHAT_TOKENS,
    MAX_NEW_TOKENS,
    PROMPTS,
    REQUEST_PATTERNS,
    accept_share,
    e2e_server,
    lean_draft_problem,
    lean_extend_env,
    lean_extend_problem,
    serve_all,
    serve_concurrently,
    serve_generate,
    tensor_parallel,
    verdicts,
    verify_in_graph_problem,
)
from tests.tiny_models import TRAINED_PAIR, write_random_eagle1_pair

pytestmark = [pytest.mark.e2e, pytest.mark.gpu]

CONFIGS = [(5, 1, 6), (5, 4, 16)]
# --tp 4: one tree (three servers of four ranks, each started and served alone)
TREES = {"tp1": CONFIGS, "tp2": CONFIGS, "tp4": [(5, 4, 16)]}
# Measured (H100 and H200, 2026-11-26, tests/GPU.md): the trained pair's mean accept length per /generate request
# of this workload, stock EAGLE3 (ours within 0.7 % of it with SGLang's verify attention); deterministic inference
# makes it repeat run to run. Both must reach it within ACCEPT_MARGIN, and ours must reach tests.e2e.accept_share of
# stock's in the same run. Tensor
# parallelism changes the target's rounding (bf16 all-reduces), and with it what is accepted (4 x H200): stock at
# --tp 2 (2026-11-26) 1.913 / 2.182, 3 % under one GPU's; at --tp 4 (2026-11-27) 2.391 at (5,4,16), 7 % over it
# (ours 2.381).
TRAINED_ACCEPT_LENGTH = {
    "tp1": {(5, 1, 6): 1.975, (5, 4, 16): 2.244},
    "tp2": {(5, 1, 6): 1.913, (5, 4, 16): 2.182},
    "tp4": {(5, 4, 16): 2.391},
}
ACCEPT_MARGIN = {"tp1": 0.03, "tp2": 0.03, "tp4": 0.03}
# Measured in the draft check (H100, 2026-11-26): share of request drafts whose tree equals SGLang's own.
SAME_TREE_RATE = {"tiny-code-eagle3": 0.784, "random-eagle1": 0.670}
SAME_TREE_MARGIN = 0.04


def _pair(name: str, tmp_path):
    if name == "tiny-code-eagle3":
        return str(TRAINED_PAIR / "target"), str(TRAINED_PAIR / "eagle3"), "EAGLE3"
    target, draft = write_random_eagle1_pair(tmp_path / "pair")
    return str(target), str(draft), "EAGLE"


def _parallel(parallel: str, pair: str = "tiny-code-eagle3") -> tuple[list[str], dict | None]:
    """The servers' flags and environment for ``tp1`` (one GPU), ``tp2`` or ``tp4`` (tensor parallelism)."""
    return tensor_parallel(int(parallel.removeprefix("tp")), eagle1=pair == "random-eagle1")


@pytest.mark.parametrize("pair", ["tiny-code-eagle3", "random-eagle1"])
@pytest.mark.parametrize("parallel", ["tp1", "tp2", "tp4"])
def test_eagle_triton_serves_like_stock_and_lossless(parallel, pair, tmp_path):
    target, draft, stock_algo = _pair(pair, tmp_path)
    flags, env = _parallel(parallel, pair)
    trees = TREES[parallel]
    # started when served: under TP one at a time (tests/e2e.serve_concurrently)
    servers = {"nospec": functools.partial(e2e_server, f"{pair}-nospec", target, flags, tmp_path, env=env)}
    for steps, topk, n in trees:
        spec = ["--speculative-draft-model-path", draft, "--speculative-num-steps", str(steps),
                "--speculative-eagle-topk", str(topk), "--speculative-num-draft-tokens", str(n)]
        server_env = lean_extend_env(env, served=topk == 1 and parallel == "tp1")
        for algo in (stock_algo, "EAGLE_TRITON"):
            name = f"{pair}-{algo}-{steps}-{topk}-{n}"
            servers[(algo, n)] = functools.partial(e2e_server, name, target,
                                                   ["--speculative-algorithm", algo, *spec, *flags], tmp_path,
                                                   env=server_env)
    results, infos = serve_concurrently(servers, serve_all, [("EAGLE_TRITON", n) for _, _, n in trees],
                                        one_at_a_time=parallel != "tp1")
    ours_info = {n: infos["EAGLE_TRITON", n] for _, _, n in trees}

    report = {"pair": pair, "parallel": parallel, "configs": {}}
    for steps, topk, n in trees:
        ours, stock = results[("EAGLE_TRITON", n)], results[(stock_algo, n)]
        entry = {
            "accept_length": {"eagle_triton": ours["accept_length"], "stock": stock["accept_length"]},
            "vs_nospec": {"eagle_triton": verdicts(ours, results["nospec"]),
                          "stock": verdicts(stock, results["nospec"])},
            "equal_to_stock": {k: ours[k] == stock[k] for k in ours if k in REQUEST_PATTERNS},
        }
        report["configs"][f"{steps},{topk},{n}"] = entry
    print(json.dumps(report, indent=1))
    if os.environ.get("E2E_REPORT_DIR"):
        with open(os.path.join(os.environ["E2E_REPORT_DIR"], f"e2e-{pair}-{parallel}.json"), "w") as f:
            json.dump(report, f, indent=1)

    for (steps, topk, n), (key, entry) in zip(trees, report["configs"].items(), strict=True):
        ours_log = servers[("EAGLE_TRITON", n)].log()
        assert "build tree: triton" in ours_log and "verify greedy: triton" in ours_log, key
        assert "triton build_tree ran" in ours_log and "triton verify_tree_greedy ran" in ours_log, key
        assert "build tree: triton" not in servers[(stock_algo, n)].log(), key
        assert "draft forward: triton" in ours_log and "triton fused drafter ran" in ours_log, key
        # Our drafts are SGLang's up to bf16 near-ties and our verify attention rounds differently from SGLang's, so
        # acceptance reaches tests.e2e.ACCEPT_SHARE of stock's and outputs stay lossless (tie-aware against no-spec);
        # token-for-token equality with stock is reported only.
        report_state = ours_info[n]["eagle_triton"]
        share = accept_share(report_state)
        assert entry["accept_length"]["eagle_triton"] >= share * entry["accept_length"]["stock"], (key, share)
        assert not entry["vs_nospec"]["eagle_triton"]["bugs"], (key, entry["vs_nospec"])
        if pair == "tiny-code-eagle3":  # the trained pair really accepts several tokens per cycle
            floor = TRAINED_ACCEPT_LENGTH[parallel][steps, topk, n] * (1 - ACCEPT_MARGIN[parallel])
            assert min(entry["accept_length"].values()) >= floor, (key, entry["accept_length"], floor)
        assert report_state["errors"] == [] and report_state["ran"].get("triton fused drafter", 0) > 0, report_state
        # on one GPU every draft phase was the lean one (the default), each building one tree; under tensor
        # parallelism or SGLANG_EAGLE_TRITON_LEAN_DRAFT=0 exported for the run, none (SGLang's draft phase)
        assert lean_draft_problem(report_state, one_gpu=parallel == "tp1") is None, report_state
        # greedy chains verified inside the target's verify graphs on one GPU (the default), trees after them
        assert verify_in_graph_problem(report_state, one_gpu=parallel == "tp1", chain=topk == 1) is None, report_state
        # the lean draft extend where SGLANG_EAGLE_TRITON_LEAN_EXTEND=1 is exported for the run (chains), else none
        assert lean_extend_problem(report_state, one_gpu=parallel == "tp1", chain=topk == 1) is None, report_state


@pytest.mark.parametrize("parallel", ["tp1", "tp2", "tp4"])
def test_sampled_requests_are_served_and_reproducible(parallel, tmp_path):
    """Sampled traffic on EAGLE_TRITON: no errors, seeded outputs identical across two runs, and
    greedy requests riding in the same (sampled) batches still produce their greedy tokens (under TP every rank
    verifies with the same coins, or the ranks' outputs would part and the server fail)."""
    target, draft, _ = _pair("tiny-code-eagle3", tmp_path)
    flags, env = _parallel(parallel)
    server = e2e_server(f"tiny-code-EAGLE_TRITON-sampling-{parallel}", target, [
        "--speculative-algorithm", "EAGLE_TRITON", "--speculative-draft-model-path", draft,
        "--speculative-num-steps", "5", "--speculative-eagle-topk", "4", "--speculative-num-draft-tokens", "16",
        "--max-running-requests", "64", *flags,
    ], tmp_path, env=env)
    prompts = (PROMPTS * 4)[:50]

    def sampled(i):
        return server.generate(prompts[i], 64, temperature=0.8, top_p=0.9, sampling_seed=1000 + i)["output_ids"]

    try:
        server.wait_ready()
        greedy_alone = [server.generate(p, 64)["output_ids"] for p in PROMPTS]
        runs = []
        for _ in range(2):
            with ThreadPoolExecutor(66) as pool:
                sampled_ids = pool.map(sampled, range(50))
                greedy_mixed = pool.map(lambda p: server.generate(p, 64)["output_ids"], PROMPTS)
                runs.append((list(sampled_ids), list(greedy_mixed)))
        log = server.log()
    finally:
        server.stop()
    (sampled_1, greedy_1), (sampled_2, greedy_2) = runs
    assert all(len(ids) == 64 for ids in sampled_1 + sampled_2)
    assert sampled_1 == sampled_2, "seeded sampling is not reproducible"
    assert len({tuple(ids) for ids in sampled_1}) > len(PROMPTS), "sampling looks greedy"
    assert greedy_1 == greedy_alone and greedy_2 == greedy_alone, "greedy rows changed inside sampled batches"
    assert "triton tree_speculative_sampling ran" in log and "triton verify_tree_greedy ran" in log


def test_observability_metrics_and_meta_info(tmp_path):
    """Per request: meta_info's spec_verify_ct / spec_accept_length (/generate, and chat with
    return_meta_info). Server-wide: /metrics sglang:spec_accept_length, sglang:spec_accept_rate and
    sglang:spec_verify_calls_total; /server_info avg_spec_accept_length; /v1/loads speculative."""
    target, draft, _ = _pair("tiny-code-eagle3", tmp_path)
    server = e2e_server("tiny-code-EAGLE_TRITON-metrics", target, [
        "--speculative-algorithm", "EAGLE_TRITON", "--speculative-draft-model-path", draft, "--enable-metrics",
    ], tmp_path)
    try:
        server.wait_ready()
        metas = []
        with ThreadPoolExecutor(len(PROMPTS)) as pool:
            for _ in range(2):  # > 40 decode steps: SGLang refreshes its spec gauges every --decode-log-interval
                metas += [g["meta_info"] for g in pool.map(lambda p: server.generate(p, MAX_NEW_TOKENS), PROMPTS)]
        chat = server.post_json("/v1/chat/completions", {
            "model": "default", "messages": [{"role": "user", "content": PROMPTS[1]}], "max_tokens": CHAT_TOKENS,
            "temperature": 0, "return_meta_info": True,
        })
        metrics = parse_metrics(server.get("/metrics"))
        info = server.get_json("/server_info")
        loads = server.get_json("/v1/loads")
        log = server.log()
    finally:
        server.stop()

    for meta in metas:
        assert meta["spec_verify_ct"] > 0, meta
        assert meta["spec_accept_length"] == pytest.approx(meta["completion_tokens"] / meta["spec_verify_ct"])
        assert 0 <= meta["spec_accept_rate"] <= 1, meta
    assert chat["choices"][0]["meta_info"]["spec_verify_ct"] > 0, chat
    assert metrics["sglang:spec_verify_calls_total"] >= sum(m["spec_verify_ct"] for m in metas), metrics
    # The server-wide figures describe the same decode steps as the per-request ones. Measured (H200, 2026-11-26):
    # /server_info and /v1/loads (since start: plus the warm-up and the chat request) 0.5 % above the requests'
    # token-weighted mean, /metrics (the gauge of the last log interval: the batch's tail end) 9.3 % below it.
    served = sum(m["completion_tokens"] for m in metas) / sum(m["spec_verify_ct"] for m in metas)
    figures = {"served": served, "/metrics": metrics["sglang:spec_accept_length"],
               "/server_info": info["internal_states"][0]["avg_spec_accept_length"],
               "/v1/loads": loads["loads"][0]["speculative"]["accept_length"]}
    if os.environ.get("E2E_REPORT_DIR"):
        with open(os.path.join(os.environ["E2E_REPORT_DIR"], "observability.json"), "w") as f:
            json.dump(figures, f, indent=1)
    assert served > 1.5, figures  # the trained pair accepts (about 2 at this default tree)
    assert figures["/server_info"] == pytest.approx(served, rel=0.02), figures
    assert figures["/v1/loads"] == pytest.approx(served, rel=0.02), figures
    assert figures["/metrics"] == pytest.approx(served, rel=0.15), figures
    assert 0 < metrics["sglang:spec_accept_rate"] <= 1, metrics
    report_state = info["internal_states"][0]["eagle_triton"]
    assert report_state["errors"] == [] and report_state["sglang_version"] == "0.5.17", report_state
    assert all(report_state["ran"].get(k, 0) > 0 for k in ("triton fused drafter", "triton build_tree",
                                                          "triton verify_tree_greedy")), report_state
    lines = kernel_lines(log)
    assert any("build tree: triton" in line for line in lines), lines
    assert any("verify_tree_greedy ran" in line for line in lines), lines


@pytest.mark.parametrize("pair", ["tiny-code-eagle3", "random-eagle1"])
def test_fused_drafter_matches_sglang_draft(pair, tmp_path):
    """Draft check mode: on every draft of a served workload, our tree against SGLang's own draft forward
    of the same batch state (same weights, KV pool, spec_info)."""
    target, draft, _ = _pair(pair, tmp_path)
    check_file = tmp_path / "draft-check.jsonl"
    server = e2e_server(f"{pair}-draft-check", target, [
        "--speculative-algorithm", "EAGLE_TRITON", "--speculative-draft-model-path", draft,
        "--speculative-num-steps", "5", "--speculative-eagle-topk", "4", "--speculative-num-draft-tokens", "16",
        "--disable-cuda-graph",
    ], tmp_path, env={"SGLANG_EAGLE_TRITON_DRAFT_CHECK": str(check_file)})
    try:
        server.wait_ready()
        with ThreadPoolExecutor(len(PROMPTS)) as pool:
            list(pool.map(lambda p: server.generate(p, 64), PROMPTS))
    finally:
        server.stop()
    lines = [json.loads(line) for line in check_file.read_text().splitlines()]
    requests_ = sum(line["bs"] for line in lines)
    gaps = [g for line in lines for g in line["differing_min_rel_gap"]]
    diffs = [line["max_rel_score_diff"] for line in lines if line["max_rel_score_diff"] is not None]
    report = {"pair": pair, "drafts": len(lines), "request_drafts": requests_,
              "same_tree_rate": sum(line["same_tree"] for line in lines) / requests_,
              "same_candidate_ids_rate": sum(line["same_ids"] for line in lines) / requests_,
              "differing_trees_max_min_rel_gap": max(gaps, default=None),
              "max_rel_score_diff": max(diffs, default=None),
              "median_max_rel_score_diff": statistics.median(diffs) if diffs else None,
              "first_forward_rel_p_diff_median_of_medians": statistics.median(
                  line["first_forward_rel_p_diff"][0] for line in lines if line["first_forward_rel_p_diff"]),
              "first_forward_rel_p_diff_max": max(
                  line["first_forward_rel_p_diff"][1] for line in lines if line["first_forward_rel_p_diff"])}
    print(json.dumps(report, indent=1))
    if os.environ.get("E2E_REPORT_DIR"):
        with open(os.path.join(os.environ["E2E_REPORT_DIR"], f"draft-check-{pair}.json"), "w") as f:
            json.dump(report, f, indent=1)
        shutil.copy(check_file, os.path.join(os.environ["E2E_REPORT_DIR"], f"draft-check-{pair}.jsonl"))
    assert lines and requests_ >= len(PROMPTS)
    # Every differing tree follows two of SGLang's candidate scores within 0.5 % of each other (a bf16 near-tie).
    assert report["same_tree_rate"] >= SAME_TREE_RATE[pair] - SAME_TREE_MARGIN, report
    assert report["differing_trees_max_min_rel_gap"] is None or report["differing_trees_max_min_rel_gap"] < 1e-2


# "tp1-long": about 2000-token prompts (all the code prompts, rotated, ten times over) without deterministic
# inference, so that each request's prefix splits over several programs in the verify attention (one per
# kernels.verify_attention.SPLIT_TOKENS of it; deterministic inference keeps one pass).
# --tp 2: one tree (three servers of two ranks one at a time; five did not fit a 10-minute call)
VERIFY_ATTENTION_TREES = {"tp1": CONFIGS, "tp1-long": CONFIGS, "tp2": [(5, 4, 16)]}
LONG_PROMPTS = ["\n".join((PROMPTS[i:] + PROMPTS[:i]) * 10) for i in range(8)]


@pytest.mark.parametrize("parallel", ["tp1", "tp2", "tp1-long"])
def test_verify_attention_is_lossless(parallel, tmp_path):
    """The target verify attending through our kernel (verify.TreeVerifyAttention, the default; ``ours``) against
    SGLang's (``VERIFY_ATTENTION_ENV=0``; ``sglang``). Pass, on the trained pair at a chain and a tree (``--tp 2``: the
    tree): ours tie-aware equal to no-spec (``tp1-long`` too: batch-dependent rounding stays far inside the tie bound;
    SGLang's reported), its accept length at least ACCEPT_SHARE["ours"] of SGLang's attention's, each server's report
    naming the attention it ran, our kernel counted in ``/server_info`` and no kernel error."""
    from sgl_eagle_triton.config import VERIFY_ATTENTION_IN_USE

    long = parallel.endswith("-long")
    target, draft, _ = _pair("tiny-code-eagle3", tmp_path)
    flags, env = _parallel(parallel.removesuffix("-long"))
    sglangs = {**(env or {}), config.VERIFY_ATTENTION_ENV: "0"}
    server = functools.partial(e2e_server, deterministic=not long)
    servers = {"nospec": functools.partial(server, "va-nospec", target, flags, tmp_path, env=env)}
    trees = VERIFY_ATTENTION_TREES[parallel]
    for steps, topk, n in trees:
        spec = ["--speculative-algorithm", "EAGLE_TRITON", "--speculative-draft-model-path", draft,
                "--speculative-num-steps", str(steps), "--speculative-eagle-topk", str(topk),
                "--speculative-num-draft-tokens", str(n), *flags]
        servers["ours", n] = functools.partial(server, f"va-ours-{n}", target, spec, tmp_path, env=env)
        servers["sglang", n] = functools.partial(server, f"va-sglang-{n}", target, spec, tmp_path, env=sglangs)
    keys = [(attention, n) for _, _, n in trees for attention in ("ours", "sglang")]
    serve = functools.partial(serve_generate, prompts=LONG_PROMPTS) if long else serve_all
    results, infos = serve_concurrently(servers, serve, keys, one_at_a_time=parallel.startswith(("tp2", "tp4")))
    report = {}
    for _, _, n in trees:
        ours, theirs = results["ours", n], results["sglang", n]
        report[n] = {"accept_length": {"ours": ours["accept_length"], "sglang": theirs["accept_length"]},
                     "vs_nospec": verdicts(ours, results["nospec"]),
                     "sglang_vs_nospec": verdicts(theirs, results["nospec"]),
                     "attention": {a: infos[a, n]["eagle_triton"]["kernels"]["verify attention"]
                                   for a in ("ours", "sglang")},
                     "ran": infos["ours", n]["eagle_triton"]["ran"].get("triton verify_attention", 0)}
    print(json.dumps(report, indent=1))
    if os.environ.get("E2E_REPORT_DIR"):
        with open(os.path.join(os.environ["E2E_REPORT_DIR"], f"e2e-verify-attention-{parallel}.json"), "w") as f:
            json.dump(report, f, indent=1)
    for n, entry in report.items():
        assert not entry["vs_nospec"]["bugs"], (n, entry)
        assert entry["accept_length"]["ours"] >= entry["accept_length"]["sglang"] * ACCEPT_SHARE["ours"], (n, entry)
        assert entry["attention"]["ours"] == VERIFY_ATTENTION_IN_USE, entry
        assert entry["attention"]["sglang"] == "SGLang's TritonAttnBackend (turned off)", entry
        assert entry["ran"] > 0 and infos["ours", n]["eagle_triton"]["errors"] == [], (n, entry)
