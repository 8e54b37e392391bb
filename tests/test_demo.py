"""``python -m sgl_eagle_triton demo`` on the CPU: its arguments, its output from SGLang-shaped responses, and its
whole run (the shipped trained pair or freshly written random models served, the server started through
sgl_eagle_triton.devtools.launcher, asked, stopped, folder removed) against tests/stub_sglang_server.py standing in
for SGLang. The real server run is GPU-only (tests/test_e2e_server.py checks the log lines and metrics the demo
reads)."""

import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from sgl_eagle_triton.__main__ import main
from sgl_eagle_triton.devtools import TRAINED_PAIR, demo, launcher

STUB = Path(__file__).parent / "stub_sglang_server.py"


def test_arguments(capsys):
    with pytest.raises(SystemExit):
        main(["demo", "--model-path", "t"])
    assert "--model-path and --draft-model-path go together" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["demo", "--random", "--model-path", "t", "--draft-model-path", "d"])
    assert "--random and --model-path exclude each other" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["demo", "--max-tokens", "0"])
    with pytest.raises(SystemExit):
        main([])


def test_package_import_stays_light():
    code = "import sys, sgl_eagle_triton.__main__; print(sorted({'torch', 'triton', 'sglang'} & set(sys.modules)))"
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout == "[]\n"


def test_server_command():
    cmd = launcher.launch_command("T", demo.server_args("D", tiny=True), 1234, nccl_port=1235)
    assert cmd[:3] == [sys.executable, "-m", "sglang.launch_server"]
    joined = " ".join(cmd)
    for part in ("--model-path T", "--speculative-algorithm EAGLE_TRITON", "--speculative-draft-model-path D",
                 "--port 1234", "--nccl-port 1235", "--attention-backend triton", "--enable-metrics",
                 "--max-total-tokens 65536"):
        assert part in joined
    assert "--max-total-tokens" not in demo.server_args("D", tiny=False)


def test_server_command_is_accepted_by_sglang_and_the_plugin(tmp_path, eagle_triton_args):
    from sgl_eagle_triton import config
    from sgl_eagle_triton.devtools.tiny_models import write_random_pair

    target, draft = write_random_pair(tmp_path)
    cmd = launcher.launch_command(str(target), demo.server_args(str(draft), tiny=True), 1234, nccl_port=1235)
    args = eagle_triton_args(cmd[3:])
    assert (args.speculative_algorithm, args.port, args.nccl_port, args.enable_metrics) == (
        "EAGLE_TRITON", 1234, 1235, True)
    assert (args.speculative_num_steps, args.speculative_eagle_topk, args.speculative_num_draft_tokens) == (5, 4, 8)
    assert config.current_draft_kind() == config.EAGLE3


def test_parse_metrics_sums_label_sets_and_skips_comments():
    text = ('# HELP sglang:x help\n# TYPE sglang:x counter\nsglang:x{a="1",b="x y"} 2.0\nsglang:x{a="2"} 3\n'
            "sglang:y 1.5e+00\n")
    assert demo.parse_metrics(text) == {"sglang:x": 5.0, "sglang:y": 1.5}


def test_request_lines():
    meta = {"spec_verify_ct": 10, "spec_accept_length": 3.2, "spec_accept_rate": 0.31}
    chat = {"choices": [{"message": {"content": "ok\x1b\n"}, "meta_info": meta}], "usage": {"completion_tokens": 32}}
    assert demo.answer_text(chat) == "ok?\n"
    assert demo.request_stats(chat) == (
        "32 tokens in 10 verify steps: accept length 3.20 tokens/step, draft accept rate 0.31")
    completion = {"choices": [{"text": "x"}], "usage": {"completion_tokens": 7}}
    assert demo.answer_text(completion) == "x" and demo.request_stats(completion).startswith("7 tokens (")


def test_acceptance_summary_counts_the_responses_with_meta_info():
    def chat(tokens, verifies):
        return {"choices": [{"message": {"content": ""}, "meta_info": {"spec_verify_ct": verifies}}],
                "usage": {"completion_tokens": tokens}}

    completion = {"choices": [{"text": ""}], "usage": {"completion_tokens": 99}}
    assert demo.acceptance_summary([chat(48, 20), completion, chat(40, 24)]).startswith(
        "Acceptance: 2.00 tokens per verify step on average (88 tokens in 44 verify steps over 2 requests")
    assert "no response carried spec_verify_ct" in demo.acceptance_summary([completion])


def test_default_pair_is_the_shipped_trained_pair():
    assert demo.TRAINED_PAIR == TRAINED_PAIR
    for name in ("target/config.json", "target/model.safetensors", "target/tokenizer.json",
                 "eagle3/config.json", "eagle3/model.safetensors"):
        assert (TRAINED_PAIR / name).is_file(), name


def test_server_acceptance_lines():
    lines = demo.server_acceptance({"internal_states": [{"avg_spec_accept_length": 2.0}]},
                                   {"sglang:generation_tokens_total": 90.0, "sglang:spec_verify_calls_total": 40.0})
    assert lines == [
        "/server_info internal_states[0].avg_spec_accept_length: 2.00",
        "/metrics sglang:generation_tokens_total / sglang:spec_verify_calls_total: 90 / 40 = 2.25 tokens/step",
    ]
    assert "not yet" in demo.server_acceptance({"internal_states": [{}]}, {})[0]


