"""sgl_eagle_triton/devtools/launcher.py on the CPU, against tests/stub_sglang_server.py standing in for
``python -m sglang.launch_server``: the command line (ports), ready detection, a server that dies or
never gets ready, stopping the whole process group, and the HTTP helpers' parsing (plain and streamed)."""

import re
import sys
import time
from pathlib import Path

import psutil
import pytest

from sgl_eagle_triton.devtools import launcher
from sgl_eagle_triton.devtools.launcher import RequestError, Server, ServerError
from tests.stub_sglang_server import CHAT_PIECES, STREAM_GAP_S

STUB = (sys.executable, str(Path(__file__).parent / "stub_sglang_server.py"))
POLL_S = 0.2


def stub_server(tmp_path, *stub_flags, name="stub", args=()) -> Server:
    return Server(name, "/models/target", [*args, *stub_flags], tmp_path, program=STUB)


def _flag(command: list[str], flag: str) -> int:
    assert command.count(flag) == 1, command
    return int(command[command.index(flag) + 1])


def _pids(server: Server) -> tuple[int, int]:
    """The stub's pid and its child's, from the log."""
    deadline = time.time() + 10
    while not (m := re.search(r"^stub pid (\d+) child (\d+)$", server.log(), re.M)) and time.time() < deadline:
        time.sleep(0.05)
    assert m, server.log()
    return int(m[1]), int(m[2])


