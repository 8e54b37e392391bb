"""bench/serve.py's pure-Python parts (arguments, row merging, report) run in CPU CI so they cannot rot."""

import json
from pathlib import Path

import pytest

from bench import serve
from tests.fake_server import ServerLog
from tests.tiny_models import TRAINED_PAIR


def row(system, batch, cycle, config=(5, 8, 32), draft_ms=None):
    steps, topk, n = config if system != "nospec" else (0, 0, 0)
    return dict(system=system, steps=steps, topk=topk, draft_tokens=n, batch=batch, cycle_ms=cycle,
                draft_ms=draft_ms, gpu="GPU X", sglang_version="0.5.17", accept_length=1.0)


def test_args_defaults_and_validation():
    args = serve.parse_args([])
    assert args.configs == [(5, 8, 32), (3, 1, 4), (8, 8, 64)] and args.batches == [1, 8, 32, 64]
    assert serve.parse_args(["--configs", "3,1,4", "--systems", "nospec"]).systems == ["nospec"]
    with pytest.raises(SystemExit):
        serve.parse_args(["--configs", "3,1,9"])


def test_sampling_params_reach_every_request_and_the_rows_flags(monkeypatch):
    """``--sampling temperature=0.7 top_k=20``: numbers parsed (ints as ints), a temperature > 0 required (SGLang
    decodes greedily at 0), sent with the warm-up and every timed request, and part of the rows' flag set in one
    order (sampled rows never replace greedy ones)."""
    args = serve.parse_args(["--sampling", "top_k=20", "temperature=0.7", "min_p=1e-3"])
    assert args.sampling_params == {"temperature": 0.7, "top_k": 20, "min_p": 0.001}
    assert args.flags == "sampling: min_p=0.001 temperature=0.7 top_k=20" and serve.parse_args([]).flags == ""
    for bad in (["temperature=hot"], ["top_p=0.9"], ["temperature=0", "top_k=20"]):  # no temperature: greedy
        with pytest.raises(SystemExit):
            serve.parse_args(["--sampling", *bad])
    sent = []

    def timed_request(url, prompt, **sampling):
        sent.append(sampling)
        return {"times": [0.0, 0.01, 0.02], "meta": {"completion_tokens": 3}}

    monkeypatch.setattr(serve, "timed_request", timed_request)
    serve.measure("u", 3, sampling=args.sampling_params)
    assert sent == [{"temperature": 0.7, "top_k": 20, "min_p": 0.001}] * 4  # the warm-up and the batch of 3
    sent.clear()
    serve.measure("u", 2)
    assert sent == [{}] * 3


def test_server_args_capture_graphs_for_the_measured_batches():
    args = serve.server_args([8, 1, 32])
    i = args.index("--cuda-graph-bs-decode")
    assert args[i + 1:i + 4] == ["1", "8", "32"] and args[args.index("--max-running-requests") + 1] == "32"
    from sglang.srt.server_args import prepare_server_args

    sa = prepare_server_args(["--model-path", str(TRAINED_PAIR / "target"), "--device",
                              "cpu", *args[args.index("--cuda-graph-bs-decode"):]])
    assert sa.cuda_graph_config.decode.bs == [1, 8, 32] and sa.cuda_graph_config.prefill.backend == "disabled"


def test_spec_args():
    assert serve.spec_args("nospec", Path("/d"), (5, 8, 32)) == []
    assert serve.spec_args("eagle_triton", Path("/d"), (5, 8, 32))[:2] == ["--speculative-algorithm", "EAGLE_TRITON"]


def test_cycle_estimators():
    # 5 verify cycles of 10 ms after the first chunk, one of them stretched to 50 ms by another request's prefill
    spec = {"times": [0.0, 0.05, 0.06, 0.07, 0.08, 0.09], "meta": {"spec_verify_ct": 5, "completion_tokens": 11}}
    assert serve.cycle_ms([spec]) == pytest.approx(10.0) and serve.mean_cycle_ms([spec]) == pytest.approx(18.0)
    plain = {"times": [0.0, 0.01, 0.02], "meta": {"completion_tokens": 3}}
    assert serve.mean_cycle_ms([plain]) == pytest.approx(10.0) and serve.chunks_per_cycle([spec, plain]) == 1.0


