"""bench/adaptive.py's pure-Python parts (server arguments, the decode rate, row merging, report) in CPU CI."""

import json
import os
import re
import time
from pathlib import Path

import pytest

from bench import adaptive, interleave
from bench.interleave import SHARED_GPU_FLAGS
from sgl_eagle_triton import config as sgl_config
from tests.fake_server import ServerLog


def test_spec_args_per_system(tmp_path):
    draft = tmp_path / "draft"
    assert adaptive.spec_args("nospec", draft, None, tmp_path) == []
    assert adaptive.spec_args("nospec_twin", draft, None, tmp_path) == []  # the A/A control: no-spec again
    assert adaptive.spec_args("eagle_triton", draft, (3, 1, 4), tmp_path)[-6:] == [
        "--speculative-num-steps", "3", "--speculative-eagle-topk", "1", "--speculative-num-draft-tokens", "4"]
    ours = adaptive.spec_args("eagle_triton_adaptive", draft, None, tmp_path)
    assert ours[-1] == "--speculative-adaptive" and "EAGLE_TRITON" in ours
    # SGLang 0.5.17 starts only at its widest candidate
    stock = adaptive.spec_args("eagle3_adaptive", draft, None, tmp_path)
    assert stock[-3:] == ["--speculative-adaptive", "--speculative-num-steps", "7"]
    cost = adaptive.spec_args("eagle_triton_cost", draft, None, tmp_path)
    config = json.loads(Path(cost[cost.index("--speculative-adaptive-config") + 1]).read_text())
    assert config["eagle_triton_policy"] == "cost" and config["1"]["candidate_steps"] == [0, 1, 3, 5, 7]
    trees = adaptive.spec_args("eagle_triton_cost_trees", draft, None, tmp_path)
    config = json.loads(Path(trees[trees.index("--speculative-adaptive-config") + 1]).read_text())
    assert config["eagle_triton_policy"] == "cost" and config["1"]["candidate_steps"] == [0, 1, 2, 3, 4, 5, 7]
    assert trees[trees.index("--speculative-eagle-topk") + 1] == "8"
    for steps, n in config["eagle_triton_draft_tokens"].items():  # every tree buildable (else refused at start)
        sgl_config._check_tree(int(steps), adaptive.TREE_TOPK, n)
    mixed = adaptive.spec_args("eagle_triton_cost_mixed", draft, None, tmp_path)
    config = json.loads(Path(mixed[mixed.index("--speculative-adaptive-config") + 1]).read_text())
    assert config["1"]["candidate_steps"] == [0, 1, 2, 3, 4, 5, 7]
    assert config["eagle_triton_draft_tokens"]["3"] == [1, 4]  # a chain among the trees
    for steps, entry in config["eagle_triton_draft_tokens"].items():
        sgl_config._check_tree(int(steps), *(entry if isinstance(entry, list) else (adaptive.TREE_TOPK, entry)))
    off = adaptive.spec_args("eagle_triton_off", draft, None, tmp_path)
    config = json.loads(Path(off[off.index("--speculative-adaptive-config") + 1]).read_text())
    assert config == {"1": {"candidate_steps": [0]}, "65": {"candidate_steps": [1]}} and "EAGLE_TRITON" in off
    assert off[-2:] == ["--speculative-num-steps", "1"]
    stock_off = adaptive.spec_args("eagle3_off", draft, None, tmp_path)  # stock's steps 0 under the same file
    assert "EAGLE3" in stock_off and stock_off.count("--speculative-num-steps") == 1
    assert stock_off[-4:] == off[-4:]
    assert adaptive.simulation_env(3.5)["SGLANG_SIMULATE_ACC_LEN"] == "3.5"
    assert adaptive.acceptance_label(3.5) == "simulated:sglang-match-expected-3.5"
    env = adaptive.simulation_env(3.5, "llama31-8b-eagle3")
    assert env == {"SGLANG_EAGLE_TRITON_SIMULATED_ACCEPTANCE": "llama31-8b-eagle3",
                   "SGLANG_EAGLE_TRITON_BENCHMARK": "1"}
    assert adaptive.acceptance_label(3.5, "llama31-8b-eagle3") == "simulated:llama31-8b-eagle3"


def test_the_trained_pair_serves_real_weights_on_code_prompts():
    args = adaptive.real_pair_args([1, 8])
    assert "--load-format" not in args and "--skip-tokenizer-init" not in args and "--cuda-graph-bs-decode" in args
    assert adaptive.prompts_for(3, 0, True) == list(adaptive.CODE_PROMPTS[:3])
    assert all(isinstance(p, list) for p in adaptive.prompts_for(2, 0, False))
    assert (adaptive.TRAINED_PAIR / "eagle3" / "config.json").exists()


def test_tok_per_s_sums_each_requests_decode_rate():
    results = [{"times": [0.0, 1.0, 2.0], "meta": {"completion_tokens": 201}},  # 100 tok/s
               {"times": [0.5, 1.5], "meta": {"completion_tokens": 51}},  # 50 tok/s
               {"times": [0.5], "meta": {"completion_tokens": 1}}]  # one chunk: no decode rate
    assert adaptive.tok_per_s(results) == 150.0


def test_the_longest_gap_between_two_chunks_of_a_request_shows_a_stall():
    results = [{"times": [0.0, 0.01, 0.02, 0.52, 0.53]}, {"times": [0.0, 0.015]}, {"times": [0.3]}]
    assert adaptive.longest_gap_ms(results) == pytest.approx(500.0) and adaptive.longest_gap_ms([]) == 0.0


def test_small_batches_run_rounds_of_at_least_sixteen_requests(monkeypatch):
    """Batch 1 runs 16 rounds (one request's simulated acceptance is noisy), batch 3 six, batch 16 and up one;
    tok/s is the mean of the rounds' rates, the accept length the mean over requests."""
    assert [adaptive.rounds_for(b) for b in (1, 3, 4, 8, 16, 64)] == [16, 6, 4, 2, 1, 1]
    sent = []

    def fake(url, prompt):
        sent.append(prompt)
        n = len(sent)
        return {"times": [0.0, 1.0], "meta": {"completion_tokens": 1 + 10 * n, "spec_accept_length": float(n)}}

    monkeypatch.setattr(adaptive, "timed_request", fake)
    result = adaptive.measure("http://x", 1)
    assert len(sent) == 1 + 1 + 16 and result["rounds"] == 16  # warm-up request, warm-up batch, 16 rounds
    assert result["tok_per_s"] == 10 * sum(range(3, 19)) / 16 and result["accept_len"] == sum(range(3, 19)) / 16
    assert result["longest_gap_ms"] == 1000.0
    assert len({tuple(p) for p in sent[2:]}) == 16  # every round its own prompt


