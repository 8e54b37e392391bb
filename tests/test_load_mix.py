"""CPU checks of the load/fault test's request mix and pass criteria (tests/load_mix.py)."""

import json
from collections import Counter

import pytest
from sglang.srt.sampling.sampling_params import SamplingParams

from tests import load_mix
from tests.load_mix import (
    ADAPTIVE_RESERVED,
    CONTEXT_LEN,
    INVALID_PARAMS,
    NEAR_LIMIT_LEN,
    NONSPEC_BRACKETS,
    NONSPEC_RESERVED,
    SPEC_TREE,
    LoadRequest,
    apply_payload,
    build_mix,
    greedy_verdicts,
    growth_problems,
    log_problems,
    near_limit_len,
    new_outcome,
    problem,
    reference_body,
    reference_key,
    reserved_tokens,
    summarize,
)
from tests.lossless import TOP_LOGPROBS
from tests.tiny_models import TRAINED_PAIR

MIX = build_mix()


def _prompt_len(req: LoadRequest) -> int | None:
    return len(req.body["input_ids"]) if "input_ids" in req.body else None


def test_mix_is_deterministic_and_covers_every_case():
    assert [(r.kind, r.endpoint, r.body) for r in MIX] == [(r.kind, r.endpoint, r.body) for r in build_mix()]
    assert [r.body for r in build_mix(seed=1)] != [r.body for r in MIX]
    assert len(MIX) == 1000
    kinds = Counter(r.kind for r in MIX)
    assert set(kinds) == set(load_mix.KIND_WEIGHTS) and min(kinds.values()) >= 50, kinds
    served = [r for r in MIX if r.expect == "ok"]
    assert {(r.endpoint, r.stream) for r in served} == {(e, s) for e in load_mix.ENDPOINTS.values() for s in (0, 1)}
    temperatures = Counter((r.endpoint, (r.body.get("sampling_params") or r.body)["temperature"] == 0) for r in served)
    assert len(temperatures) == 6, temperatures  # greedy and sampled on every endpoint
    assert {1, 256} <= {r.max_tokens for r in served}
    assert sum(r.has_stop for r in served) >= 50
    assert sum(_prompt_len(r) is not None for r in served) >= 10
    assert {r.endpoint for r in MIX if r.kind == "disconnect"} == set(load_mix.ENDPOINTS.values())
    assert all(r.stream and r.disconnect_after >= 1 for r in MIX if r.kind == "disconnect")
    assert {r.stream for r in MIX if r.kind == "abort"} == {False, True}
    assert all(r.abort_after_s > 0 or r.kind != "abort" for r in MIX)
    assert all(not r.stream for r in MIX if r.expect == "4xx")  # a streamed refusal would be a 200
    assert sum(r.compare for r in MIX) >= 100


def test_reserved_tokens_match_sglang(eagle_triton_args, tmp_path):
    from sglang.srt.managers.utils import compute_num_reserved_tokens

    steps, topk, n = SPEC_TREE
    args = eagle_triton_args([
        "--model-path", str(TRAINED_PAIR / "target"), "--speculative-algorithm", "EAGLE_TRITON",
        "--speculative-draft-model-path", str(TRAINED_PAIR / "eagle3"), "--speculative-num-steps", str(steps),
        "--speculative-eagle-topk", str(topk), "--speculative-num-draft-tokens", str(n),
    ])
    assert compute_num_reserved_tokens(args.record) == reserved_tokens(*SPEC_TREE)
    adaptive = eagle_triton_args([
        "--model-path", str(TRAINED_PAIR / "target"), "--speculative-algorithm", "EAGLE_TRITON",
        "--speculative-draft-model-path", str(TRAINED_PAIR / "eagle3"), "--speculative-adaptive"])
    assert compute_num_reserved_tokens(adaptive.record) == ADAPTIVE_RESERVED
    brackets = tmp_path / "brackets.json"
    brackets.write_text(json.dumps(NONSPEC_BRACKETS))
    nonspec = eagle_triton_args([
        "--model-path", str(TRAINED_PAIR / "target"), "--speculative-algorithm", "EAGLE_TRITON",
        "--speculative-draft-model-path", str(TRAINED_PAIR / "eagle3"), "--speculative-adaptive",
        "--speculative-adaptive-config", str(brackets), "--speculative-num-steps", "1"])
    assert compute_num_reserved_tokens(nonspec.record) == NONSPEC_RESERVED