def test_merge_replaces_same_case(tmp_path):
    path = tmp_path / "rows.json"
    path.write_text(json.dumps([row("nospec", 1, 5.0), row("eagle3", 1, 8.0)]))
    merged = serve.merge_rows(path, [row("eagle3", 1, 9.0), row("eagle_triton", 1, 4.5)])
    assert [(r["system"], r["cycle_ms"]) for r in merged] == [("eagle3", 9.0), ("eagle_triton", 4.5), ("nospec", 5.0)]


def test_report_ratios():
    table = serve.report([row("nospec", 1, 5.0), row("eagle3", 1, 8.0), row("eagle_triton", 1, 4.0)])
    ours = next(line for line in table.splitlines() if line.startswith("| - | eagle_triton"))
    assert "| 0.50 | - | - | 0.80 | 750 / 1000 / 1250 / 1500 |" in ours
    table = serve.report([row("eagle3", 1, 8.0, draft_ms=3.0), row("eagle_triton", 1, 4.0, draft_ms=1.5)])
    ours = next(line for line in table.splitlines() if line.startswith("| - | eagle_triton"))
    assert "| 0.50 | 1.50 | 0.50 |" in ours


def test_runs_pair_only_within_one_sweep():
    """Interleaved rows of two sweeps merged into one file (e.g. a rerun of ours alone): ours / stock run by run
    only where both come from the same sweep (``session``)."""
    stock = dict(row("eagle3", 1, 8.0), runs=[8.0, 8.0], session="a")
    ours = dict(row("eagle_triton", 1, 4.0), runs=[4.0, 6.0], session="b")
    assert "Run by run" not in serve.report([stock, ours])
    ours["session"] = "a"
    assert "| 1 | 5,8,32 | 0.50 / 0.75 | 0.612 |" in serve.report([stock, ours])


def test_draft_ms_is_the_draft_stages_gpu_busy_time():
    assert serve.draft_ms({}) is None
    assert serve.draft_ms({"draft": {"gpu_span_ms": 2.0, "gpu_busy_ms": 1.5}}) == 1.5


def test_breakdown_table_rest_of_the_cycle():
    stages = {"draft": {"gpu_busy_ms": 1.5}, "draft_extend": {"gpu_busy_ms": 0.5},
              "verify_forward": {"gpu_busy_ms": 6.0}}
    table = serve.breakdown([dict(row("eagle_triton", 1, 9.0), stages=stages), row("eagle3", 1, 8.0)])
    assert table.count("| - | eagle_triton | 5,8,32 | 1 | 9.00 | 1.50 | 0.50 | 6.00 | - | 1.00 |") == 1
    assert "| eagle3 |" not in table and serve.breakdown([row("eagle3", 1, 8.0)]) == ""
    nospec = dict(row("nospec", 1, 6.5), stages={"decode": {"gpu_busy_ms": 6.2}})
    assert "| - | nospec | - | 1 | 6.50 | - | - | - | 6.20 | 0.30 |" in serve.breakdown([nospec])


def test_rows_under_other_server_flags_are_kept_apart(tmp_path):
    """--server-flags (e.g. an FP8 KV cache): rows keep their flags; ratios compare rows of the same flags."""
    fp8 = "--kv-cache-dtype fp8_e4m3"
    rows = [row("eagle3", 1, 8.0), row("eagle_triton", 1, 4.0),
            dict(row("eagle3", 1, 10.0), flags=fp8), dict(row("eagle_triton", 1, 9.0), flags=fp8)]
    path = tmp_path / "s.json"
    assert len(serve.merge_rows(path, rows)) == 4
    table = serve.report(rows)
    assert "| - | eagle_triton | 5,8,32 | 1 | 4.00 | 0.50 |" in table
    assert f"| {fp8} | eagle_triton | 5,8,32 | 1 | 9.00 | 0.90 |" in table
    assert serve.parse_args(["--server-flags", fp8]).server_flags == fp8