def _row(system, batch, tps, shape=(None, None, None), acceptance="simulated:x"):
    return dict(system=system, steps=shape[0], topk=shape[1], draft_tokens=shape[2], batch=batch, tok_per_s=tps,
                accept_len=2.0, acceptance=acceptance, gpu="GPU X", sglang_version="0.5.17")


def test_rows_merge_and_report_ratios(tmp_path):
    path = tmp_path / "a.json"
    path.write_text("[]")
    first = [_row("nospec", 8, 1000.0), _row("eagle3", 8, 1500.0, (3, 1, 4))]
    merged = adaptive.merge_rows(path, first)
    path.write_text(json.dumps(merged))
    merged = adaptive.merge_rows(path, [_row("eagle3", 8, 1200.0, (3, 1, 4)), _row("eagle_triton_adaptive", 8, 1800.0)])
    assert len(merged) == 3 and {r["tok_per_s"] for r in merged} == {1000.0, 1200.0, 1800.0}
    table = adaptive.report(merged)
    assert "| simulated:x | 8 | eagle_triton_adaptive | 1800 | 2.00 | 1.80 | 1.50 |" in table
    assert "| simulated:x | 8 | eagle3 (3,1,4) | 1200 | 2.00 | 1.20 | 0.67 |" in table
    assert "| simulated:x | 8 | nospec | 1000 | 2.00 | - | 0.56 |" in table


def test_lanes_on_several_cards_compare_with_their_own_cards_nospec(tmp_path, monkeypatch):
    """Rows of lanes on cards 0 and 1 (each with its no-spec) merge without overwriting each other; `/ nospec` is
    against the same card's no-spec, and `/ best other` compares those ratios (card 1 runs 10 % faster here)."""
    lane0 = [{**_row("nospec", 8, 1000.0), "card": "0"}, {**_row("eagle3", 8, 1500.0, (3, 1, 4)), "card": "0"}]
    lane1 = [{**_row("nospec", 8, 1100.0), "card": "1"}, {**_row("eagle_triton", 8, 1650.0, (3, 1, 4)), "card": "1"}]
    paths = []
    for i, rows in enumerate((lane0, lane1)):
        paths.append(tmp_path / f"lane{i}.json")
        paths[-1].write_text(json.dumps(rows))
    out = tmp_path / "merged.json"
    plotted = []
    monkeypatch.setattr(adaptive, "plot", lambda rows, path: plotted.append(len(rows)))  # matplotlib: GPU hosts
    adaptive.main(["--merge", *map(str, paths), "--out", str(out)])
    assert len(json.loads(out.read_text())) == 4
    table = out.with_suffix(".md").read_text()
    assert "shares labelled 0, 1" in table
    assert "| simulated:x | 8 | eagle_triton (3,1,4) [card 1] | 1650 | 2.00 | 1.50 | 1.00 |" in table
    assert "| simulated:x | 8 | eagle3 (3,1,4) [card 0] | 1500 | 2.00 | 1.50 | 1.00 |" in table
    assert "| simulated:x | 8 | nospec [card 0] | 1000 | 2.00 | - | 0.67 |" in table
    assert plotted == [4]


@pytest.mark.parametrize(("key", "value"), [("env", "SGLANG_EAGLE_TRITON_VERIFY_ATTENTION=0"),
                                            ("flags", "--attention-backend flashinfer")])
def test_rows_run_under_extra_environment_or_flags_are_their_own_rows(tmp_path, key, value):
    """``--server-env`` (e.g. SGLang's verify attention back) or ``--server-flags`` (e.g. another attention backend):
    such rows keep ``env`` / ``flags``, merge beside the plain ones and say so."""
    path = tmp_path / "a.json"
    plain = _row("eagle_triton_cost", 64, 9000.0)
    other = {**_row("eagle_triton_cost", 64, 9900.0), key: value}
    merged = adaptive.merge_rows(path, [_row("nospec", 64, 8000.0), plain, other])
    assert len(merged) == 3
    table = adaptive.report(merged)
    assert f"| simulated:x | 64 | eagle_triton_cost {{{value}}} | 9900 |" in table
    assert "| simulated:x | 64 | eagle_triton_cost | 9000 |" in table


def _fake_sweep(monkeypatch, tmp_path, state=None) -> ServerLog:
    """bench.adaptive.main on fake servers (recorded in the returned log), models, measurements and GPU."""
    servers = ServerLog(state)
    monkeypatch.setattr(adaptive, "Server", servers.server_class())
    monkeypatch.setattr(adaptive, "write_models", lambda workdir: (tmp_path / "t", tmp_path / "d"))
    monkeypatch.setattr(adaptive, "measure", lambda url, batch, real=False: {"tok_per_s": 1.0, "accept_len": 1.0,
                                                                              "rounds": 1})
    monkeypatch.setattr(adaptive, "plot", lambda rows, path: None)
    monkeypatch.setattr("torch.cuda.get_device_name", lambda: "fake GPU")
    return servers


def test_a_sweep_passes_its_extra_flags_to_every_server(tmp_path, monkeypatch):
    """``--server-flags``: on every server's command line, and in every row it measured (with the verify attention
    the server reports: SGLang's on flashinfer)."""
    attention = "SGLang's FlashInferAttnBackend (our kernel replaces the triton backend's)"
    servers = _fake_sweep(monkeypatch, tmp_path, {"eagle_triton": {"kernels": {"verify attention": attention}}})
    out = tmp_path / "sweep.json"
    adaptive.main(["--systems", "nospec", "eagle_triton_cost", "--batches", "1", "--workdir", str(tmp_path),
                   "--out", str(out), "--server-flags", "--attention-backend flashinfer"])
    assert len(servers.started) == 2 and all(a[-2:] == ["--attention-backend", "flashinfer"] for a in servers.started)
    rows = json.loads(out.read_text())
    assert {r["flags"] for r in rows} == {"--attention-backend flashinfer"}
    assert {r["verify_attention"] for r in rows} == {"sglang"}
    assert {r["system"]: r["candidates"] for r in rows} == {"nospec": None, "eagle_triton_cost": [0, 1, 3, 5, 7]}


def test_only_the_skip_system_skips_the_steps_0_draft_extend(tmp_path, monkeypatch):
    """eagle3_off_skip: stock's steps 0 with SGLANG_SPEC_SKIP_ZERO_STEP_DRAFT_EXTEND=1 in its own environment only
    (set on our server it would skip our KV fill too); --server-env still reaches every server."""
    servers = _fake_sweep(monkeypatch, tmp_path)
    adaptive.main(["--systems", "nospec", "eagle_triton_off", "eagle3_off", "eagle3_off_skip", "--batches", "1",
                   "--workdir", str(tmp_path), "--out", str(tmp_path / "s.json"), "--server-env", "X=1"])
    skips = [env.get("SGLANG_SPEC_SKIP_ZERO_STEP_DRAFT_EXTEND") for env in servers.envs]
    assert skips == [None, None, None, "1"] and all(env["X"] == "1" for env in servers.envs)
    assert servers.started[3] == servers.started[2]  # the same server otherwise


