"""The load/fault test's request mix and pass criteria (pure Python; CPU-tested in test_load_mix.py).

:func:`build_mix` makes a deterministic list of :class:`LoadRequest`: /generate, /v1/completions
and /v1/chat/completions, greedy and sampled, streamed and not, 1 to 256 tokens, stop strings,
prompts exactly at the context limit, streams the client drops mid-way, requests cancelled through
/abort_request, and invalid requests that must get a 4xx. The client in test_load_fault.py turns
each into an outcome dict (see :func:`new_outcome`); the functions below judge those outcomes.
"""

from __future__ import annotations

import json
import random
import re
from collections import Counter
from dataclasses import dataclass, field

from tests.lossless import TOP_LOGPROBS, tie_aware_compare, top_logprobs

CONTEXT_LEN = 1024
SPEC_TREE = (5, 4, 8)  # (steps, topk, draft tokens) of the server under test
NEAR_LIMIT_NEW_TOKENS = 32
MAX_TOKENS = (1, 1, 8, 32, 64, 128, 256)
LONG = 256
KIND_WEIGHTS = {"generate": 36, "completion": 18, "chat": 18, "disconnect": 10, "abort": 8, "invalid": 10}
CODE_PROMPTS = (
    "import os\n", "def fibonacci(n):\n", "class Stack:\n", "def read_json(path):\n", "for i in range(10):\n",
    "def quicksort(arr):\n", "def is_prime(n):\n", "with open('data.txt') as f:\n", "def merge(a, b):\n",
    "if __name__ == '__main__':\n", "import re\n\npattern = ", "def binary_search(items, target):\n",
)
STOPS = ("\n\n", "return", ")", ":")
# Each is refused by SGLang's SamplingParams.verify (test_load_mix.py checks that on the CPU).
INVALID_PARAMS = (
    {"temperature": -1.0}, {"top_p": 0.0}, {"top_p": 1.5}, {"top_k": 0}, {"top_k": -5}, {"min_p": 1.5},
    {"frequency_penalty": 3.0}, {"repetition_penalty": 0.0},
)
# No min_p: with --enable-deterministic-inference (which the greedy-vs-no-spec comparison needs) SGLang 0.5.17
# gives every request a sampling seed (42 by default), and its torch sampler then asserts on any batch with
# min_p > 0 in the target's prefill sample, killing the scheduler (stock SGLang, with or without speculation;
# measured on an H200, 2026-11-26). Our verify path's min_p is covered by tests/test_sampling_lossless.py.
SAMPLED = {"temperature": 0.7, "top_p": 0.9, "top_k": 50}
ENDPOINTS = {"generate": "/generate", "completion": "/v1/completions", "chat": "/v1/chat/completions"}
LOG_PROBLEMS = re.compile(
    r"Traceback \(most recent call last\)|Error in request|Internal server error|memory leak detected"
    r"|Scheduler hit an exception|KV double free|use-after-free|Health check failed"
)


def reserved_tokens(steps: int, topk: int, draft_tokens: int) -> int:
    """Output slots SGLang 0.5.17 reserves per request under EAGLE (``compute_num_reserved_tokens``)."""
    return max(topk * steps, draft_tokens)


def near_limit_len(reserved: int) -> int:
    """The longest prompt that fits with ``NEAR_LIMIT_NEW_TOKENS`` new tokens on a server reserving ``reserved``."""
    return CONTEXT_LEN - reserved - NEAR_LIMIT_NEW_TOKENS


NEAR_LIMIT_LEN = near_limit_len(reserved_tokens(*SPEC_TREE))
# --speculative-adaptive with SGLang's default brackets: it reserves max(topk * initial steps 3, widest candidate's
# draft tokens 7 + 1) = 8 (compute_num_reserved_tokens)
ADAPTIVE_RESERVED = 8
# the load test's held-steps-0 server (--speculative-num-steps 1 under these brackets): it reserves max(topk 1 x
# initial steps 1, widest candidate's steps 3 + 1) = 4
NONSPEC_BRACKETS = {"1": {"candidate_steps": [0]}, "8": {"candidate_steps": [1]}, "24": {"candidate_steps": [0]},
                    "48": {"candidate_steps": [3]}}
NONSPEC_RESERVED = 4


def near_limit_ids(length: int, variant: int) -> list[int]:
    """A fixed random token-id prompt of ``length`` ids (none of them special)."""
    return random.Random(variant).choices(range(10, 2000), k=length)


@dataclass(frozen=True)
class LoadRequest:
    idx: int
    kind: str  # a KIND_WEIGHTS key
    endpoint: str
    body: dict = field(repr=False)
    expect: str = "ok"  # "ok": completes; "4xx": refused; "cancelled": aborted or completed
    disconnect_after: int = 0  # stream chunks the client reads before dropping the connection
    abort_after_s: float = 0.0  # delay before POST /abort_request {"rid": ...}
    compare: bool = False  # greedy /generate without stop strings: compared with no-spec

    @property
    def stream(self) -> bool:
        return bool(self.body.get("stream"))

    @property
    def max_tokens(self) -> int:
        if self.endpoint == "/generate":
            return self.body["sampling_params"]["max_new_tokens"]
        return self.body["max_tokens"]

    @property
    def has_stop(self) -> bool:
        params = self.body.get("sampling_params", self.body)
        return params.get("stop") is not None