def test_measure_against_a_streaming_stub(monkeypatch):
    """measure() end to end over HTTP: a stub /generate streams a first chunk, then one chunk per 'cycle'
    every 50 ms except one 250 ms stall; the steady-state estimator sees 50 ms, the whole-request one 90."""
    import threading
    import time
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    class Generate(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"  # chunked transfer, as SGLang streams

        def chunk(self, text: str) -> None:
            data = text.encode()
            self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
            self.wfile.flush()

        def do_POST(self):
            self.rfile.read(int(self.headers["Content-Length"]))
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            for i in range(6):
                time.sleep(0.25 if i == 2 else 0.05 if i else 0)
                meta = {"completion_tokens": i + 1, "spec_verify_ct": i, "spec_accept_length": 1.0}
                self.chunk(f"data: {json.dumps({'meta_info': meta})}\n\n")
            self.chunk("data: [DONE]\n\n")
            self.chunk("")

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Generate)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        result = serve.measure(f"http://127.0.0.1:{server.server_port}", batch=2)
    finally:
        server.shutdown()
    assert result["cycle_ms"] == pytest.approx(50, rel=0.4) and result["mean_cycle_ms"] == pytest.approx(90, rel=0.4)
    assert result["chunks_per_cycle"] == 1.0 and result["accept_length"] == 1.0


def test_tensor_parallel_servers_are_their_own_flag_set():
    args = serve.parse_args(["--tp", "2", "--server-flags", "--page-size 16"])
    assert args.tp == 2 and args.server_flags == "--page-size 16 --tp-size 2"
    assert serve.parse_args([]).server_flags == ""


def test_draft_lm_head_exchange_is_k_candidates_per_row_not_logits():
    """bench.tp_bytes: per draft forward and rank, ours sends k candidates and a sum per row, stock its logits
    shard; at TP 2 with 8B shapes ours is under 1/100 of stock's (issue 13's bound), the all-reduces equal."""
    from bench import tp_bytes

    b = tp_bytes.bytes_per_forward(rows=8, topk=8, hidden=4096, draft_vocab=32000, tp=2)
    assert b["ours_lm_head"] == 8 * (8 * 8 + 4)  # one other rank receives this rank's 8 rows x (8 keys + a sum)
    assert b["stock_lm_head"] == 8 * 16000 * 2  # its half of the bf16 logits
    assert b["all_reduces"] == 3 * 8 * 4096 * 2  # embedding, o-proj, down: each sent once in a two-rank ring
    assert b["ours_lm_head"] * 100 <= b["stock_lm_head"]
    assert "| llama-3.1-8b-eagle3 | 2 | 8 x 8 | 4,352 | 2,048,000 | 1/471 |" in tp_bytes.table()


def test_draft_shapes_follow_the_target():
    """The random EAGLE-3 drafts have their target's widths (8B: the shapes every published row ran with)."""
    eight = serve.draft_shapes(serve.MODELS["llama-3.1-8b"])
    assert eight["fc.weight"] == (4096, 12288) and eight["midlayer.self_attn.k_proj.weight"] == (1024, 8192)
    assert eight["midlayer.self_attn.o_proj.weight"] == (4096, 4096) and eight["lm_head.weight"] == (32000, 4096)
    seventy = serve.draft_shapes(serve.MODELS["llama-3.1-70b"])
    assert seventy["midlayer.self_attn.q_proj.weight"] == (8192, 16384)
    assert seventy["midlayer.mlp.down_proj.weight"] == (8192, 28672)
    assert serve.parse_args(["--model", "llama-3.1-70b", "--tp", "4"]).server_flags == "--tp-size 4"


def test_rows_say_which_verify_attention_ran():
    """Row key ``verify_attention`` from a server's /server_info: ours only where an EAGLE_TRITON server reports
    our kernel (the default may fall back to SGLang's on other backends or pools)."""
    from sgl_eagle_triton.config import VERIFY_ATTENTION_IN_USE

    class Stub:
        def __init__(self, state):
            self.state = state

        def get_json(self, path):
            assert path == "/server_info"
            return {"internal_states": [self.state]}

    def kernels(attention):
        return {"eagle_triton": {"kernels": {"verify attention": attention}}}

    assert serve.verify_attention(Stub(kernels(VERIFY_ATTENTION_IN_USE))) == "ours"
    assert serve.verify_attention(Stub(kernels("SGLang's TritonAttnBackend (turned off)"))) == "sglang"
    assert serve.verify_attention(Stub({"avg_spec_accept_length": 1.75})) == "sglang"  # stock or no-spec