def test_kernel_lines_take_the_banner_and_ran_lines_once():
    log = "\n".join([
        "[2026-11-26 10:00:00 TP0] Load weight end.",
        "[2026-11-26 10:00:01 TP0] EAGLE_TRITON (eagle3 draft, steps=5 topk=4 draft_tokens=8): draft forward: triton "
        "sgl_eagle_triton.drafter (draft_input, linear); build tree: triton sgl_eagle_triton.kernels.build_tree",
        "[2026-11-26 10:00:02 TP0] EAGLE_TRITON: triton build_tree ran (first call in this process)",
        "[2026-11-26 10:00:03 TP0] EAGLE_TRITON: triton build_tree ran (first call in this process)",
        "[2026-11-26 10:00:04 TP0] EAGLE_TRITON: triton verify_tree_greedy ran (first call in this process)",
        "[2026-11-26 10:00:05] server_args=ServerArgs(speculative_algorithm='EAGLE_TRITON', ...)",
    ])
    lines = demo.kernel_lines(log)
    assert [line[:40] for line in lines] == ["EAGLE_TRITON (eagle3 draft, steps=5 topk",
                                             "EAGLE_TRITON: triton build_tree ran (fir",
                                             "EAGLE_TRITON: triton verify_tree_greedy "]
    assert lines[0].endswith("build tree: triton sgl_eagle_triton.kernels.build_tree")


def _dead(pid: int, timeout_s: float = 10) -> bool:
    deadline = time.time() + timeout_s
    while time.time() < deadline:
        try:
            if psutil.Process(pid).status() == psutil.STATUS_ZOMBIE:
                return True
        except psutil.NoSuchProcess:
            return True
        time.sleep(0.2)
    return False


@pytest.fixture
def stub(monkeypatch):
    """Point the demo's launcher at the stub server; ``stub.append("--fail")`` makes it fail at start-up."""
    extra = []

    def stub_server(*args, **kwargs):
        return launcher.Server(*args, **kwargs, program=[sys.executable, str(STUB), *extra])

    monkeypatch.setattr(demo, "Server", stub_server)
    return extra


def test_demo_runs_and_cleans_up(stub, capsys):
    assert main(["demo", "--max-tokens", "8", "--keep"]) == 0
    out = capsys.readouterr().out
    workdir = Path(re.search(r"^Kept (.+)$", out, re.M)[1])
    assert f"Serving the trained tiny Llama target + EAGLE-3 draft in {TRAINED_PAIR}" in out
    assert {p.name for p in workdir.iterdir()} == {"server.log"}
    assert "Server ready at http://127.0.0.1:" in out
    assert out.count("\n== chat") == 2 and out.count("\n== completion") == 2
    assert "A: def is_prime(n):?" in out
    assert "8 tokens in 4 verify steps: accept length 2.00 tokens/step" in out
    assert "/server_info internal_states[0].avg_spec_accept_length: 1.75" in out
    assert "80 / 40 = 2.00 tokens/step" in out and "sglang:spec_accept_length (last log interval): 2.50" in out
    assert "\nAcceptance: 2.00 tokens per verify step on average (16 tokens in 8 verify steps over 2 requests" in out
    assert "random weights" not in out
    assert "  EAGLE_TRITON (eagle3 draft" in out and "  EAGLE_TRITON: triton build_tree ran" in out
    assert "Server stopped." in out
    log = (workdir / "server.log").read_text()
    assert log.splitlines()[0].startswith(f"{sys.executable} {STUB} --model-path {TRAINED_PAIR / 'target'} ")
    assert f"--speculative-draft-model-path {TRAINED_PAIR / 'eagle3'} " in log.splitlines()[0]
    assert "sglang.launch_server" not in log  # the stub ran, with the launcher's stdout/stderr redirection
    pids = re.search(r"^stub pid (\d+) child (\d+)$", log, re.M)
    assert _dead(int(pids[1])) and _dead(int(pids[2])), "the server's process group outlived the demo"

    shutil.rmtree(workdir)


def test_demo_random_pair_is_written_and_removed(stub, capsys):
    assert main(["demo", "--random", "--max-tokens", "8"]) == 0
    out = capsys.readouterr().out
    workdir = Path(re.search(r"draft to (.+)$", out, re.M)[1])
    assert "Writing a tiny random Llama target + EAGLE-3 draft to" in out and "random weights" in out
    assert "Acceptance: 2.00 tokens per verify step" in out and "Server stopped." in out
    assert not workdir.exists()


def test_demo_reports_a_server_that_fails_to_start(stub, capsys):
    stub.append("--fail")
    assert main(["demo", "--model-path", "T", "--draft-model-path", "D"]) == 1
    captured = capsys.readouterr()
    assert "stub: failing at start-up" in captured.out and "Writing" not in captured.out
    assert "demo failed: the server exited with code 3 during start-up" in captured.err
    workdir = Path(re.search(r"server log: (.+)/server.log$", captured.out, re.M)[1])
    assert not workdir.exists()