def test_the_adaptive_mix_is_built_for_its_reservation():
    mix = build_mix(300, reserved=ADAPTIVE_RESERVED)
    lengths = {_prompt_len(r) for r in mix if _prompt_len(r) is not None and r.expect == "ok"}
    assert lengths == {near_limit_len(ADAPTIVE_RESERVED)} and near_limit_len(ADAPTIVE_RESERVED) > NEAR_LIMIT_LEN


def _fits(req: LoadRequest) -> bool:
    """SGLang 0.5.17's TokenizerManager length rule for a token-id prompt on the server under test."""
    used = _prompt_len(req) + reserved_tokens(*SPEC_TREE)
    return used < CONTEXT_LEN and used + req.max_tokens <= CONTEXT_LEN


def test_prompts_at_the_context_limit_fit_exactly_and_the_invalid_ones_do_not():
    at_limit = [r for r in MIX if _prompt_len(r) is not None and r.expect == "ok"]
    assert at_limit and all(_fits(r) for r in at_limit)
    assert all(_prompt_len(r) + reserved_tokens(*SPEC_TREE) + r.max_tokens == CONTEXT_LEN for r in at_limit)
    too_long = [r for r in MIX if _prompt_len(r) is not None and r.expect == "4xx"]
    assert {_prompt_len(r) for r in too_long} == {CONTEXT_LEN, _prompt_len(at_limit[0]) + 1}
    assert not any(_fits(r) for r in too_long)


def test_sampling_params_are_valid_or_refused_as_the_mix_expects():
    for params in INVALID_PARAMS:
        with pytest.raises(ValueError):
            SamplingParams(**params).verify(2048)
    with pytest.raises(ValueError):
        SamplingParams(max_new_tokens=-1).verify(2048)
    for req in MIX:
        if req.endpoint == "/generate" and _prompt_len(req) is None:
            params = {k: v for k, v in req.body["sampling_params"].items() if k != "sampling_seed"}
            if req.expect == "4xx":
                with pytest.raises(ValueError):
                    SamplingParams(**params).verify(2048)
            else:
                SamplingParams(**params).verify(2048)


def test_payloads_of_every_endpoint_fold_into_the_outcome():
    out = new_outcome()
    apply_payload(out, "/generate", {"output_ids": [5, 6], "meta_info": {"finish_reason": None,
                                                                        "completion_tokens": 2}})
    assert (out["finish"], out["completion_tokens"], out["output_ids"]) == (None, 2, [5, 6])
    length = {"type": "length", "length": 3}
    apply_payload(out, "/generate", {"output_ids": [5, 6, 7], "meta_info": {"finish_reason": length,
                                                                           "completion_tokens": 3}})
    assert (out["finish"], out["completion_tokens"], out["output_ids"]) == ("length", 3, [5, 6, 7])
    out = new_outcome()
    apply_payload(out, "/v1/chat/completions", {"choices": [{"delta": {"content": "x"}, "finish_reason": None}]})
    apply_payload(out, "/v1/chat/completions", {"choices": [{"delta": {}, "finish_reason": "stop"}]})
    apply_payload(out, "/v1/chat/completions", {"choices": [], "usage": {"completion_tokens": 4}})
    assert (out["finish"], out["completion_tokens"], out["stream_error"]) == ("stop", 4, None)
    apply_payload(out, "/v1/completions", {"error": {"message": "bad", "code": 400}})
    assert "bad" in out["stream_error"]


def _req(kind="generate", endpoint="/generate", max_tokens=8, stop=None, stream=False, expect="ok") -> LoadRequest:
    params = {"max_new_tokens": max_tokens, "temperature": 0, "ignore_eos": True, **({"stop": stop} if stop else {})}
    return LoadRequest(0, kind, endpoint, {"text": "x", "sampling_params": params, "stream": stream}, expect=expect)


def _out(status=200, **kw) -> dict:
    return {**new_outcome(), "status": status, "done": True, **kw}


