"""``python -m sgl_eagle_triton demo``: EAGLE_TRITON served end to end on one GPU, no model hub needed.

Serves the trained tiny Llama target + EAGLE-3 draft shipped with the package
(``sgl_eagle_triton/devtools/assets/tiny-code-v1``, about 2 tokens accepted per step), a freshly written
random-weight pair (``--random``: about 1), or the ``--model-path`` / ``--draft-model-path`` given. It starts
``python -m sglang.launch_server --speculative-algorithm EAGLE_TRITON`` in its own process group, sends a few
OpenAI requests (``/v1/chat/completions``, ``/v1/completions``; greedy and sampled), and prints the answers, the
acceptance statistics SGLang reports (per request: chat ``meta_info``; server-wide: ``/server_info`` and
``/metrics``), a one-line acceptance summary and the kernel lines of the server log. Then it stops the whole
process group and removes its temporary folder unless ``--keep``.

A leaf entry point: it starts the server and talks to it over HTTP through
:mod:`sgl_eagle_triton.devtools.launcher` (standard library only), and imports torch only to write random models.
"""

from __future__ import annotations

import argparse
import re
import shutil
import sys
import tempfile
from pathlib import Path

from sgl_eagle_triton import ALGORITHM_NAME
from sgl_eagle_triton.devtools import TRAINED_PAIR
from sgl_eagle_triton.devtools.launcher import Server, ServerError
from sgl_eagle_triton.glue.versions import cuda_graph_max_bs_flag

# The flags the air-gapped GPU bundle needs (no FA3 / FlashInfer / xgrammar); valid on any install.
SERVER_FLAGS = (
    "--attention-backend", "triton", "--sampling-backend", "pytorch", "--grammar-backend", "none", "--enable-metrics",
)
TINY_MODEL_FLAGS = ("--max-total-tokens", "65536", "--max-running-requests", "8", cuda_graph_max_bs_flag(), "8")
CHAT = [{"role": "user", "content": "Write a Python function that tells whether a number is prime."}]
REQUESTS = (
    ("chat, greedy", "/v1/chat/completions", {"messages": CHAT, "temperature": 0}),
    ("chat, sampled (temperature 0.8, top-p 0.95)", "/v1/chat/completions",
     {"messages": CHAT, "temperature": 0.8, "top_p": 0.95}),
    ("completion, greedy", "/v1/completions", {"prompt": "def fibonacci(n):\n", "temperature": 0}),
    ("completion, sampled (temperature 0.8, top-p 0.95)", "/v1/completions",
     {"prompt": "import numpy as np\n\n", "temperature": 0.8, "top_p": 0.95}),
)
KERNEL_LINE = re.compile(rf"{ALGORITHM_NAME}(?: \(.*draft forward: .*|: .* ran \(first call in this process\))")
METRIC_SAMPLE = re.compile(r"^([A-Za-z_:][\w:]*)(?:\{[^}]*\})? +(\S+)")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--port", type=int, default=0, help="server port (default: a free one)")
    parser.add_argument("--keep", action="store_true",
                        help="keep the temporary folder (server log; with --random, the models)")
    parser.add_argument("--random", action="store_true",
                        help="serve a freshly written random-weight tiny pair instead of the trained one")
    parser.add_argument("--model-path", help="target model to serve instead of the tiny trained one")
    parser.add_argument("--draft-model-path", help="its EAGLE / EAGLE-3 draft (with --model-path)")
    parser.add_argument("--max-tokens", type=int, default=48, help="tokens per answer (default 48)")
    parser.add_argument("--timeout", type=float, default=900, help="seconds to wait for the server (default 900)")