def _body(endpoint: str, prompt, params: dict, stream: bool) -> dict:
    """A request body for ``endpoint``; ``prompt`` is text or (for /generate) a list of token ids."""
    if endpoint == "/generate":
        key = "input_ids" if isinstance(prompt, list) else "text"
        params = {("max_new_tokens" if k == "max_tokens" else k): v for k, v in params.items()}
        return {key: prompt, "sampling_params": params, "stream": stream}
    body = {"model": "default", **params, "stream": stream}
    if stream:
        body["stream_options"] = {"include_usage": True}
    if endpoint == "/v1/chat/completions":
        return {**body, "messages": [{"role": "user", "content": prompt}]}
    return {**body, "prompt": prompt}


def _served(rng: random.Random, idx: int, kind: str, limit_len: int) -> LoadRequest:
    """A request that must complete: greedy or sampled, streamed or not, maybe a stop string or at the limit."""
    endpoint, greedy, stream = ENDPOINTS[kind], rng.random() < 0.6, rng.random() < 0.3
    at_limit = endpoint == "/generate" and rng.random() < 0.08
    prompt = near_limit_ids(limit_len, rng.randrange(3)) if at_limit else rng.choice(CODE_PROMPTS)
    params = {"max_tokens": NEAR_LIMIT_NEW_TOKENS if at_limit else rng.choice(MAX_TOKENS), "ignore_eos": True}
    if greedy:
        params["temperature"] = 0
    else:
        params.update(SAMPLED)
        params["sampling_seed" if endpoint == "/generate" else "seed"] = idx
    if not at_limit and rng.random() < 0.15:
        params["stop"] = [rng.choice(STOPS)]
    compare = endpoint == "/generate" and greedy and "stop" not in params
    return LoadRequest(idx, kind, endpoint, _body(endpoint, prompt, params, stream), compare=compare)


def _invalid(rng: random.Random, idx: int, limit_len: int) -> LoadRequest:
    """Bad sampling parameters on any endpoint, a negative length, or a prompt past the context limit."""
    endpoint = rng.choice(list(ENDPOINTS.values()))
    params, prompt = {"max_tokens": 16, "temperature": 0.7}, rng.choice(CODE_PROMPTS)  # T=0 would reset top_k
    case = rng.randrange(len(INVALID_PARAMS) + 3)
    if case < len(INVALID_PARAMS):
        params.update(INVALID_PARAMS[case])
    else:
        endpoint = "/generate"
        if case == len(INVALID_PARAMS):
            params["max_tokens"] = -1
        else:  # one token over the total limit (input + reserved + new), or an input as long as the context
            length = limit_len + 1 if case == len(INVALID_PARAMS) + 1 else CONTEXT_LEN
            prompt, params["max_tokens"] = near_limit_ids(length, 0), NEAR_LIMIT_NEW_TOKENS
    return LoadRequest(idx, "invalid", endpoint, _body(endpoint, prompt, params, False), expect="4xx")


def build_mix(n: int = 1000, seed: int = 0, reserved: int = reserved_tokens(*SPEC_TREE)) -> list[LoadRequest]:
    """``n`` requests, the same for a given ``seed``, for a server that reserves ``reserved`` output slots per
    request (its prompts at and one past the context limit)."""
    rng = random.Random(seed)
    limit_len = near_limit_len(reserved)
    mix = []
    for idx in range(n):
        kind = rng.choices(list(KIND_WEIGHTS), weights=list(KIND_WEIGHTS.values()))[0]
        if kind in ENDPOINTS:
            mix.append(_served(rng, idx, kind, limit_len))
        elif kind == "invalid":
            mix.append(_invalid(rng, idx, limit_len))
        else:
            endpoint = "/generate" if kind == "abort" else rng.choice(list(ENDPOINTS.values()))
            params = {"max_tokens": LONG, "ignore_eos": True, "temperature": rng.choice((0, 0.7))}
            body = _body(endpoint, rng.choice(CODE_PROMPTS), params, stream=kind == "disconnect" or rng.random() < 0.5)
            mix.append(LoadRequest(idx, kind, endpoint, body, expect="cancelled",
                                   disconnect_after=rng.randint(1, 8) if kind == "disconnect" else 0,
                                   abort_after_s=rng.uniform(0.0, 0.3) if kind == "abort" else 0.0))
    return mix


def new_outcome() -> dict:
    """What the client records for one request."""
    return {"status": None, "error": None, "body": None, "stream_error": None, "done": False, "disconnected": False,
            "finish": None, "completion_tokens": None, "output_ids": None, "abort_status": None}


