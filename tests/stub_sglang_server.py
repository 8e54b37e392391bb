"""A stand-in for ``python -m sglang.launch_server`` that the demo's CPU test starts instead.

``python stub_sglang_server.py PORT [--fail]``: answers /health (503 twice, then 200), the two
OpenAI endpoints, /server_info and /metrics the way SGLang 0.5.17 shapes them, prints the plugin's
log lines, and starts a child process in its process group (as SGLang starts its scheduler); it
prints both pids. ``--fail`` exits at once with code 3.
"""

import json
import os
import subprocess
import sys
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


class Handler(BaseHTTPRequestHandler):
    health_calls = 0

    def _send(self, status: int, body: str, kind: str = "application/json") -> None:
        self.send_response(status)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(body.encode())))
        self.end_headers()
        self.wfile.write(body.encode())

    def do_GET(self):
        if self.path == "/health":
            Handler.health_calls += 1
            self._send(200 if Handler.health_calls > 2 else 503, "")
        elif self.path == "/server_info":
            self._send(200, json.dumps({"internal_states": [{"avg_spec_accept_length": 1.75}]}))
        elif self.path == "/metrics":
            self._send(200, METRICS, "text/plain")
        else:
            self._send(404, "{}")

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        usage = {"prompt_tokens": 5, "completion_tokens": body["max_tokens"], "total_tokens": 5 + body["max_tokens"]}
        if self.path == "/v1/chat/completions":
            choice = {"message": {"role": "assistant", "content": "def is_prime(n):\x07"}, "finish_reason": "length"}
            if body.get("return_meta_info"):
                choice["meta_info"] = {"spec_verify_ct": 4, "spec_accept_length": body["max_tokens"] / 4,
                                       "spec_accept_rate": 0.25, "completion_tokens": body["max_tokens"]}
        else:
            choice = {"text": "    return n", "finish_reason": "length"}
        self._send(200, json.dumps({"choices": [choice], "usage": usage}))

    def log_message(self, *args):
        pass


if __name__ == "__main__":
    if "--fail" in sys.argv:
        print("stub: failing at start-up", flush=True)
        sys.exit(3)
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    print(f"stub pid {os.getpid()} child {child.pid}", flush=True)
    print(BANNER + "\n" + RAN, flush=True)
    ThreadingHTTPServer(("127.0.0.1", int(sys.argv[1])), Handler).serve_forever()