def _dead(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def test_launch_command():
    cmd = launcher.launch_command("M", ["--tp", "1"], port=1234, nccl_port=1235)
    assert cmd == [sys.executable, "-m", "sglang.launch_server", "--model-path", "M", "--host", "127.0.0.1",
                   "--port", "1234", "--nccl-port", "1235", "--tp", "1"]
    for passed in (["--nccl-port", "9"], ["--nccl-port=9"]):
        assert "1235" not in launcher.launch_command("M", passed, port=1234, nccl_port=1235)
    with pytest.raises(ValueError, match="--port"):
        launcher.launch_command("M", ["--port", "1"], port=1234)


def test_data_parallel_replicas_get_no_fixed_nccl_port():
    # SGLang 0.5.17 gives a passed --nccl-port to every replica, which then collide on it (seen: EADDRINUSE)
    assert launcher.launch_command("M", ["--dp", "2"], port=1, nccl_port=None)[-2:] == ["--dp", "2"]
    for args in (["--dp", "2"], ["--dp-size=4"], ["--data-parallel-size", "2"]):
        assert launcher.data_parallel(args)
    for args in ([], ["--dp", "1"], ["--tp", "2"]):
        assert not launcher.data_parallel(args)
    assert launcher.flag_value(["--dp", "2", "--dp=3"], "--dp") == "3"


def test_free_ports_are_never_handed_out_twice():
    ports = [launcher.free_port() for _ in range(50)]
    assert len(set(ports)) == 50


def test_each_server_gets_its_own_port_and_nccl_port_and_logs_its_command(tmp_path):
    a, b = stub_server(tmp_path, name="a"), stub_server(tmp_path, name="b")
    given = stub_server(tmp_path, name="given", args=["--nccl-port", "5555"])
    try:
        ports = [_flag(s.command, f) for s in (a, b) for f in ("--port", "--nccl-port")]
        assert len(set(ports)) == 4 and ports == [a.port, a.nccl_port, b.port, b.nccl_port]
        assert given.nccl_port is None and _flag(given.command, "--nccl-port") == 5555
        for s in (a, b, given):
            s.wait_ready(30, POLL_S)
            assert s.log().splitlines()[0] == " ".join(s.command)
            assert s.url == f"http://127.0.0.1:{s.port}" and s.healthy()
    finally:
        for s in (a, b, given):
            s.stop()


def test_wait_ready_waits_for_health_200(tmp_path):
    with stub_server(tmp_path, "--ready-after-s", "1.5") as server:
        assert not server.healthy()
        waited = server.wait_ready(30, POLL_S)
        assert 1.3 <= waited < 10 and server.healthy()


@pytest.mark.parametrize("flags", [("--fail",), ("--die-after-s", "1")])
def test_wait_ready_raises_as_soon_as_the_server_dies(tmp_path, flags):
    with stub_server(tmp_path, *flags) as server:
        start = time.monotonic()
        with pytest.raises(ServerError) as e:
            server.wait_ready(30, POLL_S)
        assert time.monotonic() - start < 10, "wait_ready kept waiting after the server died"
    assert e.value.exit_code == 3 and e.value.reason == "exited with code 3 during start-up"
    said = "stub: failing at start-up" if flags == ("--fail",) else "stub: dying before it was ready"
    assert said in e.value.tail and said in str(e.value) and "server stub exited with code 3" in str(e.value)


def test_wait_ready_gives_up_after_the_timeout(tmp_path):
    with stub_server(tmp_path, "--ready-after-s", "1000") as server:
        start = time.monotonic()
        with pytest.raises(ServerError) as e:
            server.wait_ready(1.5, POLL_S)
        assert 1.4 <= time.monotonic() - start < 8
        assert server.proc.poll() is None
    assert e.value.exit_code is None and "did not answer /health within 2 s" in e.value.reason
    assert "stub pid" in e.value.tail


@pytest.mark.parametrize("flags", [(), ("--child-ignores-term",), ("--ignore-term",)])
def test_stop_ends_the_whole_process_group(tmp_path, flags):
    """SIGTERM reaches the child too; what ignores it (the child, or the launching process) is killed after
    the grace period."""
    server = stub_server(tmp_path, *flags)
    server.wait_ready(30, POLL_S)
    stub, child = _pids(server)
    start = time.monotonic()
    server.stop(grace_s=1)
    assert time.monotonic() - start < (0.5 if not flags else 5)
    assert _dead(stub) and _dead(child), "a process of the server's group outlived stop()"
    assert server.proc.returncode is not None
    server.stop()  # again: nothing to do


def test_requests_and_their_parsing(tmp_path):
    with stub_server(tmp_path) as server:
        server.wait_ready(30, POLL_S)
        out = server.generate("def f():", 4)
        assert out["output_ids"] == [100, 101, 102, 103] and out["meta_info"]["prompt_kind"] == "text"
        assert out["meta_info"]["sampling_params"] == {"temperature": 0, "max_new_tokens": 4, "ignore_eos": True}
        out = server.generate([1, 2, 3], 2, top_logprobs=2, temperature=0.8, sampling_seed=7)
        assert out["meta_info"]["prompt_kind"] == "input_ids"
        assert out["meta_info"]["sampling_params"] == {"temperature": 0.8, "max_new_tokens": 2, "ignore_eos": True,
                                                       "sampling_seed": 7}
        assert out["meta_info"]["output_top_logprobs"][1] == [[-0.1, 101], [-2.0, 7]]
        assert server.completion("x", 3) == "    return n"
        assert server.chat("x", 3) == "def is_prime(n):\x07"
        assert server.chat("x", 3, stream=True) == "".join(CHAT_PIECES)
        assert server.get_json("/server_info")["internal_states"][0]["avg_spec_accept_length"] == 1.75
        assert "sglang:spec_accept_length" in server.get("/metrics")
        assert server.post_json("/v1/chat/completions", {"max_tokens": 2, "return_meta_info": True})[
            "choices"][0]["meta_info"]["spec_verify_ct"] == 4
        with pytest.raises(RequestError) as e:
            server.completion("x", 0)
        assert e.value.status == 400 and "max_tokens must be at least 1" in str(e.value)
        assert not server.healthy("/nowhere")
        with pytest.raises(RequestError, match="error in the stream: .*max_new_tokens"):
            list(server.generate_stream("x", 0))


def test_streamed_chunks_are_read_as_they_arrive(tmp_path):
    """One chunk per 'decode cycle', STREAM_GAP_S apart: each is yielded when it arrives, not at the end."""
    with stub_server(tmp_path) as server:
        server.wait_ready(30, POLL_S)
        arrivals, chunks = [], []
        for chunk in server.generate_stream([5, 6], 4):
            arrivals.append(time.monotonic())
            chunks.append(chunk)
    assert [c["output_ids"] for c in chunks] == [[100], [100, 101], [100, 101, 102], [100, 101, 102, 103]]
    assert [c["meta_info"]["completion_tokens"] for c in chunks] == [1, 2, 3, 4]
    gaps = [b - a for a, b in zip(arrivals, arrivals[1:], strict=False)]
    assert min(gaps) > 0.6 * STREAM_GAP_S, gaps


def test_sigterm_runs_finally_blocks(tmp_path):
    """Under ``exit_on_sigterm`` a SIGTERM (``timeout``'s signal) still runs ``finally`` (where benchmarks stop the
    servers they started); without it the process dies at once."""
    import signal
    import subprocess
    import sys
    import time

    marker = tmp_path / "stopped"
    code = ("import sys, time\nfrom sgl_eagle_triton.devtools.launcher import exit_on_sigterm\n"
            "if sys.argv[1] == 'on': exit_on_sigterm()\n"
            # 'ready' inside the try: on a loaded host the signal once came between the print and the try
            f"try:\n    print('ready', flush=True)\n    time.sleep(60)\n"
            f"finally:\n    open({str(marker)!r}, 'w').write(sys.argv[1])\n")
    for mode, stops in (("on", True), ("off", False)):
        proc = subprocess.Popen([sys.executable, "-c", code, mode], stdout=subprocess.PIPE, text=True)
        assert proc.stdout.readline().strip() == "ready"
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=30)
        time.sleep(0.1)
        assert marker.exists() == stops, mode
        marker.unlink(missing_ok=True)


@pytest.mark.parametrize("one_at_a_time", [True, False], ids=["one_at_a_time", "all_at_once"])
def test_e2e_servers_are_served_one_at_a_time_or_all_at_once(tmp_path, one_at_a_time):
    """tests/e2e.serve_concurrently: servers given as callables start when served; one at a time, no other server
    runs while one is served (servers of several ranks must not share GPUs); all are stopped at the end."""
    from tests.e2e import serve_concurrently

    servers = {key: (lambda key=key: stub_server(tmp_path, name=key)) for key in ("nospec", "a", "b")}

    def serve(server, with_logprobs):
        running = sorted(k for k, s in servers.items() if isinstance(s, Server) and s.proc.poll() is None)
        return server.name, with_logprobs, running

    results, infos = serve_concurrently(servers, serve, (), one_at_a_time=one_at_a_time)
    everyone = ["a", "b", "nospec"]
    assert results == {k: (k, k == "nospec", [k] if one_at_a_time else everyone) for k in servers} and infos == {}
    assert all(isinstance(s, Server) and s.proc.poll() is not None for s in servers.values())