def apply_payload(out: dict, endpoint: str, payload: dict) -> None:
    """Fold one response body or stream chunk into ``out``: finish reason, completion tokens, output ids."""
    if "error" in payload:
        out["stream_error"] = json.dumps(payload["error"])[:300]
    elif endpoint == "/generate":
        meta = payload.get("meta_info", {})
        if meta.get("finish_reason"):
            out["finish"] = meta["finish_reason"]["type"]
        if "completion_tokens" in meta:
            out["completion_tokens"] = meta["completion_tokens"]
        if "output_ids" in payload:
            out["output_ids"] = payload["output_ids"]
    else:
        for choice in payload.get("choices") or ():
            if choice.get("finish_reason"):
                out["finish"] = choice["finish_reason"]
        if payload.get("usage"):
            out["completion_tokens"] = payload["usage"]["completion_tokens"]


def problem(req: LoadRequest, out: dict) -> str | None:
    """Why ``out`` fails ``req``'s expectation, or None."""
    if out["error"]:
        return f"client error: {out['error']}"
    if out["status"] >= 500 or out["abort_status"] not in (None, 200):
        return f"HTTP {out['status']} (abort: {out['abort_status']}): {out['body']}"
    if req.expect == "4xx":
        return None if 400 <= out["status"] < 500 else f"expected a 4xx, got HTTP {out['status']}"
    if out["status"] != 200:
        return f"HTTP {out['status']}: {out['body']}"
    if out["stream_error"]:
        return f"error in the stream: {out['stream_error']}"
    if req.expect == "cancelled":
        ended = out["disconnected"] or out["finish"] in ("abort", "length", "stop")
        return None if ended else f"finish {out['finish']!r}"
    if req.stream and not out["done"]:
        return "stream ended without [DONE]"
    tokens, finish = out["completion_tokens"], out["finish"]
    if req.has_stop:
        ok = finish == "stop" and tokens <= req.max_tokens or finish == "length" and tokens == req.max_tokens
    else:
        ok = finish == "length" and tokens == req.max_tokens
    return None if ok else f"finish {finish!r} after {tokens} of {req.max_tokens} tokens"


def summarize(mix: list[LoadRequest], outcomes: list[dict]) -> dict:
    """Counts per kind and HTTP status, and the failed expectations (the first 50, as readable lines)."""
    problems, by_kind = [], Counter(r.kind for r in mix)
    for req, out in zip(mix, outcomes, strict=True):
        why = problem(req, out)
        if why:
            problems.append(f"#{req.idx} {req.kind} {req.endpoint}{' stream' if req.stream else ''}: {why}")
    return {
        "requests": len(mix),
        "by_kind": dict(sorted(by_kind.items())),
        "status": dict(sorted(Counter(str(o["status"]) for o in outcomes).items())),
        "disconnected": sum(o["disconnected"] for o in outcomes),
        "aborted": sum(o["finish"] == "abort" for o in outcomes),
        "problem_count": len(problems),
        "problems": problems[:50],
    }


def reference_key(req: LoadRequest) -> str:
    """What a greedy /generate answer depends on: the prompt and the sampling parameters."""
    return json.dumps({k: v for k, v in req.body.items() if k != "stream"}, sort_keys=True)


def reference_body(req: LoadRequest) -> dict:
    """``req`` for the no-spec server: not streamed, with the ``TOP_LOGPROBS`` best log-probs per position."""
    return {**json.loads(reference_key(req)), "return_logprob": True, "top_logprobs_num": TOP_LOGPROBS}


def greedy_verdicts(mix: list[LoadRequest], outcomes: list[dict], reference: dict[str, dict]) -> dict:
    """Tie-aware comparison of every completed greedy /generate answer with the no-spec ``reference``
    (``reference_key`` -> the no-spec /generate response)."""
    counts, bugs = Counter(identical=0, tie=0, bug=0), []
    for req, out in zip(mix, outcomes, strict=True):
        if req.compare and out["finish"] == "length":
            ref = reference[reference_key(req)]
            verdict = tie_aware_compare(out["output_ids"], ref["output_ids"], top_logprobs(ref["meta_info"]))
            counts[verdict.kind] += 1
            if verdict.kind == "bug":
                bugs.append({"idx": req.idx, "position": verdict.index, "margin": verdict.margin, "rank": verdict.rank})
    return {"counts": dict(counts), "bugs": bugs}


def growth_problems(first: dict[str, float], second: dict[str, float], tolerance: dict[str, float]) -> list[str]:
    """Each measure (MiB) that grew from ``first`` to ``second`` by more than its tolerance."""
    return [f"{k} grew {second[k] - first[k]:.0f} MiB ({first[k]:.0f} -> {second[k]:.0f}; tolerance {tolerance[k]} MiB)"
            for k in tolerance if second[k] - first[k] > tolerance[k]]


def log_problems(log: str) -> list[str]:
    """Server log lines that mean an exception, a leak or an unhealthy server."""
    return [line.strip()[:300] for line in log.splitlines() if LOG_PROBLEMS.search(line)]