def test_interleave_measures_every_server_twice_per_batch_in_alternating_order(tmp_path, monkeypatch):
    """``--interleave``: all servers up at once with the shared-GPU flags; per batch each is measured once in one
    order and once in the reverse, the first order alternating between batches; a row is the mean of its two
    timings. The trained pair's servers get its text prompts, 8B-shaped ones (dummy weights) token prompts."""
    measured, servers, real_seen = [], ServerLog(), []

    def measure(url, batch, real=False):
        measured.append((url, batch))
        real_seen.append(real)
        return {"tok_per_s": float(len(measured)), "accept_len": 2.0, "rounds": 1, "longest_gap_ms": 1.0}

    monkeypatch.setattr(adaptive, "Server", servers.server_class())
    monkeypatch.setattr(adaptive, "measure", measure)
    monkeypatch.setattr(adaptive, "plot", lambda rows, path: None)
    monkeypatch.setattr("torch.cuda.get_device_name", lambda: "fake GPU")
    out = tmp_path / "sweep.json"
    argv = ["--systems", "nospec", "eagle_triton_cost", "--batches", "1", "4", "--workdir", str(tmp_path),
            "--out", str(out), "--interleave"]
    monkeypatch.setattr(adaptive, "write_models", lambda workdir: (tmp_path / "t", tmp_path / "d"))
    adaptive.main([*argv, "--out", str(tmp_path / "8b.json")])  # 8B shapes: the same order, token prompts
    assert len(measured) == 8 and real_seen == [False] * 8 and len(servers.started) == 2
    measured.clear(), real_seen.clear(), servers.started.clear(), servers.events.clear(), servers.stopped.clear()
    adaptive.main([*argv, "--real-pair"])
    assert real_seen == [True] * 8
    assert len(servers.started) == 2 and all(a[-3:] == SHARED_GPU_FLAGS for a in servers.started)
    # the cost policy's server times its graphs at start-up: it starts alone, the others once it is ready
    assert servers.events[:4] == [("start", "eagle_triton_cost"), ("ready", "eagle_triton_cost"), ("start", "nospec"),
                      ("ready", "nospec")]
    assert measured == [("nospec", 1), ("eagle_triton_cost", 1), ("eagle_triton_cost", 1), ("nospec", 1),
                        ("eagle_triton_cost", 4), ("nospec", 4), ("nospec", 4), ("eagle_triton_cost", 4)]
    rows = {(r["system"], r["batch"]): r for r in json.loads(out.read_text())}
    assert rows["nospec", 1]["runs"] == [1.0, 4.0] and rows["nospec", 1]["tok_per_s"] == 2.5
    assert rows["eagle_triton_cost", 4]["runs"] == [5.0, 8.0] and rows["eagle_triton_cost", 4]["tok_per_s"] == 6.5
    assert sorted(servers.stopped) == ["eagle_triton_cost", "nospec"]
    # run by run: the cost policy's run i over no-spec's run i (2 / 1, 3 / 4), their geometric mean
    assert "| 1 | eagle_triton_cost / nospec | 2.00 / 0.75 | 1.225 |" in out.with_suffix(".md").read_text()


def test_round_robin_takes_turns_round_by_round_on_the_same_prompts(tmp_path, monkeypatch):
    """``--round-robin``: per batch every server is warmed up once (in the batch's first order), then each run is one
    round (``rounds=1``, no warm-up) and run ``r`` of every server is round ``r`` (the same prompts), the servers
    taking turns as in ``--interleave``. Without ``--interleave`` it is refused."""
    calls, servers = [], ServerLog()

    def measure(url, batch, real=False, first_round=0, rounds=None, warm=True):
        calls.append(("run", url, batch, first_round, rounds, warm))
        return {"tok_per_s": float(len(calls)), "accept_len": 2.0, "rounds": 1, "longest_gap_ms": 1.0}

    monkeypatch.setattr(adaptive, "Server", servers.server_class())
    monkeypatch.setattr(adaptive, "measure", measure)
    monkeypatch.setattr(adaptive, "warm_up", lambda url, batch, real=False: calls.append(("warm", url, batch)))
    monkeypatch.setattr(adaptive, "plot", lambda rows, path: None)
    monkeypatch.setattr("torch.cuda.get_device_name", lambda: "fake GPU")
    out = tmp_path / "sweep.json"
    argv = ["--systems", "nospec", "eagle_triton_cost", "--batches", "1", "4", "--workdir", str(tmp_path),
            "--out", str(out), "--real-pair", "--round-robin", "--repeats", "2"]
    with pytest.raises(SystemExit, match="--round-robin needs --interleave"):
        adaptive.main(argv)
    adaptive.main([*argv, "--interleave"])
    cost = "eagle_triton_cost"
    assert calls == [("warm", "nospec", 1), ("warm", cost, 1),
                     ("run", "nospec", 1, 0, 1, False), ("run", cost, 1, 0, 1, False),
                     ("run", cost, 1, 1, 1, False), ("run", "nospec", 1, 1, 1, False),
                     ("warm", cost, 4), ("warm", "nospec", 4),
                     ("run", cost, 4, 0, 1, False), ("run", "nospec", 4, 0, 1, False),
                     ("run", "nospec", 4, 1, 1, False), ("run", cost, 4, 1, 1, False)]
    rows = {(r["system"], r["batch"]): r for r in json.loads(out.read_text())}
    assert rows["nospec", 1]["runs"] == [3.0, 6.0] and rows[cost, 4]["runs"] == [9.0, 12.0]
    assert {(r["rounds"], r["round_robin"]) for r in rows.values()} == {(2, True)}  # a round per run, marked
    paired = [line for line in out.with_suffix(".md").read_text().splitlines() if "} / " in line]
    # the cost policy over no-spec only, run r over run r: 4 / 3, 5 / 6 at batch 1; 9 / 10, 12 / 11 at batch 4
    assert paired == ["| 1 | eagle_triton_cost {round-robin} / nospec {round-robin} | 1.33 / 0.83 | 1.054 | "
                      "0.239–4.648 |",
                      "| 4 | eagle_triton_cost {round-robin} / nospec {round-robin} | 0.90 / 1.09 | 0.991 | "
                      "0.540–1.819 |"]


