"""The one launcher of ``python -m sglang.launch_server``: the demo, the end-to-end tests and the serving
benchmark all start their servers with :class:`Server` and talk to them with :class:`Client`.

Standard library only (no ``requests``, torch or sglang import), so that importing it is cheap and
works where SGLang cannot run.

- :class:`Server` starts the server in its own process session on 127.0.0.1, a free ``--port`` and a
  free ``--nccl-port`` (unless the arguments pass one: several servers started at once on one host
  otherwise collide on it, EADDRINUSE; nor with data-parallel replicas, ``--dp`` > 1: SGLang 0.5.17 gives a
  passed port to every replica, which then collide on it), logging stdout and stderr to ``<log_dir>/<name>.log``;
  :meth:`Server.wait_ready` polls ``/health`` and gives up as soon as the process dies;
  :meth:`Server.stop` ends the whole process group (SIGTERM, then SIGKILL after a grace period).
- :class:`Client` (which :class:`Server` is) wraps the HTTP requests callers make: JSON GET / POST,
  streamed responses read chunk by chunk as they arrive, ``/generate``, ``/v1/completions`` and
  ``/v1/chat/completions``. It never goes through an ``http_proxy`` from the environment.
"""

from __future__ import annotations

import http.client
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

HOST = "127.0.0.1"
# What runs the server; tests pass another ``program`` (tests/stub_sglang_server.py) to Server.
LAUNCH_SERVER = (sys.executable, "-m", "sglang.launch_server")
NCCL_PORT_FLAG = "--nccl-port"

_handed_out: set[int] = set()
_opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # local servers: never via a proxy


def free_port() -> int:
    """A TCP port free on 127.0.0.1 right now, and never returned before by this process (so that servers
    started one after the other before any of them binds get distinct ports)."""
    while True:
        with socket.socket() as s:
            s.bind((HOST, 0))
            port = s.getsockname()[1]
        if port not in _handed_out:
            _handed_out.add(port)
            return port


def exit_on_sigterm() -> None:
    """Make SIGTERM (``timeout``'s default signal) end this process through ``SystemExit``, so that ``finally``
    blocks stop the servers it started: they run in sessions of their own and would outlive it."""
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))


def passes_flag(args: Sequence[str], flag: str) -> bool:
    """Whether ``args`` pass ``flag``, as ``--flag VALUE`` or ``--flag=VALUE``."""
    return any(a == flag or a.startswith(flag + "=") for a in args)


def flag_value(args: Sequence[str], *names: str) -> str | None:
    """The value ``args`` give the flag spelled any of ``names`` (the last one given), or None."""
    value = None
    for i, a in enumerate(args):
        for name in names:
            if a == name and i + 1 < len(args):
                value = args[i + 1]
            elif a.startswith(name + "="):
                value = a.split("=", 1)[1]
    return value


def data_parallel(args: Sequence[str]) -> bool:
    """Whether ``args`` ask for more than one data-parallel replica."""
    return int(flag_value(args, "--dp", "--dp-size", "--data-parallel-size") or 1) > 1


def launch_command(model_path: str, args: Sequence[str], port: int, nccl_port: int | None = None,
                   program: Sequence[str] = LAUNCH_SERVER) -> list[str]:
    """The command line that serves ``model_path`` with ``args`` on ``HOST:port``: ``program`` (by default
    ``python -m sglang.launch_server``), then ``--model-path``, ``--host``, ``--port``, ``--nccl-port``
    (when ``nccl_port`` is given and ``args`` do not pass one) and ``args``."""
    for owned in ("--host", "--port"):
        if passes_flag(args, owned):
            raise ValueError(f"{owned} is set by the launcher; pass port= to Server instead")
    cmd = [*program, "--model-path", str(model_path), "--host", HOST, "--port", str(port)]
    if nccl_port is not None and not passes_flag(args, NCCL_PORT_FLAG):
        cmd += [NCCL_PORT_FLAG, str(nccl_port)]
    return [*cmd, *args]


class RequestError(RuntimeError):
    """An HTTP error status (``status``), or an error reported inside a stream (``status`` None)."""

    def __init__(self, url: str, status: int | None, body: str):
        super().__init__(f"{url}: {f'HTTP {status}' if status else 'error in the stream'}: {body[:500]}")
        self.url, self.status, self.body = url, status, body


class ServerError(RuntimeError):
    """The server process exited (``exit_code``) or did not answer ``/health`` in time (``exit_code`` None)
    before it was ready. ``reason`` says which, without the server's name; ``tail`` is the end of its log."""

    def __init__(self, name: str, reason: str, exit_code: int | None, tail: str):
        super().__init__(f"server {name} {reason}; log tail:\n{tail}")
        self.reason, self.exit_code, self.tail = reason, exit_code, tail