def test_profiler_traces_are_read_in_rank_order_from_a_fresh_folder(tmp_path, monkeypatch):
    """Under --tp each rank writes ``<time>-TP-<rank>.trace.json.gz``: one breakdown per rank in rank order (10 after
    2; rank 0 is the row's ``stages``); a folder left by an earlier run is emptied first (its traces would mix in);
    a rank missing fails the breakdown."""
    written = {}

    class FakeClient:
        def __init__(self, url):
            pass

        def post(self, path, body, timeout=None):
            for rank in written["ranks"]:
                (Path(body["output_dir"]) / f"17.{rank}-TP-{rank}.trace.json.gz").write_text("")

    monkeypatch.setattr(serve, "Client", FakeClient)
    monkeypatch.setattr(serve, "timed_request", lambda url, prompt: None)
    monkeypatch.setattr(serve.time, "sleep", lambda s: None)
    monkeypatch.setattr(serve, "load_trace", lambda path: path.name)
    monkeypatch.setattr(serve, "stage_times", lambda trace: trace)
    out = tmp_path / "traces"
    out.mkdir()
    (out / "16.0-TP-0.trace.json.gz").write_text("")  # an earlier run's
    written["ranks"] = [10, 2, 0, 1, 3, 4, 5, 6, 7, 8, 9]
    assert serve.profile_stages("url", 1, out, 5, ranks=11)[:3] == [
        "17.0-TP-0.trace.json.gz", "17.1-TP-1.trace.json.gz", "17.2-TP-2.trace.json.gz"]
    assert serve.trace_rank(Path("1795793948.6.trace.json.gz")) == 0
    written["ranks"] = [0, 2]
    monkeypatch.setattr(serve.time, "time", iter(range(0, 10**6, 100)).__next__)  # the 180 s wait runs out
    with pytest.raises(RuntimeError, match=r"ranks \[0, 2\].*expected 0..2"):
        serve.profile_stages("url", 1, out, 5, ranks=3)


def test_interleave_measures_every_server_twice_per_batch_in_alternating_order(tmp_path, monkeypatch):
    """``--interleave``: the servers start one after another with the shared-GPU flags and stay up; per batch each
    is measured once in one order and once in the reverse, the first order alternating between batches; a row is the
    mean of its two runs and keeps both cycles. No profiling: asking for it is refused."""
    from bench.interleave import SHARED_GPU_ENV, SHARED_GPU_FLAGS

    measured, servers = [], ServerLog()

    def measure(url, batch, after_warm_up=None, sampling=None):
        measured.append((url, batch))
        n = float(len(measured))
        return {"cycle_ms": n, "mean_cycle_ms": 2 * n, "chunks_per_cycle": 1.0, "accept_length": 1.0}

    monkeypatch.setattr(serve, "Server", servers.server_class())
    monkeypatch.setattr(serve, "measure", measure)
    monkeypatch.setattr(serve, "write_models", lambda workdir, model: (tmp_path / "t", tmp_path / "d"))
    monkeypatch.setattr(serve, "profile_stages", lambda *a, **k: pytest.fail("profiled under --interleave"))
    monkeypatch.setattr(serve, "plot", lambda rows, path: None)
    monkeypatch.setattr("torch.cuda.get_device_name", lambda: "fake GPU")
    out = tmp_path / "serve.json"
    argv = ["--systems", "eagle3", "eagle_triton", "--configs", "3,1,4", "--batches", "1", "8", "--tp", "4",
            "--workdir", str(tmp_path), "--out", str(out), "--interleave"]
    for bad in (["--profile-steps", "5"], ["--repeats", "0"]):
        with pytest.raises(SystemExit):
            serve.parse_args([*argv, *bad])
    serve.main(argv)
    assert servers.events[:4] == [("start", "eagle3-3-1-4"), ("ready", "eagle3-3-1-4"), ("start", "eagle_triton-3-1-4"),
                      ("ready", "eagle_triton-3-1-4")]  # one after another: each profiles the memory left
    assert all(a[-len(SHARED_GPU_FLAGS):] == SHARED_GPU_FLAGS for a in servers.started)
    assert all(env.items() >= SHARED_GPU_ENV.items() for env in servers.envs)  # the later server passes SGLang's check
    assert measured == [("eagle3-3-1-4", 1), ("eagle_triton-3-1-4", 1), ("eagle_triton-3-1-4", 1), ("eagle3-3-1-4", 1),
                        ("eagle_triton-3-1-4", 8), ("eagle3-3-1-4", 8), ("eagle3-3-1-4", 8), ("eagle_triton-3-1-4", 8)]
    rows = {(r["system"], r["batch"]): r for r in json.loads(out.read_text())}
    assert rows["eagle3", 1]["runs"] == [1.0, 4.0] and rows["eagle3", 1]["cycle_ms"] == 2.5
    assert rows["eagle3", 1]["mean_cycle_ms"] == 5.0 and rows["eagle_triton", 8]["cycle_ms"] == 6.5
    assert {r["tp"] for r in rows.values()} == {4}
    assert {r["flags"] for r in rows.values()} == {" ".join(["--tp-size 4", *SHARED_GPU_FLAGS])}  # not run alone
    assert sorted(servers.stopped) == ["eagle3-3-1-4", "eagle_triton-3-1-4"]
    # run by run: our cycle i over stock's cycle i (2 / 1, 3 / 4 at batch 1), their geometric mean
    assert "| 1 | 3,1,4 | 2.00 / 0.75 | 1.225 |" in out.with_suffix(".md").read_text()