def test_rounds_per_run_makes_each_round_robin_run_several_rounds(tmp_path, monkeypatch):
    """``--rounds-per-run N``: run r of every server is rounds rN .. rN + N - 1 (the same prompts for every server);
    its rows are marked, labelled and never paired with or replaced by one-round rows; refused without
    ``--round-robin`` or below 1."""
    calls, servers = [], ServerLog()

    def measure(url, batch, real=False, first_round=0, rounds=None, warm=True):
        calls.append((url, batch, first_round, rounds, warm))
        return {"tok_per_s": float(len(calls)), "accept_len": 2.0, "rounds": rounds, "longest_gap_ms": 1.0}

    monkeypatch.setattr(adaptive, "Server", servers.server_class())
    monkeypatch.setattr(adaptive, "measure", measure)
    monkeypatch.setattr(adaptive, "warm_up", lambda url, batch, real=False: None)
    monkeypatch.setattr(adaptive, "plot", lambda rows, path: None)
    monkeypatch.setattr("torch.cuda.get_device_name", lambda: "fake GPU")
    out = tmp_path / "sweep.json"
    argv = ["--systems", "nospec", "eagle_triton_cost", "--batches", "1", "--workdir", str(tmp_path),
            "--out", str(out), "--real-pair", "--interleave", "--repeats", "2"]
    for bad in (["--rounds-per-run", "4"], ["--round-robin", "--rounds-per-run", "0"]):
        with pytest.raises(SystemExit, match="--rounds-per-run"):
            adaptive.main([*argv, *bad])
    adaptive.main([*argv, "--round-robin"])
    adaptive.main([*argv, "--round-robin", "--rounds-per-run", "4"])
    runs = [c for c in calls if c[0] == "nospec"]
    assert runs == [("nospec", 1, 0, 1, False), ("nospec", 1, 1, 1, False),  # one round a run
                    ("nospec", 1, 0, 4, False), ("nospec", 1, 4, 4, False)]  # rounds 0-3, then 4-7
    rows = json.loads(out.read_text())
    assert sorted((r["system"], r.get("rounds_per_run", 1), r["rounds"]) for r in rows) == [
        ("eagle_triton_cost", 1, 2), ("eagle_triton_cost", 4, 8), ("nospec", 1, 2), ("nospec", 4, 8)]
    paired = [line for line in out.with_suffix(".md").read_text().splitlines() if "} / " in line]
    assert len(paired) == 2 and "{round-robin 4 rounds a run} / nospec {round-robin 4 rounds a run}" in "".join(paired)


def test_measure_sends_each_rounds_prompts_after_the_warm_up(monkeypatch):
    """``measure``: the warm-up request (seed 99) and batch (seed 1), then round r on seed 0 (r = 0) or 100 + r;
    ``first_round`` / ``rounds`` / ``warm=False`` (a round-robin run) send that one round alone."""
    sent = []

    def timed_request(url, prompt):
        sent.append(prompt)
        return {"times": [0.0, 1.0], "meta": {"completion_tokens": 11, "spec_accept_length": 2.0}}

    monkeypatch.setattr(adaptive, "timed_request", timed_request)
    seeds = lambda batch, *ss: [p for s in ss for p in adaptive.prompts_for(batch, s, True)]  # noqa: E731
    assert adaptive.measure("u", 1, True)["tok_per_s"] == 10.0
    assert sent == seeds(1, 99, 1, 0, *range(101, 116))  # 16 rounds at batch 1
    sent.clear()
    result = adaptive.measure("u", 4, True, first_round=3, rounds=1, warm=False)
    assert sent == seeds(4, 103) and result["rounds"] == 1 and result["tok_per_s"] == 40.0


def test_runs_of_different_sweeps_are_not_paired():
    """Two interleaved sweeps merged into one file: the report pairs runs only within a sweep (``session``)."""
    base = dict(steps=None, topk=None, draft_tokens=None, batch=1, acceptance="real:x", gpu="g",
                sglang_version="v", accept_len=2.0, longest_gap_ms=1.0)
    rows = [dict(base, system="nospec", tok_per_s=2.0, runs=[1.0, 3.0], session="a"),
            dict(base, system="eagle_triton_cost", tok_per_s=2.0, runs=[2.0, 2.0], session="b")]
    assert "Run by run" not in adaptive.report(rows)
    rows[1]["session"] = "a"
    assert "| 1 | eagle_triton_cost / nospec | 2.00 / 0.67 | 1.155 |" in adaptive.report(rows)
    # steps 0 for good over no-spec (a plain decode step), run by run; two policies pair each with the other
    rows.append(dict(base, system="eagle_triton_off", tok_per_s=1.5, runs=[1.0, 2.0], session="a"))
    report = adaptive.report(rows)
    assert "| 1 | eagle_triton_off / nospec | 1.00 / 0.67 |" in report
    assert "| 1 | eagle_triton_off / eagle_triton_cost | 0.50 / 1.00 |" in report


def test_the_before_system_serves_another_trees_package(tmp_path):
    """eagle_triton_before: the same flags as eagle_triton, its server's path led by --before-tree, ahead of the
    working directory (PYTHONSAFEPATH), for an interleaved A/B of a change."""
    draft = tmp_path / "draft"
    assert adaptive.spec_args("eagle_triton_before", draft, (3, 1, 4), tmp_path) == adaptive.spec_args(
        "eagle_triton", draft, (3, 1, 4), tmp_path)
    env = adaptive.before_tree_env(tmp_path / "old", "/tmp/site")
    assert env == {"PYTHONSAFEPATH": "1", "PYTHONPATH": f"{tmp_path / 'old'}:/tmp/site"}
    assert adaptive.before_tree_env(None, "/tmp/site") == {}
    with pytest.raises(SystemExit):
        adaptive.parse_args(["--systems", "eagle_triton_before", "--real-pair"])
    args = adaptive.parse_args(["--systems", "eagle_triton_before", "--before-tree", "/old"])
    assert args.before_tree == Path("/old")
    # the cost policy and the steps-0 systems too, each as its current twin (the same server environment)
    assert adaptive.BEFORE_SYSTEMS == ["eagle_triton_before", "eagle_triton_cost_before", "eagle_triton_off_before",
                                       "eagle_triton_off_plain_before", "eagle_triton_off_nonspec_before"]
    for system in ("eagle_triton_cost", "eagle_triton_off", "eagle_triton_off_plain", "eagle_triton_off_nonspec"):
        assert adaptive.spec_args(f"{system}_before", draft, None, tmp_path) == adaptive.spec_args(
            system, draft, None, tmp_path)
        assert adaptive.SYSTEM_ENV.get(f"{system}_before") == adaptive.SYSTEM_ENV.get(system)
    with pytest.raises(SystemExit):
        adaptive.parse_args(["--systems", "nospec", "eagle_triton_off_plain_before", "--real-pair"])
    assert not set(adaptive.BEFORE_SYSTEMS) & set(adaptive.parse_args([]).systems)
    # the cost policy with plain steps 0 required on the speculative path / with SGLang's steps-0 verify / with its
    # held steps 0 required as no-spec decode or kept on the speculative path: the cost policy's server, the variables
    # set; steps 0 for good with SGLang's verify (the default is the plain step, held as no-spec decode)
    plain, route = "SGLANG_EAGLE_TRITON_PLAIN_OFF", "SGLANG_EAGLE_TRITON_OFF_NONSPEC"
    for system, env in (("eagle_triton_cost_plain", {plain: "1", route: "0"}),
                        ("eagle_triton_cost_sglang_off", {plain: "0"}),
                        ("eagle_triton_cost_nonspec", {plain: "1", route: "1"}),
                        ("eagle_triton_cost_spec_path", {route: "0"})):
        assert adaptive.spec_args(system, draft, None, tmp_path) == adaptive.spec_args(
            "eagle_triton_cost", draft, None, tmp_path)
        assert adaptive.SYSTEM_ENV[system] == env
    assert adaptive.SYSTEM_ENV["eagle_triton_off"] == {"SGLANG_EAGLE_TRITON_PLAIN_OFF": "0"}
    assert adaptive.SYSTEM_ENV["eagle_triton_cost_plain"] == adaptive.SYSTEM_ENV["eagle_triton_off_plain"]
    assert "eagle_triton_cost" not in adaptive.SYSTEM_ENV
    # the lean draft phase required (=1) and SGLang's draft phase (=0) beside their twin, in a sweep only when named
    for system in ("eagle_triton", "eagle_triton_cost"):
        for suffix, value in (("_lean", "1"), ("_sglang_draft", "0")):
            assert adaptive.spec_args(f"{system}{suffix}", draft, (3, 1, 4), tmp_path) == adaptive.spec_args(
                system, draft, (3, 1, 4), tmp_path)
            assert adaptive.SYSTEM_ENV[f"{system}{suffix}"] == {"SGLANG_EAGLE_TRITON_LEAN_DRAFT": value}
    assert not set(adaptive.LEAN_SYSTEMS) & set(adaptive.parse_args([]).systems)