def test_problems_flag_exactly_the_failed_expectations():
    assert problem(_req(), _out(finish="length", completion_tokens=8)) is None
    assert "finish" in problem(_req(), _out(finish="length", completion_tokens=7))
    assert "finish" in problem(_req(), _out(finish="stop", completion_tokens=3))
    assert problem(_req(stop=["\n"]), _out(finish="stop", completion_tokens=3)) is None
    assert "HTTP 500" in problem(_req(), _out(500, body="boom"))
    assert "client error" in problem(_req(), _out(error="ClientPayloadError: ..."))
    assert "[DONE]" in problem(_req(stream=True), _out(done=False, finish="length", completion_tokens=8))
    assert "stream" in problem(_req(stream=True), _out(stream_error="{}", finish="length", completion_tokens=8))
    assert problem(_req(expect="4xx"), _out(400)) is None
    assert "4xx" in problem(_req(expect="4xx"), _out(200))
    assert "HTTP 503" in problem(_req(expect="4xx"), _out(503))
    assert problem(_req("abort", expect="cancelled"), _out(finish="abort")) is None
    assert problem(_req("abort", expect="cancelled"), _out(finish="length")) is None
    assert "abort: 500" in problem(_req("abort", expect="cancelled"), _out(finish="abort", abort_status=500))
    assert problem(_req("disconnect", stream=True, expect="cancelled"), _out(disconnected=True, done=False)) is None


def test_summary_counts_and_lists_problems():
    mix = [_req(), _req(expect="4xx"), _req("abort", expect="cancelled")]
    outs = [_out(finish="length", completion_tokens=8), _out(422), _out(finish="abort")]
    s = summarize(mix, outs)
    assert (s["problem_count"], s["status"], s["aborted"]) == (0, {"200": 2, "422": 1}, 1)
    assert s["by_kind"] == {"abort": 1, "generate": 2}
    s = summarize(mix, [_out(500), *outs[1:]])
    assert s["problem_count"] == 1 and s["problems"][0].startswith("#0 generate /generate")


def test_greedy_answers_are_compared_tie_aware_with_no_spec():
    body = {"text": "x", "sampling_params": {"max_new_tokens": 3}, "stream": True}
    req = LoadRequest(3, "generate", "/generate", body, compare=True)
    assert reference_body(req) == {"text": "x", "sampling_params": {"max_new_tokens": 3}, "return_logprob": True,
                                   "top_logprobs_num": TOP_LOGPROBS}
    top = [[[-0.1, 7], [-3.0, 8]], [[-0.5, 9], [-0.6, 4]], [[-0.2, 1], [-4.0, 2]]]  # near-tie at position 1
    reference = {reference_key(req): {"output_ids": [7, 9, 1], "meta_info": {"output_top_logprobs": top}}}
    outs = [_out(finish="length", output_ids=ids) for ids in ([7, 9, 1], [7, 4, 0], [8, 9, 1])]
    verdicts = greedy_verdicts([req] * 3, outs, reference)
    assert verdicts["counts"] == {"identical": 1, "tie": 1, "bug": 1}
    assert verdicts["bugs"] == [{"idx": 3, "position": 0, "margin": pytest.approx(2.9), "rank": 1}]
    assert greedy_verdicts([req], [_out(finish="abort", output_ids=[0])], reference)["counts"]["bug"] == 0


def test_memory_growth_and_log_problems():
    tolerance = {"server_rss": 256, "gpu_used": 128}
    first = {"server_rss": 4000, "gpu_used": 9000}
    assert growth_problems(first, {"server_rss": 4200, "gpu_used": 9100}, tolerance) == []
    grown = growth_problems(first, {"server_rss": 4300, "gpu_used": 9000}, tolerance)
    assert len(grown) == 1 and grown[0].startswith("server_rss grew 300 MiB")
    log = "\n".join([
        "[2026-11-26 10:00:00] [http_server] Error: top_p must be in (0, 1], got 1.5.",
        "[2026-11-26 10:00:01] [http_server] Client disconnected: ...",
        "[2026-11-26 10:00:02 TP0] Traceback (most recent call last):",
        "[2026-11-26 10:00:03 TP0] pool memory leak detected! ...",
    ])
    assert [p.split("] ", 1)[1][:9] for p in log_problems(log)] == ["Traceback", "pool memo"]
