"""A stand-in for ``python -m sglang.launch_server`` that CPU tests start through the launcher
(``Server(..., program=(sys.executable, STUB))``): tests/test_demo.py and tests/test_launcher.py.

``python stub_sglang_server.py --port PORT [options] [any other sglang flags, ignored]``: answers
/health (503 twice, then 200), /generate, the two OpenAI endpoints (chat also streamed, one chunk
every ``STREAM_GAP_S``), /server_info and /metrics the way SGLang 0.5.17 shapes them, prints the
plugin's log lines, and starts a child process in its process group (as SGLang starts its
scheduler); it prints both pids. Options: ``--fail`` exits at once with code 3; ``--die-after-s S``
never becomes ready and exits with code 3 after S seconds; ``--ready-after-s S`` answers /health
200 only from S seconds after start; ``--ignore-term`` / ``--child-ignores-term``: the stub / its
child ignore SIGTERM.
"""

import argparse
import json
import os
import signal
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

BANNER = ("[2026-11-26 10:00:00 TP0] EAGLE_TRITON (eagle3 draft, steps=5 topk=4 draft_tokens=8): draft forward: "
          "triton sgl_eagle_triton.drafter (draft_input, linear, draft_attention, lm_head_topk, draft_select, "
          "draft_organize); build tree: triton sgl_eagle_triton.kernels.build_tree")
RAN = "[2026-11-26 10:00:01 TP0] EAGLE_TRITON: triton build_tree ran (first call in this process)"
METRICS = """# HELP sglang:spec_verify_calls_total Number of speculative decoding verification calls.
# TYPE sglang:spec_verify_calls_total counter
sglang:spec_verify_calls_total{model_name="default",tp_rank="0"} 40.0
sglang:generation_tokens_total{is_streaming="false",model_name="default"} 60.0
sglang:generation_tokens_total{is_streaming="true",model_name="default"} 20.0
sglang:spec_accept_length{model_name="default",tp_rank="0"} 2.5
"""
CHAT_PIECES = ("def ", "is_prime", "(n):")  # a streamed chat answer, one content delta per chunk
STREAM_GAP_S = 0.2
START = time.monotonic()


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # streamed answers use chunked transfer, as SGLang's do
    health_calls = 0
    ready_after_s = None  # None: ready from the third /health; float("inf"): never

    def _send(self, status: int, body: str, kind: str = "application/json") -> None:
        self.send_response(status)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(body.encode())))
        self.end_headers()
        self.wfile.write(body.encode())

    def _stream(self, payloads) -> None:
        """Server-sent events, one HTTP chunk each, ``STREAM_GAP_S`` apart, then ``data: [DONE]``."""
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        for i, payload in enumerate([*map(json.dumps, payloads), "[DONE]"]):
            if i:
                time.sleep(STREAM_GAP_S)
            data = f"data: {payload}\n\n".encode()
            self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
            self.wfile.flush()
        self.wfile.write(b"0\r\n\r\n")

    def do_GET(self):
        if self.path == "/health":
            Handler.health_calls += 1
            if Handler.ready_after_s is None:
                ready = Handler.health_calls > 2
            else:
                ready = time.monotonic() - START >= Handler.ready_after_s
            self._send(200 if ready else 503, "")
        elif self.path == "/server_info":
            self._send(200, json.dumps({"internal_states": [{"avg_spec_accept_length": 1.75}]}))
        elif self.path == "/metrics":
            self._send(200, METRICS, "text/plain")
        else:
            self._send(404, "{}")

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        if self.path == "/generate":
            return self._generate(body)
        if self.path not in ("/v1/chat/completions", "/v1/completions"):
            return self._send(404, json.dumps({"error": {"message": f"no {self.path}"}}))
        if body.get("max_tokens", 1) < 1:
            return self._send(400, json.dumps({"object": "error", "message": "max_tokens must be at least 1"}))
        usage = {"prompt_tokens": 5, "completion_tokens": body["max_tokens"], "total_tokens": 5 + body["max_tokens"]}
        if self.path == "/v1/chat/completions" and body.get("stream"):
            deltas = [{"role": "assistant", "content": ""}, *({"content": p} for p in CHAT_PIECES), {}]
            chunks = [{"choices": [{"index": 0, "delta": d, "finish_reason": None if d else "length"}]}
                      for d in deltas]
            return self._stream([*chunks, {"choices": [], "usage": usage}])
        if self.path == "/v1/chat/completions":
            choice = {"message": {"role": "assistant", "content": "def is_prime(n):\x07"}, "finish_reason": "length"}
            if body.get("return_meta_info"):
                choice["meta_info"] = {"spec_verify_ct": 4, "spec_accept_length": body["max_tokens"] / 4,
                                       "spec_accept_rate": 0.25, "completion_tokens": body["max_tokens"]}
        else:
            choice = {"text": "    return n", "finish_reason": "length"}
        self._send(200, json.dumps({"choices": [choice], "usage": usage}))

    def _generate(self, body: dict) -> None:
        """Output ids 100, 101, ...; ``meta_info`` echoes the sampling params and the prompt's kind. Streamed with
        max_new_tokens < 1: an error chunk."""
        params = body["sampling_params"]
        n = params["max_new_tokens"]
        meta = {"completion_tokens": n, "spec_verify_ct": max(1, n // 2), "sampling_params": params,
                "prompt_kind": "input_ids" if "input_ids" in body else "text"}
        if body.get("return_logprob"):
            meta["output_top_logprobs"] = [[[-0.1, 100 + i], [-2.0, 7]][:body["top_logprobs_num"]] for i in range(n)]
        if body.get("stream") and n < 1:  # SGLang reports errors of a streamed request inside the stream
            return self._stream([{"error": {"message": "max_new_tokens must be at least 1", "code": 400}}])
        if not body.get("stream"):
            return self._send(200, json.dumps({"text": " x" * n, "output_ids": list(range(100, 100 + n)),
                                               "meta_info": {**meta, "finish_reason": {"type": "length"}}}))
        self._stream([{"text": " x" * (i + 1), "output_ids": list(range(100, 101 + i)),
                       "meta_info": {**meta, "completion_tokens": i + 1}} for i in range(n)])

    def log_message(self, *args):
        pass


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--fail", action="store_true")
    parser.add_argument("--die-after-s", type=float)
    parser.add_argument("--ready-after-s", type=float)
    parser.add_argument("--ignore-term", action="store_true")
    parser.add_argument("--child-ignores-term", action="store_true")
    args, _sglang_flags = parser.parse_known_args()
    if args.fail:
        print("stub: failing at start-up", flush=True)
        sys.exit(3)
    ignore = "import signal; signal.signal(signal.SIGTERM, signal.SIG_IGN); " if args.child_ignores_term else ""
    child = subprocess.Popen([sys.executable, "-c", ignore + "import time; time.sleep(600)"])
    if args.ignore_term:  # after starting the child: an ignored signal stays ignored across exec
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    print(f"stub pid {os.getpid()} child {child.pid}", flush=True)
    print(BANNER + "\n" + RAN, flush=True)
    Handler.ready_after_s = args.ready_after_s
    if args.die_after_s is not None:
        Handler.ready_after_s = float("inf")

        def die():
            time.sleep(args.die_after_s)
            print("stub: dying before it was ready", flush=True)
            os._exit(3)

        threading.Thread(target=die, daemon=True).start()
    ThreadingHTTPServer(("127.0.0.1", args.port), Handler).serve_forever()


if __name__ == "__main__":
    main()