def _interleaved_sweep(tmp_path, monkeypatch, servers: ServerLog, flag: str, measure=lambda url: None, extra=(),
                       repeats: int = 1) -> tuple:
    """A two-server ``--real-pair`` sweep with ``flag`` (and ``extra`` flags) on ``servers`` (fakes), ``repeats`` runs
    a batch: refused without ``--interleave``, then run with it, ``measure(url)`` called at each measurement. Returns
    its rows and its report."""
    monkeypatch.setattr(adaptive, "Server", servers.server_class())
    monkeypatch.setattr(adaptive, "measure", lambda url, batch, real=False: measure(url) or {
        "tok_per_s": 1.0, "accept_len": 1.0, "rounds": 1, "longest_gap_ms": 1.0})
    monkeypatch.setattr(adaptive, "plot", lambda rows, path: None)
    monkeypatch.setattr("torch.cuda.get_device_name", lambda: "fake GPU")
    out = tmp_path / "sweep.json"
    argv = ["--systems", "nospec", "eagle_triton_off", "--batches", "1", "--workdir", str(tmp_path), "--out",
            str(out), "--real-pair", flag, *extra, "--repeats", str(repeats)]
    with pytest.raises(SystemExit, match=f"{flag} needs --interleave"):
        adaptive.main(argv)
    adaptive.main([*argv, "--interleave"])
    return json.loads(out.read_text()), out.with_suffix(".md").read_text()


def test_freeze_gc_freezes_every_server_after_one_request_before_measuring(tmp_path, monkeypatch):
    """``--freeze-gc`` (with ``--interleave``): once all servers are up, each serves one request and then gets SGLang's
    ``/freeze_gc``, all before the first measurement; rows carry ``freeze_gc`` (part of their key and label)."""
    servers, calls = ServerLog(), []
    monkeypatch.setattr(adaptive, "timed_request", lambda url, prompt, **kw: servers.events.append(("request", url)))
    rows, report = _interleaved_sweep(tmp_path, monkeypatch, servers, "--freeze-gc",
                                      lambda url: calls.append(url) or servers.events.append(("measure", url)))
    events = [e for e in servers.events if e[0] not in ("start", "ready", "stop")]
    assert events[:4] == [("request", "nospec"), ("post /freeze_gc", "nospec"), ("request", "eagle_triton_off"),
                          ("post /freeze_gc", "eagle_triton_off")]
    assert sorted(calls) == ["eagle_triton_off", "nospec"] and all(e[0] == "measure" for e in events[4:])
    assert [r["freeze_gc"] for r in rows] == [True, True]
    assert "nospec {freeze-gc}" in report


def test_core_shares_give_each_server_its_own_cores_and_keep_some_for_the_client():
    shares, client = interleave.core_shares(list(range(16)), 4)
    assert shares == [[0, 1, 2], [3, 4, 5], [6, 7, 8], [9, 10, 11]]
    assert client == [12, 13, 14, 15]  # (16 - 2) // 4 = 3 a server; the rest, at least two, for the client
    shares, client = interleave.core_shares([7, 3, 5, 1, 2, 6], 2)
    assert shares == [[1, 2], [3, 5]] and client == [6, 7]
    for cores, servers in ((list(range(5)), 2), (list(range(16)), 8), (list(range(4)), 0)):
        with pytest.raises(ValueError, match="cannot give"):
            interleave.core_shares(cores, servers)
    assert interleave.pinned(("python", "-m", "x"), [4, 5]) == ("taskset", "-c", "4,5", "python", "-m", "x")


def test_rotated_shares_put_every_server_on_every_share_once_in_as_many_runs():
    shares = [[0, 1], [2, 3], [4, 5]]
    for run in range(3):  # within a run (a repeat) the servers' shares are a permutation of the shares
        assert sorted(interleave.rotated(shares, i, run) for i in range(3)) == shares
    for i in range(3):  # over three runs a server visits every share
        assert sorted(interleave.rotated(shares, i, run) for run in range(3)) == shares
    assert [interleave.rotated(shares, 1, run) for run in range(4)] == [[2, 3], [4, 5], [0, 1], [2, 3]]


def _proc(root, pid: int, group: int, threads=(), comm="python3 (x) y"):
    """A /proc entry: process ``pid`` of process group ``group`` (its stat: ``pid (comm) state ppid pgrp ...``; a
    command name may hold spaces and parentheses) with ``threads`` (its own pid among them)."""
    (root / str(pid) / "task").mkdir(parents=True)
    (root / str(pid) / "stat").write_text(f"{pid} ({comm}) S 1 {group} {group} 0 -1 4194560 0 0\n")
    for tid in (pid, *threads):
        (root / str(pid) / "task" / str(tid)).mkdir()