class Client:
    """HTTP requests to an SGLang server at ``url`` (``http://host:port``), on urllib."""

    def __init__(self, url: str):
        self.url = url.rstrip("/")

    def _open(self, path: str, body: Any = None, timeout: float = 300) -> http.client.HTTPResponse:
        data = None if body is None else json.dumps(body).encode()
        headers = {} if data is None else {"Content-Type": "application/json"}
        req = urllib.request.Request(self.url + path, data=data, headers=headers)
        try:
            return _opener.open(req, timeout=timeout)
        except urllib.error.HTTPError as e:
            with e:
                text = e.read().decode(errors="replace")
            raise RequestError(self.url + path, e.code, text) from None

    def get(self, path: str, timeout: float = 30) -> str:
        """GET ``path``; returns the response body as text. Raises :class:`RequestError` on an error status."""
        with self._open(path, timeout=timeout) as r:
            return r.read().decode()

    def get_json(self, path: str, timeout: float = 30) -> Any:
        """GET ``path``; returns the decoded JSON body. Raises :class:`RequestError` on an error status."""
        return json.loads(self.get(path, timeout))

    def post(self, path: str, body: Any, timeout: float = 300) -> str:
        """POST ``body`` as JSON to ``path``; returns the response body as text (e.g. ``/start_profile``'s)."""
        with self._open(path, body, timeout) as r:
            return r.read().decode()

    def post_json(self, path: str, body: Any, timeout: float = 300) -> Any:
        """POST ``body`` as JSON to ``path``; returns the decoded JSON response."""
        return json.loads(self.post(path, body, timeout))

    def healthy(self, path: str = "/health", timeout: float = 5) -> bool:
        """True when GET ``path`` answers 200 within ``timeout`` s; False on an error status or no answer."""
        try:
            with self._open(path, timeout=timeout) as r:
                r.read()
                return r.status == 200
        except (OSError, http.client.HTTPException, RequestError):
            return False

    def stream(self, path: str, body: Mapping[str, Any], timeout: float = 600) -> Iterator[dict]:
        """POST ``body`` with ``"stream": true``; yields each server-sent ``data:`` payload, decoded, as soon as
        its line has arrived (one HTTP chunk each from SGLang), up to ``data: [DONE]``. ``timeout`` bounds each
        wait for data, not the whole stream. Raises :class:`RequestError` on an error status or a payload
        carrying ``"error"``."""
        url = self.url + path
        with self._open(path, {**body, "stream": True}, timeout) as r:
            for raw in r:  # HTTPResponse.readline: returns a line as soon as it is complete, chunk by chunk
                line = raw.decode().strip()
                if not line.startswith("data:"):
                    continue
                data = line[len("data:"):].strip()
                if data == "[DONE]":
                    return
                payload = json.loads(data)
                if isinstance(payload, dict) and "error" in payload:
                    raise RequestError(url, None, json.dumps(payload["error"]))
                yield payload

    @staticmethod
    def _generate_body(prompt: str | list[int], max_new_tokens: int, sampling: dict) -> dict:
        params = {"temperature": 0, "max_new_tokens": max_new_tokens, "ignore_eos": True, **sampling}
        return {"input_ids" if isinstance(prompt, list) else "text": prompt, "sampling_params": params}

    def generate(self, prompt: str | list[int], max_new_tokens: int, top_logprobs: int = 0, timeout: float = 300,
                 **sampling) -> dict:
        """``/generate`` of ``prompt`` (text, or a list of token ids), greedy unless ``sampling`` params say
        otherwise, EOS ignored (so always ``max_new_tokens`` long); ``top_logprobs`` > 0 also asks for that many
        log-probs per position. Returns SGLang's response: ``text``, ``output_ids``, ``meta_info``."""
        body = self._generate_body(prompt, max_new_tokens, sampling)
        if top_logprobs:
            body.update(return_logprob=True, top_logprobs_num=top_logprobs)
        return self.post_json("/generate", body, timeout)

    def generate_stream(self, prompt: str | list[int], max_new_tokens: int, timeout: float = 600,
                        **sampling) -> Iterator[dict]:
        """``/generate`` as :meth:`generate`, streamed: yields each chunk (``text``, ``output_ids``,
        ``meta_info`` so far) as it arrives; SGLang sends one per decode cycle."""
        return self.stream("/generate", self._generate_body(prompt, max_new_tokens, sampling), timeout)

    def completion(self, prompt: str, max_tokens: int, timeout: float = 300) -> str:
        """Greedy ``/v1/completions`` of ``prompt``; returns the completion text."""
        body = {"model": "default", "prompt": prompt, "max_tokens": max_tokens, "temperature": 0}
        return self.post_json("/v1/completions", body, timeout)["choices"][0]["text"]

    def chat(self, prompt: str, max_tokens: int, stream: bool = False, timeout: float = 300) -> str:
        """Greedy ``/v1/chat/completions`` of one user message; returns the answer text (with ``stream``, the
        concatenated content deltas of the streamed chunks)."""
        body = {"model": "default", "messages": [{"role": "user", "content": prompt}], "max_tokens": max_tokens,
                "temperature": 0}
        if not stream:
            return self.post_json("/v1/chat/completions", body, timeout)["choices"][0]["message"]["content"]
        return "".join(choice["delta"].get("content") or ""
                       for chunk in self.stream("/v1/chat/completions", body, timeout)
                       for choice in chunk.get("choices") or ())


