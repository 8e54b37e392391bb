"""A real ``python -m sglang.launch_server`` process on a free local port, for end-to-end tests."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import requests

# Flags every e2e server shares (the GPU bundle has no FA3/FlashInfer/xgrammar kernels; see README).
COMMON_ARGS = [
    "--attention-backend", "triton",
    "--sampling-backend", "pytorch",
    "--grammar-backend", "none",
    "--enable-deterministic-inference",
    "--cuda-graph-max-bs", "16",
    "--max-running-requests", "16",
    "--mem-fraction-static", "0.85",
    "--max-total-tokens", "65536",
]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    """Starts at construction; ``wait_ready()`` blocks until /health answers; ``stop()`` ends it.
    ``base_args`` default to the e2e tests' flags (deterministic inference on); benchmarks pass their own."""

    def __init__(self, name: str, model: str, extra_args: list[str], log_dir: Path, base_args=COMMON_ARGS):
        self.name, self.port = name, _free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = log_dir / f"{name}.log"
        cmd = [sys.executable, "-m", "sglang.launch_server", "--model-path", model,
               "--host", "127.0.0.1", "--port", str(self.port), *base_args, *extra_args]
        self._log = open(self.log_path, "w")
        self._log.write(" ".join(cmd) + "\n")
        self._log.flush()
        self.proc = subprocess.Popen(cmd, stdout=self._log, stderr=subprocess.STDOUT, start_new_session=True,
                                     env={**os.environ, "PYTHONUNBUFFERED": "1"})

    def wait_ready(self, timeout_s: float = 600) -> "Server":
        deadline = time.time() + timeout_s
        while time.time() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server {self.name} exited ({self.proc.returncode}); tail:\n{self.log_tail()}")
            try:
                if requests.get(self.url + "/health", timeout=5).status_code == 200:
                    return self
            except requests.RequestException:
                pass
            time.sleep(2)
        raise TimeoutError(f"server {self.name} not ready in {timeout_s}s; tail:\n{self.log_tail()}")

    def log_tail(self, n: int = 60) -> str:
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-n:])

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        self._log.close()

    # --- requests -------------------------------------------------------------------------
    def generate(self, prompt: str, max_new_tokens: int, top_logprobs: int = 0, **sampling) -> dict:
        """``/generate``, greedy unless ``sampling`` params say otherwise; always ``max_new_tokens`` long."""
        params = {"temperature": 0, "max_new_tokens": max_new_tokens, "ignore_eos": True, **sampling}
        body = {"text": prompt, "sampling_params": params}
        if top_logprobs:
            body.update(return_logprob=True, top_logprobs_num=top_logprobs)
        r = requests.post(self.url + "/generate", json=body, timeout=300)
        r.raise_for_status()
        return r.json()

    def completion(self, prompt: str, max_tokens: int) -> str:
        r = requests.post(self.url + "/v1/completions", timeout=300,
                          json={"model": "default", "prompt": prompt, "max_tokens": max_tokens, "temperature": 0})
        r.raise_for_status()
        return r.json()["choices"][0]["text"]

    def chat(self, prompt: str, max_tokens: int, stream: bool = False) -> str:
        body = {"model": "default", "messages": [{"role": "user", "content": prompt}],
                "max_tokens": max_tokens, "temperature": 0, "stream": stream}
        r = requests.post(self.url + "/v1/chat/completions", json=body, timeout=300, stream=stream)
        r.raise_for_status()
        if not stream:
            return r.json()["choices"][0]["message"]["content"]
        text = []
        for line in r.iter_lines(decode_unicode=True):
            if not line or not line.startswith("data: ") or line == "data: [DONE]":
                continue
            delta = json.loads(line[len("data: "):])["choices"][0]["delta"]
            text.append(delta.get("content") or "")
        return "".join(text)