def test_repin_moves_every_thread_of_the_servers_session_and_nothing_else(tmp_path):
    _proc(tmp_path, 100, 100, threads=(101, 102))  # the launcher, leader of the server's session
    _proc(tmp_path, 110, 100, threads=(111,))  # its scheduler
    _proc(tmp_path, 120, 100)  # its detokenizer
    _proc(tmp_path, 200, 200, threads=(201,))  # another server
    (tmp_path / "self").mkdir()  # not a process directory
    moved = []
    assert interleave.repin(100, [4, 5], proc=tmp_path, set_affinity=lambda tid, cores: moved.append((tid, cores))) == 6
    assert sorted(moved) == [(t, [4, 5]) for t in (100, 101, 102, 110, 111, 120)]

    def ended(tid, cores):  # a thread that ended meanwhile is skipped
        if tid == 101:
            raise ProcessLookupError(tid)
    assert interleave.repin(100, [4, 5], proc=tmp_path, set_affinity=ended) == 5


def test_repin_moves_a_real_process_group(tmp_path):
    """On this host's /proc: a child in a session of its own, and its child, both moved to one core."""
    import subprocess
    import sys

    core = sorted(os.sched_getaffinity(0))[-1]
    child = subprocess.Popen([sys.executable, "-c", "import subprocess, sys, time; subprocess.Popen([sys.executable, "
                              "'-c', 'import time; time.sleep(30)']); time.sleep(30)"], start_new_session=True)
    try:
        for _ in range(100):  # the grandchild started
            group = [p for p in Path("/proc").glob("[0-9]*/stat") if _group_of(p) == child.pid]
            if len(group) == 2:
                break
            time.sleep(0.05)
        assert interleave.repin(child.pid, [core]) >= 2
        assert all(os.sched_getaffinity(int(p.parent.name)) == {core} for p in group)
    finally:
        os.killpg(child.pid, 9)
        child.wait()


def _group_of(stat: Path) -> int | None:
    try:
        return int(stat.read_text().rsplit(")", 1)[1].split()[2])
    except (OSError, IndexError, ValueError):
        return None


def test_rotate_cores_turns_the_servers_shares_before_each_run(tmp_path, monkeypatch):
    """``--rotate-cores`` (with ``--pin-cores``): before each run the server's session moves to its share of that run
    (bench.interleave.rotated), its first run on the share it started on; rows carry ``rotate_cores``."""
    servers, moved = ServerLog(), []
    monkeypatch.setattr(adaptive.os, "sched_getaffinity", lambda pid: set(range(10)))
    monkeypatch.setattr(adaptive.os, "sched_setaffinity", lambda pid, cores: None)
    monkeypatch.setattr(adaptive.shutil, "which", lambda name: f"/usr/bin/{name}")
    monkeypatch.setattr(adaptive, "repin", lambda group, share: moved.append((group, share)))
    with pytest.raises(SystemExit, match="--rotate-cores needs --pin-cores"):
        adaptive.main(["--real-pair", "--interleave", "--rotate-cores", "--out", str(tmp_path / "x.json")])
    rows, report = _interleaved_sweep(tmp_path, monkeypatch, servers, "--pin-cores", extra=("--rotate-cores",),
                                      repeats=2)
    a, b = [0, 1, 2, 3], [4, 5, 6, 7]  # the shares the two servers started on (nospec 1000, the other 1001)
    assert sorted(moved) == sorted([(1000, a), (1001, b), (1000, b), (1001, a)])
    assert moved[:2] in ([(1000, a), (1001, b)], [(1001, b), (1000, a)])  # the first repeat: each on its own
    assert [r["rotate_cores"] for r in rows] == [True, True]
    assert "nospec {pinned rotated}" in report


def test_rows_of_adaptive_servers_keep_what_the_policy_chose_and_its_prices(tmp_path, monkeypatch):
    """Each row of an adaptive server carries ``policy``: its steps in force, how its steps 0 ran (plain steps, those
    from the target graph's epilogue, resumes) and the cost policy's switches, rates, graph replays, rests and their
    spreads, read from ``/server_info`` after the batch; other servers' rows carry none."""
    from sgl_eagle_triton.off_route import NONSPEC_STEP
    from sgl_eagle_triton.off_step import PLAIN_OFF_STEP
    from sgl_eagle_triton.worker import GRAPH_EPILOGUE

    report = {"adaptive_steps_in_force": {"0": 5, "3": 2}, "adaptive_resumes": 2,
              "ran": {PLAIN_OFF_STEP: 5, GRAPH_EPILOGUE: 4, NONSPEC_STEP: 3, "triton build_tree": 2},
              "adaptive_policy": {"policy": "cost", "steps": 0, "switches": 3, "depth_rates": [0.5], "rest_ms": {
                  "0,1": 1.5}, "rest_spread_ms": {"0,1": [1.4, 1.8, 32]}, "replay_ms": {"0,1": 0.1}}}
    servers = ServerLog(state={"eagle_triton": report})
    monkeypatch.setattr(adaptive, "timed_request", lambda url, prompt, **kw: None)
    rows, _ = _interleaved_sweep(tmp_path, monkeypatch, servers, "--freeze-gc")
    assert [r["policy"] for r in rows] == [{"steps_in_force": {"0": 5, "3": 2},
                                            "steps_0": {"plain": 5, "graph_epilogue": 4, "resumes": 2,
                                                                "held": 3},
                                            "switches": 3, "depth_rates": [0.5],
                                            "replay_ms": {"0,1": 0.1}, "rest_ms": {"0,1": 1.5},
                                            "rest_spread_ms": {"0,1": [1.4, 1.8, 32]}}] * 2
    sglang_policy = ServerLog(state={"eagle_triton": {"adaptive_steps_in_force": {"3": 7}}}).server_class()(
        "eagle_triton_adaptive", "m", [], "w")  # SGLang's policy, no steps 0 run yet
    assert adaptive.policy_state(sglang_policy) == {"steps_in_force": {"3": 7},
                                                    "steps_0": {"plain": 0, "graph_epilogue": 0, "resumes": 0,
                                                                "held": 0}}
    assert adaptive.policy_state(ServerLog().server_class()("nospec", "m", [], "w")) is None


def test_pin_cores_starts_each_server_on_its_share_and_labels_the_rows(tmp_path, monkeypatch):
    """``--pin-cores`` (with ``--interleave``): every server's command starts with ``taskset -c <its share>``, the
    shares disjoint, this process on the rest; rows carry ``pin_cores`` (part of their key and label)."""
    servers, pinned_to = ServerLog(), []
    monkeypatch.setattr(adaptive.os, "sched_getaffinity", lambda pid: set(range(10)))
    monkeypatch.setattr(adaptive.os, "sched_setaffinity", lambda pid, cores: pinned_to.append(list(cores)))
    monkeypatch.setattr(adaptive.shutil, "which", lambda name: None)
    with pytest.raises(SystemExit, match="--pin-cores needs taskset"):
        adaptive.main(["--real-pair", "--interleave", "--pin-cores", "--out", str(tmp_path / "x.json")])
    monkeypatch.setattr(adaptive.shutil, "which", lambda name: f"/usr/bin/{name}")
    rows, report = _interleaved_sweep(tmp_path, monkeypatch, servers, "--pin-cores")
    assert [p[:3] for p in servers.programs] == [("taskset", "-c", "0,1,2,3"), ("taskset", "-c", "4,5,6,7")]
    assert all(p[3:] == tuple(adaptive.LAUNCH_SERVER) for p in servers.programs) and pinned_to == [[8, 9]]
    assert [r["pin_cores"] for r in rows] == [True, True]
    assert "nospec {pinned}" in report