def _group_alive(pgid: int) -> bool:
    """Whether process group ``pgid`` still has a process that is not a zombie (zombies wait for a parent that
    may never reap them, and hold nothing). Reads /proc where there is one, else probes with signal 0."""
    proc = Path("/proc")
    if not (proc / "self" / "stat").exists():
        try:
            os.killpg(pgid, 0)
            return True
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
    for stat in proc.glob("[0-9]*/stat"):
        try:
            state, _ppid, pgrp = stat.read_text().rsplit(")", 1)[1].split()[:3]  # after "pid (comm)"
        except (OSError, IndexError, ValueError):
            continue  # exited meanwhile
        if pgrp == str(pgid) and state != "Z":
            return True
    return False


class Server(Client):
    """``python -m sglang.launch_server --model-path MODEL_PATH ... ARGS``, started at construction in its own
    process session (its own process group, so :meth:`stop` reaches the scheduler and detokenizer processes it
    spawns), on 127.0.0.1 and ``port`` (default: a free one), with a free ``--nccl-port`` unless ``args`` pass
    one or ask for data-parallel replicas (SGLang then picks a free port per replica). Its stdout and stderr
    go to ``log_dir/<name>.log``, whose first line is the command. ``env`` is added to this process's
    environment (plus ``PYTHONUNBUFFERED=1``); ``program`` replaces
    ``python -m sglang.launch_server`` (tests run a stub). A context manager: leaving it calls :meth:`stop`.

    Attributes: ``name``, ``port``, ``nccl_port`` (None when ``args`` pass one or ask for replicas), ``url``,
    ``command``, ``log_path``, ``proc`` (the :class:`subprocess.Popen`; its pid is the process group's id)."""

    def __init__(self, name: str, model_path: str, args: Sequence[str], log_dir: str | os.PathLike,
                 env: Mapping[str, str] | None = None, port: int | None = None,
                 program: Sequence[str] = LAUNCH_SERVER):
        self.name = name
        self.port = port or free_port()
        self.nccl_port = None if passes_flag(args, NCCL_PORT_FLAG) or data_parallel(args) else free_port()
        super().__init__(f"http://{HOST}:{self.port}")
        self.command = launch_command(model_path, args, self.port, self.nccl_port, program)
        self.log_path = Path(log_dir) / f"{name}.log"
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self._stopped = False
        with open(self.log_path, "w") as log:
            log.write(" ".join(self.command) + "\n")
            log.flush()
            self.proc = subprocess.Popen(self.command, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                         start_new_session=True,
                                         env={**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})})

    def __enter__(self) -> Server:
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def wait_ready(self, timeout_s: float = 600, poll_s: float = 1.0) -> float:
        """Block until ``/health`` answers 200; returns the seconds waited. Raises :class:`ServerError` (with the
        log tail) as soon as the process has exited, or once ``timeout_s`` has passed."""
        start = time.monotonic()
        deadline = start + timeout_s
        while True:
            if self.proc.poll() is not None:
                raise ServerError(self.name, f"exited with code {self.proc.returncode} during start-up",
                                  self.proc.returncode, self.log_tail())
            left = deadline - time.monotonic()
            if self.healthy(timeout=max(0.1, min(5.0, left))):
                return time.monotonic() - start
            left = deadline - time.monotonic()
            if left <= 0:
                raise ServerError(self.name, f"did not answer /health within {timeout_s:.0f} s", None,
                                  self.log_tail())
            try:
                self.proc.wait(timeout=min(poll_s, left))  # returns at once if the process exits meanwhile
            except subprocess.TimeoutExpired:
                pass

    def stop(self, grace_s: float = 30) -> None:
        """End the server's whole process group: SIGTERM to every process in it, then SIGKILL to whatever is
        left of it after ``grace_s`` seconds (the launching process, or any process it started, that has not
        exited). Returns once the launching process is reaped and no process of the group is left (after a
        SIGKILL, at most 5 s more). Processes of the group that are zombies count as gone. Idempotent."""
        if self._stopped:  # the group's id may name another group by now
            return
        pgid = self.proc.pid
        try:
            os.killpg(pgid, signal.SIGTERM)
        except ProcessLookupError:  # the whole group has exited already
            pass
        deadline = time.monotonic() + grace_s
        try:
            self.proc.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            pass
        while _group_alive(pgid) and time.monotonic() < deadline:
            time.sleep(0.1)
        if self.proc.poll() is None or _group_alive(pgid):
            try:
                os.killpg(pgid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            deadline = time.monotonic() + 5  # SIGKILL is delivered asynchronously
            while _group_alive(pgid) and time.monotonic() < deadline:
                time.sleep(0.05)
        self.proc.wait()
        self._stopped = True

    def log(self) -> str:
        """The whole log so far (the command line, then the server's stdout and stderr)."""
        return self.log_path.read_text(errors="replace")

    def log_tail(self, n: int = 60) -> str:
        """The last ``n`` lines of :meth:`log`, joined by newlines."""
        return "\n".join(self.log().splitlines()[-n:])