def test_paired_ratio_pairs_runs_of_the_same_repeat():
    """Run i over run i, the geometric mean and a 90 % t-interval over the log ratios: exact where every pair
    agrees, wide for two pairs that disagree (t 6.31 at one degree of freedom), none without pairs to compare."""
    from bench.interleave import paired_ratio

    same = paired_ratio([2.0, 4.0, 6.0], [1.0, 2.0, 3.0])
    assert same["ratios"] == [2.0, 2.0, 2.0] and same["pairs"] == 3
    assert same["geomean"] == pytest.approx(2.0) and same["low"] == pytest.approx(2.0)
    assert same["high"] == pytest.approx(2.0)
    wide = paired_ratio([2.0, 3.0], [1.0, 4.0])
    assert wide["geomean"] == pytest.approx(1.5 ** 0.5)
    assert wide["low"] == pytest.approx(0.0554, abs=1e-3) and wide["high"] == pytest.approx(27.1, rel=1e-2)
    assert paired_ratio([1.0], [1.0]) is None and paired_ratio([1.0, 2.0], [1.0, 2.0, 3.0]) is None


def test_more_repeats_keep_reversing_the_order():
    """``--repeats 3``: each server three times per batch, the order reversed each run, the first order
    alternating between batches (2 repeats: one order, then the reverse)."""
    from bench.interleave import combine_runs, measurement_order

    assert measurement_order(["a", "b"], 0) == ["a", "b", "b", "a"]
    assert measurement_order(["a", "b"], 0, 3) == ["a", "b", "b", "a", "a", "b"]
    assert measurement_order(["a", "b", "c"], 1, 3) == ["c", "b", "a", "a", "b", "c", "c", "b", "a"]
    runs = [{"cycle_ms": 3.0, "x": 1}, {"cycle_ms": 6.0, "x": 2}, {"cycle_ms": 9.0, "x": 3}]
    assert combine_runs(runs, mean=("cycle_ms",), longest=("x",), keep="cycle_ms") == {
        "cycle_ms": 6.0, "x": 3, "runs": [3.0, 6.0, 9.0]}


def test_interleave_stops_a_server_that_failed_to_start_at_once(tmp_path, monkeypatch):
    """A server that does not start is stopped before the next one starts (it would hold GPU memory) and left out;
    with no server up the sweep ends with an error, not a table of nothing."""
    servers = ServerLog()
    fake = servers.server_class()

    class FailingStart(fake):
        def wait_ready(self, timeout_s):
            if self.name.startswith("eagle3"):
                raise RuntimeError("died")
            super().wait_ready(timeout_s)

    monkeypatch.setattr(serve, "Server", FailingStart)
    monkeypatch.setattr(serve, "measure", lambda url, batch, after_warm_up=None, sampling=None: {
        "cycle_ms": 1.0, "mean_cycle_ms": 1.0, "chunks_per_cycle": 1.0, "accept_length": 1.0})
    monkeypatch.setattr(serve, "write_models", lambda workdir, model: (tmp_path / "t", tmp_path / "d"))
    monkeypatch.setattr(serve, "plot", lambda rows, path: None)
    monkeypatch.setattr("torch.cuda.get_device_name", lambda: "fake GPU")
    argv = ["--configs", "3,1,4", "--batches", "1", "--workdir", str(tmp_path), "--out", str(tmp_path / "s.json"),
            "--interleave"]
    serve.main([*argv, "--systems", "eagle3", "eagle_triton"])
    assert servers.events[:3] == [("start", "eagle3-3-1-4"), ("stop", "eagle3-3-1-4"), ("start", "eagle_triton-3-1-4")]
    assert {r["system"] for r in json.loads((tmp_path / "s.json").read_text())} == {"eagle_triton"}
    with pytest.raises(SystemExit, match="no server started"):
        serve.main([*argv, "--systems", "eagle3"])