def test_rows_of_servers_running_an_ab_inside_themselves_carry_their_arms(tmp_path, monkeypatch):
    """SGLANG_EAGLE_TRITON_AB_STEPS servers: each row carries ``arms`` from the cycle timing's arm lines its log gained
    during that batch (bench.stage_split.arms), and the report lists them; a log without arm lines gives none."""
    arm_line = ("EAGLE_TRITON cycle timing arms, rank 0: after: host period {:.3f} ms, in forward 2.000 ms, gpu step "
                "1.000 ms, 100 steps ; in-graph: host period 3.000 ms, in forward 1.900 ms, gpu step 1.000 ms, 100 "
                "steps")
    servers = ServerLog(log_text="\n".join(arm_line.format(p) for p in (3.1, 3.3, 3.2)))
    monkeypatch.setattr(adaptive, "timed_request", lambda url, prompt, **kw: None)
    rows, report = _interleaved_sweep(tmp_path, monkeypatch, servers, "--freeze-gc")
    arms = rows[0]["arms"]
    assert arms["names"] == ["in-graph", "after"] and arms["lines"] == 3
    assert arms["on"] == {"host_period": 3.0, "host_in_forward": 1.9}
    assert arms["off"] == {"host_period": 3.2, "host_in_forward": 2.0}
    assert arms["ratio"]["host_in_forward"]["geomean"] == pytest.approx(0.95)
    assert "A/B inside each server" in report and "| in-graph / after | 3 | 3.000 / 3.200 |" in report
    seen = {}
    fake = servers.server_class()("eagle_triton", "m", [], "w")
    assert adaptive.arms_state(fake, seen) is not None and adaptive.arms_state(fake, seen) is None  # nothing new
    assert adaptive.arms_state(ServerLog().server_class()("nospec", "m", [], "w"), {}) is None


def test_rows_carry_each_states_cycle_beside_the_policys_price_of_it(tmp_path, monkeypatch):
    """Servers whose worker the cycle timing times: each row carries ``states`` from the per-state lines its log
    gained during that batch (rank 0's; the steps-weighted mean period), and the report lists each state's period
    beside the cost policy's price of it at the batch (replay + rest); a log without such lines gives none."""
    line = ("EAGLE_TRITON cycle timing states, rank {rank}: steps0-held: host period {held} ms (median {median} ms, "
            "{paused} in pauses), in forward 0.900 ms, gpu step 0.300 ms, {n} steps ; steps5: host period 3.000 ms, "
            "in forward 2.000 ms, gpu step 1.000 ms, 10 steps ; steps0-resume: host period 4.000 ms, in forward "
            "3.000 ms, gpu step 1.000 ms, 2 steps")
    text = "\n".join([line.format(rank=0, held="1.500", median="1.400", paused="0.000", n=30),
                      line.format(rank=0, held="2.100", median="1.600", paused="0.200", n=10),
                      line.format(rank=1, held="9.000", median="9.000", paused="0.900", n=40)])
    state = {"eagle_triton": {"adaptive_steps_in_force": {"0": 40, "5": 20},
                              "adaptive_policy": {"replay_ms": {"0,1": 0.3, "5,1": 0.6},
                                                  "rest_ms": {"0,1": 2.1, "5,1": 2.5},
                                                  "timed_dropped": {"0,1": [35, 3], "5,1": [18, 0]}}}}
    startup = line.format(rank=0, held="90.000", median="90.000", paused="0.000", n=5)  # no batch's runs
    servers = ServerLog(state=state, log_text=startup)

    def measure(url):  # the lines are logged while the batch runs
        if text not in servers.log_text:
            servers.log_text += "\n" + text

    monkeypatch.setattr(adaptive, "timed_request", lambda url, prompt, **kw: None)
    rows, report = _interleaved_sweep(tmp_path, monkeypatch, servers, "--freeze-gc", measure=measure)
    states = rows[0]["states"]
    # medians weighted by steps (1.4 x 30 + 1.6 x 10) / 40; pauses by period time 0.2 x 21 / (45 + 21)
    assert states["steps0-held"] == {"steps": 40, "lines": 2, "host_period": 1.65, "host_in_forward": 0.9,
                                     "median_period": 1.45, "paused": 0.064}
    assert states["steps5"]["host_period"] == 3.0 and states["steps5"]["steps"] == 20
    assert "median_period" not in states["steps5"]  # its lines give no spread
    assert "Cycles by state" in report
    assert "| steps0-held | 40 | 1.650 | 1.450 | 0.064 | 0.900 | 2.400 | 35 / 3 |" in report
    assert "| steps5 | 20 | 3.000 | - | - | 2.000 | 3.100 | 18 / 0 |" in report
    assert "| steps0-resume | 4 | 4.000 | - | - | 3.000 | - | - |" in report  # the policy does not time it: no price
    seen = {}
    fake = servers.server_class()("eagle_triton_cost", "m", [], "w")
    assert adaptive.states_state(fake, seen) is not None and adaptive.states_state(fake, seen) is None  # nothing new
    assert adaptive.states_state(ServerLog().server_class()("nospec", "m", [], "w"), {}) is None