def check_arguments(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    if (args.model_path is None) != (args.draft_model_path is None):
        parser.error("--model-path and --draft-model-path go together")
    if args.random and args.model_path is not None:
        parser.error("--random and --model-path exclude each other")
    if args.max_tokens < 1:
        parser.error("--max-tokens must be at least 1")


def server_args(draft: str, tiny: bool) -> list[str]:
    """The ``sglang.launch_server`` flags after ``--model-path``, ``--host`` and ``--port`` (which
    :class:`~sgl_eagle_triton.devtools.launcher.Server` adds): EAGLE_TRITON with ``draft``, and the bundle's flags."""
    return ["--speculative-algorithm", ALGORITHM_NAME, "--speculative-draft-model-path", draft,
            *SERVER_FLAGS, *(TINY_MODEL_FLAGS if tiny else ())]


def parse_metrics(text: str) -> dict[str, float]:
    """Prometheus text exposition -> ``{metric name: sum over its label sets}``."""
    totals: dict[str, float] = {}
    for line in text.splitlines():
        m = METRIC_SAMPLE.match(line)
        if m and not line.startswith("#"):
            totals[m[1]] = totals.get(m[1], 0.0) + float(m[2])
    return totals


def request_stats(response: dict) -> str:
    """One line on a response's tokens and, when it carries SGLang's ``meta_info``, its acceptance."""
    choice = response["choices"][0]
    tokens = response["usage"]["completion_tokens"]
    meta = choice.get("meta_info") or {}
    if not meta.get("spec_verify_ct"):
        return f"{tokens} tokens (per-request speculation stats: /generate or chat with return_meta_info)"
    return (f"{tokens} tokens in {meta['spec_verify_ct']} verify steps: accept length "
            f"{meta['spec_accept_length']:.2f} tokens/step, draft accept rate {meta['spec_accept_rate']:.2f}")


def acceptance_summary(responses: list[dict]) -> str:
    """Mean tokens committed per verify step over the responses that carry SGLang's ``meta_info``."""
    counted = [(r["usage"]["completion_tokens"], (r["choices"][0].get("meta_info") or {}).get("spec_verify_ct"))
               for r in responses]
    counted = [(tokens, verifies) for tokens, verifies in counted if verifies]
    if not counted:
        return "Acceptance: no response carried spec_verify_ct (see the server-wide lines above)"
    tokens, verifies = sum(t for t, _ in counted), sum(v for _, v in counted)
    return (f"Acceptance: {tokens / verifies:.2f} tokens per verify step on average ({tokens} tokens in {verifies} "
            f"verify steps over {len(counted)} requests with meta_info; 1.00 = the draft never right)")


def answer_text(response: dict) -> str:
    choice = response["choices"][0]
    text = choice["message"]["content"] if "message" in choice else choice["text"]
    return "".join(c if c.isprintable() or c == "\n" else "?" for c in text)


def server_acceptance(server_info: dict, metrics: dict[str, float]) -> list[str]:
    """Server-wide acceptance lines from ``/server_info`` and ``/metrics`` (what each one exposes)."""
    states = server_info.get("internal_states") or [{}]
    avg = states[0].get("avg_spec_accept_length")
    lines = ["/server_info internal_states[0].avg_spec_accept_length: "
             + (f"{avg:.2f}" if avg is not None else "not yet (SGLang updates it every --decode-log-interval steps)")]
    tokens, verifies = metrics.get("sglang:generation_tokens_total"), metrics.get("sglang:spec_verify_calls_total")
    if tokens and verifies:
        lines.append(f"/metrics sglang:generation_tokens_total / sglang:spec_verify_calls_total: "
                     f"{tokens:.0f} / {verifies:.0f} = {tokens / verifies:.2f} tokens/step")
    if (last := metrics.get("sglang:spec_accept_length")) is not None:
        lines.append(f"/metrics sglang:spec_accept_length (last log interval): {last:.2f}")
    return lines


def kernel_lines(log: str) -> list[str]:
    """The plugin's start-up banner and its "<kernel> ran" lines, without SGLang's log prefix, once each."""
    return list(dict.fromkeys(m[0] for m in map(KERNEL_LINE.search, log.splitlines()) if m))


def serve_and_ask(args: argparse.Namespace, workdir: Path) -> None:
    """Pick or write the models, start the server, ask, print, and stop the server."""
    tiny = args.model_path is None
    if args.random:
        from sgl_eagle_triton.devtools.tiny_models import write_random_pair  # torch: only when writing models

        print(f"Writing a tiny random Llama target + EAGLE-3 draft to {workdir}")
        target, draft = map(str, write_random_pair(workdir, draft="eagle3"))
    elif tiny:
        target, draft = str(TRAINED_PAIR / "target"), str(TRAINED_PAIR / "eagle3")
        print(f"Serving the trained tiny Llama target + EAGLE-3 draft in {TRAINED_PAIR}")
    else:
        target, draft = args.model_path, args.draft_model_path
    server = Server("server", target, server_args(draft, tiny), workdir, port=args.port or None)
    print(f"Starting python {' '.join(server.command[1:])}\n  server log: {server.log_path}\n"
          "  (a first start compiles kernels and captures CUDA graphs: a minute or more)")
    try:
        try:
            print(f"Server ready at {server.url} after {server.wait_ready(args.timeout):.0f} s")
        except ServerError as e:
            print("Server log tail:\n" + server.log_tail(40))
            raise RuntimeError(f"the server {e.reason}") from None
        responses = []
        for label, endpoint, body in REQUESTS:
            body = {"model": "default", "max_tokens": args.max_tokens, **body}
            if endpoint.endswith("chat/completions"):
                body["return_meta_info"] = True
            response = server.post_json(endpoint, body)
            responses.append(response)
            question = body["messages"][-1]["content"] if "messages" in body else body["prompt"]
            print(f"\n== {label} ({endpoint}) ==\nQ: {question.strip()}\nA: {answer_text(response).strip()}")
            print(f"   {request_stats(response)}")
        print("\n== Acceptance, whole server ==")
        info, metrics = server.get_json("/server_info"), parse_metrics(server.get("/metrics"))
        print("\n".join(f"  {line}" for line in server_acceptance(info, metrics)))
        if args.random:
            print("  (random weights: the draft is almost never right, so about 1 token per step is expected)")
        print(f"\n{acceptance_summary(responses)}")
        print("\n== Kernels (from the server log) ==")
        print("\n".join(f"  {line}" for line in kernel_lines(server.log())) or "  none found")
    finally:
        server.stop()  # the whole process group
        print("\nServer stopped.")


def run(args: argparse.Namespace) -> int:
    """The demo; returns the process exit code."""
    workdir = Path(tempfile.mkdtemp(prefix="sgl-eagle-triton-demo-"))
    try:
        serve_and_ask(args, workdir)
        return 0
    except (RuntimeError, OSError) as e:
        print(f"demo failed: {e}", file=sys.stderr)
        return 1
    finally:
        if args.keep:
            print(f"Kept {workdir}")
        else:
            shutil.rmtree(workdir, ignore_errors=True)