def _timing_line(name, rank, steps, paired, period, forward, step, idle):
    return (f"[t TP{rank}] {name} cycle timing, rank {rank}, {steps} decode steps ({paired} after another): host "
            f"period {period} ({forward} ms in forward_batch_generation), gpu step {step} ms + idle {idle}\n")


def test_rows_keep_every_ranks_cycle_timing_from_after_the_warm_up(monkeypatch):
    """With SGLANG_EAGLE_TRITON_CYCLE_TIMING set on the servers, a row keeps each rank's means over the summary
    lines its server logged after the warm-up request (weighted by steps; by paired steps for the period and the
    idle; n/a left out); the report lists them. Lines of the warm-up do not count."""
    servers = ServerLog(log_text=_timing_line("EAGLE3", 0, 100, 100, "9.00 ms", 9.0, 9.0, "9.00 ms"))
    server = servers.server_class()("eagle3-3-1-4", "m", [], "/tmp")

    def measure(url, batch, after_warm_up=None, sampling=None):
        after_warm_up()
        servers.log_text += (_timing_line("EAGLE3", 0, 100, 100, "5.00 ms", 3.0, 4.0, "1.00 ms")
                             + _timing_line("EAGLE3", 1, 100, 100, "5.00 ms", 2.0, 4.5, "0.50 ms")
                             + _timing_line("EAGLE3", 0, 300, 0, "n/a", 4.0, 5.0, "n/a"))
        return {"cycle_ms": 5.0}

    monkeypatch.setattr(serve, "measure", measure)
    result = serve.timed_measure(server, 8)
    assert result["cycle_timing"] == {
        0: dict(host_period=5.0, host_in_forward=3.75, gpu_step=4.75, gpu_idle=1.0),
        1: dict(host_period=5.0, host_in_forward=2.0, gpu_step=4.5, gpu_idle=0.5)}
    assert serve.cycle_timing_by_rank("no timing here") is None
    table = serve.timing_table([{**row("eagle3", 8, 5.0, (3, 1, 4)), "cycle_timing": result["cycle_timing"]}])
    assert "| eagle3 | 3,1,4 | 8 | 1 | 0 | 5.00 | 3.75 | 4.75 | 1.00 |" in table


@pytest.mark.parametrize("keep_going", [True, False], ids=["adaptive-skips", "serve-stops"])
def test_one_after_another_saves_after_every_server_and_skips_or_stops_at_a_failure(keep_going):
    """Without ``--interleave`` (both sweeps): servers one at a time, each stopped before the next starts, the rows so
    far saved after each; a server that fails is left out (bench.adaptive) or ends the sweep (bench.serve)."""
    from bench.interleave import one_after_another

    servers, saved = ServerLog(), []
    fake = servers.server_class()

    def measure_batch(system, shape, server, attention, batch):
        if system == "bad":
            raise RuntimeError("died")
        return (system, batch)

    def run():
        one_after_another([("a", None), ("bad", None), ("c", None)], lambda s, _: fake(s, "m", [], "w"),
                          lambda server: "x", measure_batch, [1, 8], lambda rows: saved.append(list(rows)),
                          keep_going)

    if keep_going:
        run()
        assert servers.stopped == ["a", "bad", "c"]
        assert saved == [[("a", 1), ("a", 8)]] * 2 + [[("a", 1), ("a", 8), ("c", 1), ("c", 8)]]
    else:
        with pytest.raises(RuntimeError, match="died"):
            run()
        assert servers.stopped == ["a", "bad"] and saved == [[("a", 1), ("a", 8)]] * 2
    assert [e for e in servers.events if e[0] != "ready"] == [
        e for name in servers.stopped for e in (("start", name), ("stop", name))]  # one at a time