def test_each_run_keeps_its_prices_beside_its_own_cycles(tmp_path, monkeypatch):
    """Under ``--interleave`` each run of a server whose worker the cycle timing times keeps the per-state lines its
    log gained during that run and the cost policy's prices at the run's end (``run_cycles``), and the report gives
    each state's price over the median period of the same run's cycles, run by run: a price learnt in a slow run is
    compared with that run, not with the mean of the batch's runs."""
    line = ("EAGLE_TRITON cycle timing states, rank 0: steps5: host period {median} ms (median {median} ms, 0.000 in "
            "pauses), in forward 1.000 ms, gpu step 0.300 ms, 100 steps ; steps0-resume: host period 4.000 ms, in "
            "forward 3.000 ms, gpu step 1.000 ms, 2 steps ; steps0-held: host period 1.500 ms (median 1.500 ms, 0.000 "
            "in pauses), in forward 0.5 ms, gpu step 0.2 ms, 50 steps ; steps0: host period 3.000 ms (median 3.000 ms, "
            "0.000 in pauses), in forward 1.0 ms, gpu step 0.3 ms, 2 steps")
    state = {"eagle_triton": {"adaptive_steps_in_force": {"5": 100},
                              "adaptive_policy": {"replay_ms": {"5,1": 0.5, "0,1": 0.2},
                                                  "rest_ms": {"5,1": 0.0, "0,1": 1.3}}}}
    # start-up's warm-up steps (a state's first steps compile kernels): no run's
    servers = ServerLog(state=state, log_text=line.format(median="900.000") + "\n")
    # the off server's runs: (price at the run's end, median period of the run's steps5 cycles)
    runs = iter([(3.0, 2.5), (2.5, 2.0), (4.0, 3.2)])

    def measure(url):
        if url == "eagle_triton_off":
            price, median = next(runs)
            servers.log_text += line.format(median=f"{median:.3f}") + "\n"
            state["eagle_triton"]["adaptive_policy"]["rest_ms"]["5,1"] = price - 0.5

    monkeypatch.setattr(adaptive, "timed_request", lambda url, prompt, **kw: None)
    rows, report = _interleaved_sweep(tmp_path, monkeypatch, servers, "--freeze-gc", measure=measure, repeats=3)
    off = next(r for r in rows if r["system"] == "eagle_triton_off")
    assert [c["prices"] for c in off["run_cycles"]] == [{"5,1": p, "0,1": 1.5} for p in (3.0, 2.5, 4.0)]
    assert [c["states"]["steps5"]["median_period"] for c in off["run_cycles"]] == [2.5, 2.0, 3.2]
    assert "cycles" not in off and off["runs"] == [1.0, 1.0, 1.0]  # (the combined row keeps no run's own)
    assert off["states"]["steps5"]["steps"] == 300  # the batch's three runs, not start-up's line
    # ratios 1.2 / 1.25 / 1.25: geometric mean 1.875 ** (1 / 3)
    assert re.search(r"\| 1 \| eagle_triton_off[^|]*: steps5 \| 1\.20 / 1\.25 / 1\.25 \| 1\.233 \|", report)
    after = report.split("price of a state at the run's end")[1]
    assert "steps0-resume |" not in after  # not timed: no price
    # steps 0's price is the held cycles' (1.5 / 1.5), not the turns' into it on the speculative path
    assert re.search(r"eagle_triton_off[^|]*: steps0-held \| 1\.00 / 1\.00 / 1\.00 \|", after)
    assert "steps0 |" not in after
    assert "price of a state at the run's end" not in adaptive.report([{**r, "run_cycles": None} for r in rows])


def test_the_report_states_the_issues_targets_run_by_run():
    """The targets table: the cost policy over no-spec (floor 1.0) and over the best static shape at that batch (the
    static EAGLE_TRITON row of most tok/s; floor 0.97), steps 0 over no-spec (floor 0.97), each met (mean at or above
    its floor), below (interval under it) or unresolved, and steps 0 held as no-spec decode likewise; pairs only within
    one sweep; none without those systems."""
    base = dict(topk=None, draft_tokens=None, batch=1, acceptance="real:x", gpu="g", sglang_version="v",
                accept_len=2.0, longest_gap_ms=1.0, session="a")
    rows = [dict(base, system="nospec", steps=None, tok_per_s=1.0, runs=[1.0, 1.0, 1.0]),
            dict(base, system="eagle_triton", steps=3, tok_per_s=1.2, runs=[1.2, 1.2, 1.2]),
            dict(base, system="eagle_triton", steps=5, tok_per_s=1.1, runs=[1.1, 1.1, 1.1]),
            dict(base, system="eagle_triton_cost", steps=None, tok_per_s=1.1, runs=[1.0, 1.2, 1.1]),
            dict(base, system="eagle_triton_off_plain", steps=None, tok_per_s=0.8, runs=[0.8, 0.81, 0.79]),
            dict(base, system="eagle_triton_off_nonspec", steps=None, tok_per_s=0.99, runs=[0.98, 0.99, 1.0])]
    table = adaptive.report(rows)
    line = next(x for x in table.splitlines() if x.startswith("| 1 | ") and "met" in x)
    cells = [c.strip() for c in line.strip("|").split("|")]
    assert cells[1].startswith("1.10 (") and cells[1].endswith("met")
    assert cells[2].startswith("0.91 (") and cells[2].endswith("unresolved")  # against (3,1,4), the faster static
    assert cells[3].startswith("0.80 (") and cells[3].endswith("below")
    assert cells[4].startswith("0.99 (") and cells[4].endswith("met")  # held as no-spec decode
    assert "steps 0 on the speculative path / no-spec (floor 0.97)" in table
    assert "steps 0 held as no-spec decode (the default) / no-spec (floor 0.97)" in table
    assert "The issue's targets" not in adaptive.report([r for r in rows if r["system"] in ("nospec", "eagle_triton")])
    other = [dict(r, session="b") if r["system"] == "eagle_triton_cost" else r for r in rows]
    assert "| 1 | - | - | 0.80" in adaptive.report(other)  # the cost rows of another sweep pair with nothing


@pytest.mark.parametrize("mode", [[], ["--interleave", "--real-pair"]], ids=["one-after-another", "interleave"])
def test_a_batch_named_twice_is_refused(tmp_path, mode):
    """Rows are kept one a batch (merge_rows): a batch named twice would keep only its last run, so it is refused at
    once, in either mode (repeats: ``--interleave --repeats``)."""
    with pytest.raises(SystemExit, match="named twice"):
        adaptive.main(["--batches", "16", "64", "16", "--workdir", str(tmp_path), "--out", str(tmp_path / "x.json"),
                       *mode])


def test_cost_policy_servers_start_one_at_a_time_under_interleave(tmp_path, monkeypatch):
    """Each cost policy's server times its states' graphs at start-up: under ``--interleave`` two of them (an A/B of
    the policy's code) start one after the other, alone, and the other servers together once both are ready."""
    servers = ServerLog()
    monkeypatch.setattr(adaptive, "Server", servers.server_class())
    monkeypatch.setattr(adaptive, "measure", lambda url, batch, real=False: {
        "tok_per_s": 1.0, "accept_len": 1.0, "rounds": 1, "longest_gap_ms": 1.0})
    monkeypatch.setattr(adaptive, "plot", lambda rows, path: None)
    monkeypatch.setattr("torch.cuda.get_device_name", lambda: "fake GPU")
    adaptive.main(["--systems", "nospec", "eagle_triton_cost", "eagle_triton_cost_before", "eagle_triton",
                   "--shapes", "3,1,4", "--batches", "1", "--workdir", str(tmp_path), "--out", str(tmp_path / "x.json"),
                   "--interleave", "--real-pair", "--before-tree", str(tmp_path)])
    assert servers.events[:8] == [
        ("start", "eagle_triton_cost"), ("ready", "eagle_triton_cost"),
        ("start", "eagle_triton_cost_before"), ("ready", "eagle_triton_cost_before"),
        ("start", "nospec"), ("start", "eagle_triton-3-1-4"), ("ready", "nospec"), ("ready", "eagle_triton-3-1-4")]
