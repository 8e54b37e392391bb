"""Registration and server-arg handling against the real installed SGLang (no mocks of SGLang).

On a machine without CUDA, SGLang's arg parsing needs ``--device cpu``; the happy-path tests then
widen our own ``SUPPORTED_DEVICES`` for the duration of the test (the device check itself is tested
separately).
"""

import json
import os
import pickle
import re
from importlib.metadata import entry_points
from types import SimpleNamespace

import pytest
import torch
from sglang.srt.plugins import load_plugins
from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

from sgl_eagle_triton import config, plugin
from sgl_eagle_triton.config import EagleTritonConfigError
from sgl_eagle_triton.glue.args import Overlay
from sgl_eagle_triton.glue.hooks import HOOKS
from tests.sglang_compat import alloc_reserve, check_rows, published, req_to_token_extra, resolved
from tests.tiny_models import TRAINED_PAIR, write_random_eagle1_pair

TARGET, EAGLE3_DRAFT = str(TRAINED_PAIR / "target"), str(TRAINED_PAIR / "eagle3")
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


@pytest.fixture(autouse=True)
def _loaded(monkeypatch):
    load_plugins()
    monkeypatch.delenv(config.DRAFT_KIND_ENV, raising=False)
    monkeypatch.delenv(config.ADAPTIVE_TREES_ENV, raising=False)
    monkeypatch.setattr(config, "SUPPORTED_DEVICES", ("cuda", "cpu"))


@pytest.fixture(scope="module")
def eagle1_pair(tmp_path_factory):
    return write_random_eagle1_pair(tmp_path_factory.mktemp("eagle1"))


def _kv_dtype_choices() -> list[str]:
    import argparse

    from sglang.srt.server_args import ServerArgs

    parser = argparse.ArgumentParser()
    ServerArgs.add_cli_args(parser)
    return next(a.choices for a in parser._actions if "--kv-cache-dtype" in a.option_strings)


# a KV cache dtype SGLang offers that the draft attention does not read (0.5.23 dropped fp4_e2m1)
UNREAD_KV_DTYPE = next(d for d in ("fp4_e2m1", "mxfp8", "nvfp4") if d in _kv_dtype_choices())


def _args(*extra, draft=EAGLE3_DRAFT, target=TARGET):
    return resolved(
        ["--model-path", target, "--device", DEVICE, "--speculative-algorithm", "EAGLE_TRITON"]
        + (["--speculative-draft-model-path", draft] if draft else [])
        + list(extra)
    )


def test_entry_point_declared():
    eps = {ep.name: ep.value for ep in entry_points(group="sglang.srt.plugins")}
    assert eps.get("eagle_triton") == "sgl_eagle_triton.plugin:register"


def test_registration_is_idempotent_and_conforms():
    from sgl_eagle_triton.plugin import EagleTritonSpecAlgo, register

    register()
    register()
    algo = SpeculativeAlgorithm.from_string("eagle_triton")
    assert isinstance(algo, EagleTritonSpecAlgo)
    assert algo is SpeculativeAlgorithm.from_string("EAGLE_TRITON")
    assert algo.supports_overlap


def test_req_to_token_rows_hold_the_draft_reservation():
    """SGLang 0.5.17 sizes rows context + 4 + draft tokens at page size 1 while reserving
    2 * max(topk * steps, draft tokens) per decode (here 12 < 40): near the context limit the reservation
    spilled into the next row and leaked. Our hook widens EAGLE_TRITON's rows, and only EAGLE_TRITON's."""
    ours = _args()
    assert ours.page_size == 1 and alloc_reserve(ours.record) == 40
    assert req_to_token_extra(ours.record) == 40  # stock: 4 + 8
    stock = resolved(["--model-path", TARGET, "--device", DEVICE, "--speculative-algorithm", "EAGLE3",
                      "--speculative-draft-model-path", EAGLE3_DRAFT])
    assert req_to_token_extra(stock.record) == 4 + stock.speculative_num_draft_tokens


@pytest.mark.parametrize("tree", ["5,4,8", "7,1,8", "3,4,16", "3,1,4", "8,8,64"])
def test_req_to_token_rows_fit_every_tree_shape(tree):
    """A request decodes with a committed length up to the context; its reservation must stay in its row."""
    steps, topk, n = tree.split(",")
    sa = _args("--speculative-num-steps", steps, "--speculative-eagle-topk", topk, "--speculative-num-draft-tokens", n)
    context = 1024
    row = context + req_to_token_extra(sa.record)
    assert context + alloc_reserve(sa.record) <= row
    check_rows(row, context, sa)
    stock_row = context + 4 + sa.speculative_num_draft_tokens
    if alloc_reserve(sa.record) > stock_row - context:  # all but 3,1,4 (8 <= 4 + 4)
        with pytest.raises(RuntimeError, match="req_to_token rows hold"):
            check_rows(stock_row, context, sa)


@pytest.mark.parametrize("kind", [config.EAGLE3, config.EAGLE])
def test_predicates_follow_draft_kind(monkeypatch, kind):
    monkeypatch.setenv(config.DRAFT_KIND_ENV, kind)
    algo = SpeculativeAlgorithm.from_string("EAGLE_TRITON")
    base = SpeculativeAlgorithm.EAGLE3 if kind == config.EAGLE3 else SpeculativeAlgorithm.EAGLE
    assert algo.base is base
    assert algo.is_eagle() and algo.is_speculative() and algo.is_some()
    assert algo.is_eagle3() == (kind == config.EAGLE3)
    assert algo.need_topk() and algo.carries_draft_hidden_states()
    assert algo.supports_grammar_overlap() and algo.has_draft_kv()
    assert not (algo.is_standalone() or algo.is_ngram() or algo.is_dflash_family() or algo.is_none())
    assert algo.get_num_tokens_per_req_for_target_verify(16, False) == 16
    # Every predicate of the builtin enum answers without AttributeError.
    for name in vars(SpeculativeAlgorithm):
        if name.startswith(("is_", "supports_")):
            getattr(algo, name)()


def test_eagle3_defaults_like_sglang():
    sa = _args()
    assert sa.speculative_algorithm == "EAGLE_TRITON"
    assert (sa.speculative_num_steps, sa.speculative_eagle_topk, sa.speculative_num_draft_tokens) == (5, 4, 8)
    assert sa.max_running_requests == 48
    assert SpeculativeAlgorithm.from_string(sa.speculative_algorithm).is_eagle3()


def test_eagle1_draft_is_detected(eagle1_pair):
    target, draft = eagle1_pair
    sa = _args("--speculative-num-steps", "3", "--speculative-eagle-topk", "2",
               "--speculative-num-draft-tokens", "6", target=str(target), draft=str(draft))
    assert (sa.speculative_num_steps, sa.speculative_eagle_topk, sa.speculative_num_draft_tokens) == (3, 2, 6)
    algo = SpeculativeAlgorithm.from_string("EAGLE_TRITON")
    assert algo.is_eagle() and not algo.is_eagle3()


@pytest.mark.parametrize("page", [16, 64])
@pytest.mark.parametrize("tree", ["3,1,4", "5,4,8"])
def test_paged_kv_cache_accepted(page, tree):
    """Page sizes > 1, topk 1 and (on a backend SGLang runs it on) topk > 1: the rows hold the page-aligned
    reservation SGLang makes for them."""
    steps, topk, n = tree.split(",")
    sa = _args("--page-size", str(page), "--attention-backend", "triton", "--speculative-num-steps", steps,
               "--speculative-eagle-topk", topk, "--speculative-num-draft-tokens", n)
    assert sa.page_size == page and sa.speculative_eagle_topk == int(topk)
    context = 1024
    row = context + req_to_token_extra(sa.record)
    assert context + alloc_reserve(sa.record) <= row
    check_rows(row, context, sa)


def test_topk1_forces_chain_length():
    sa = _args("--speculative-num-steps", "4", "--speculative-eagle-topk", "1", "--speculative-num-draft-tokens", "9")
    assert sa.speculative_num_draft_tokens == 5


def test_topk_defaults_to_one_with_steps_only():
    sa = _args("--speculative-num-steps", "3")
    assert (sa.speculative_eagle_topk, sa.speculative_num_draft_tokens) == (1, 4)


def test_draft_kind_falls_back_to_published_spec(monkeypatch):
    from sglang.srt import runtime_context

    class _Spec:
        speculative_draft_model_path = EAGLE3_DRAFT

    monkeypatch.setattr(runtime_context, "get_spec", lambda: _Spec())
    assert config.current_draft_kind() == config.EAGLE3


def _draft_with(tmp_path, **changes):
    """A copy of the trained EAGLE-3 draft's config with ``changes`` (enough for server-arg handling)."""
    cfg = json.loads((TRAINED_PAIR / "eagle3" / "config.json").read_text())
    cfg.update(changes)
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    return str(tmp_path)


def _unsupported_draft(tmp_path):
    return _draft_with(tmp_path, architectures=["Qwen3ForCausalLMEagle3"])


@pytest.mark.parametrize(
    "extra, message",
    [
        (["--speculative-use-rejection-sampling", "--speculative-num-steps", "3",
          "--speculative-eagle-topk", "1"], "--speculative-use-rejection-sampling"),
        (["--page-size", "16", "--attention-backend", "torch_native", "--speculative-num-steps", "3",
          "--speculative-eagle-topk", "4", "--speculative-num-draft-tokens", "8"],
         "--speculative-eagle-topk 4 with --page-size 16 on the torch_native attention backend"),
        (["--speculative-num-steps", "3", "--speculative-eagle-topk", "4"], "without --speculative-num-draft-tokens"),
        (["--speculative-eagle-topk", "4"], "without --speculative-num-steps"),
        (["--speculative-num-steps", "2", "--speculative-eagle-topk", "2", "--speculative-num-draft-tokens", "9"],
         "--speculative-num-draft-tokens 9"),
        (["--speculative-num-steps", "10", "--speculative-eagle-topk", "10", "--speculative-num-draft-tokens", "200"],
         "min(1 + topk + (steps-1)*topk^2, 128)"),
        (["--speculative-draft-window-size", "64"], "--speculative-draft-window-size"),
        (["--enable-multi-layer-eagle"], "--enable-multi-layer-eagle"),
        (["--enable-unified-memory"], "--enable-unified-memory"),
        (["--speculative-adaptive", "--speculative-num-steps", "3", "--speculative-eagle-topk", "4",
          "--speculative-num-draft-tokens", "8"],
         "without the draft tokens of candidate steps"),
        (["--speculative-adaptive", "--enable-two-batch-overlap"],
         "--speculative-adaptive with enable_two_batch_overlap=True is not supported"),
        (["--enable-dp-attention", "--dp", "2", "--tp", "2"], "--enable-dp-attention"),
        (["--pp-size", "2"], "pipeline parallelism (pp=2)"),
        (["--tp", "2", "--dcp-size", "2"], "context parallelism (--dcp-size 2"),
        (["--enable-lora", "--max-lora-rank", "8", "--lora-target-modules", "q_proj"], "LoRA adapters"),
        (["--enable-fp32-lm-head"], "--enable-fp32-lm-head"),
        (["--dtype", "float32"], "--dtype float32 with a float32 draft"),
        (["--dtype", "float16", "--kv-cache-dtype", "bf16"], "--kv-cache-dtype bf16 with a float16 model"),
        (["--disaggregation-mode", "decode"], "prefill/decode disaggregation"),
    ],
)
def test_refused_at_start(extra, message):
    with pytest.raises(EagleTritonConfigError, match=re.escape(message)):
        _args(*extra)


def test_a_kv_cache_dtype_the_draft_attention_does_not_read_is_refused_at_start():
    """By us, or by SGLang before us (0.5.23's mxfp8 needs a Blackwell GPU): either way the server never starts."""
    with pytest.raises(ValueError, match=re.escape(f"--kv-cache-dtype {UNREAD_KV_DTYPE}")):
        _args("--kv-cache-dtype", UNREAD_KV_DTYPE)
    with pytest.raises(EagleTritonConfigError, match="--kv-cache-dtype fp4_e2m1 yet"):
        config._validate(Overlay(_args().record, kv_cache_dtype="fp4_e2m1"))


def test_tensor_parallelism_beyond_the_gpu_tested_is_an_explicit_trial(monkeypatch, eagle1_pair):
    """EAGLE-3 and EAGLE-1 drafts at --tp 2 and 4 start (GPU-tested); other TP sizes only with
    config.EXPERIMENTAL_TP_ENV=1; --pp > 1 never."""
    monkeypatch.delenv(config.EXPERIMENTAL_TP_ENV, raising=False)
    assert _args("--tp", "2").tp_size == 2 and _args("--tp", "4").tp_size == 4
    target, draft = eagle1_pair
    assert _args("--tp", "2", target=str(target), draft=str(draft)).tp_size == 2
    config._check_tensor_parallel_trial(SimpleNamespace(tp_size=4), config.EAGLE)  # starts
    eagle1_trial = ("--tp 8 or EAGLE-1/2 drafts (LlamaForCausalLMEagle) with --tp 8 yet: built, not yet run end to end "
                    "on GPUs. Use --tp 1, an EAGLE-3 draft at --tp 2 or 4 (EAGLE-1 at --tp 2 or 4)")
    with pytest.raises(EagleTritonConfigError, match=re.escape(eagle1_trial)):
        config._check_tensor_parallel_trial(SimpleNamespace(tp_size=8), config.EAGLE)
    # a size the draft's heads allow but no GPU test ran (the trained pair's 4 heads allow only 1, 2, 4)
    with pytest.raises(EagleTritonConfigError, match=re.escape("--tp 8 yet: built, not yet run end to end on GPUs. "
                                                               "Use --tp 1, an EAGLE-3 draft at --tp 2 or 4")):
        config._check_tensor_parallel_trial(SimpleNamespace(tp_size=8), config.EAGLE3)
    monkeypatch.setenv(config.EXPERIMENTAL_TP_ENV, "1")
    assert _args("--tp", "2", target=str(target), draft=str(draft)).tp_size == 2
    assert _args("--tp", "2").tp_size == 2
    with pytest.raises(EagleTritonConfigError, match=re.escape("--speculative-token-map with --tp 2")):
        _args("--tp", "2", "--speculative-token-map", "map.pt")
    try:
        sa = _args("--tp", "2", "--enable-symm-mem")
    except EagleTritonConfigError as refusal:
        assert "--enable-symm-mem with --tp 2" in str(refusal)
    else:  # SGLang 0.5.20+ turns it off itself on a device without symmetric memory (this CPU) before our check
        assert DEVICE == "cpu" and not sa.enable_symm_mem
    # the trained pair's draft: 4 attention heads, 2 KV heads, 512 MLP columns
    assert _args("--tp", "4").tp_size == 4  # KV heads replicated, two ranks each
    with pytest.raises(EagleTritonConfigError, match=re.escape("--tp 3 with a draft of 4 attention heads")):
        _args("--tp", "3")
    with pytest.raises(EagleTritonConfigError, match=re.escape("--tp 8 with a draft of 4 attention heads")):
        _args("--tp", "8")
    with pytest.raises(EagleTritonConfigError, match=re.escape("pipeline parallelism (pp=2)")):
        _args("--pp-size", "2")


def test_adaptive_runs_as_stock_eagle3s(tmp_path):
    """--speculative-adaptive is not switched off for EAGLE_TRITON (SGLang allows only EAGLE / EAGLE3; our hook
    judges us by EAGLE3's rules): SGLang picks the middle candidate of its default brackets, a chain."""
    sa = _args("--speculative-adaptive")
    assert sa.speculative_adaptive and sa.speculative_algorithm == "EAGLE_TRITON"
    assert (sa.speculative_num_steps, sa.speculative_eagle_topk, sa.speculative_num_draft_tokens) == (3, 1, 4)
    assert sa.max_speculative_num_draft_tokens == 8  # candidates {0, 1, 3, 7}: KV and buffers sized for 7 steps
    cfg = tmp_path / "adaptive.json"
    cfg.write_text(json.dumps({"1": {"candidate_steps": [0, 2, 5]}, "16": {"candidate_steps": [0, 2]}}))
    sa = _args("--speculative-adaptive", "--speculative-adaptive-config", str(cfg), "--speculative-num-steps", "5")
    assert sa.speculative_adaptive and (sa.speculative_num_steps, sa.speculative_num_draft_tokens) == (5, 6)
    cfg.write_text(json.dumps({"1": {"candidate_steps": [0, 200]}}))
    with pytest.raises(EagleTritonConfigError, match="candidate steps 200"):
        _args("--speculative-adaptive", "--speculative-adaptive-config", str(cfg))
    # the initial state is built as a drafting worker, never as steps 0 (its one-node verify attention): refused
    cfg.write_text(json.dumps({"1": {"candidate_steps": [0, 1, 3]}}))
    with pytest.raises(EagleTritonConfigError, match="starting at steps 0"):
        _args("--speculative-adaptive", "--speculative-adaptive-config", str(cfg), "--speculative-num-steps", "0")
    cfg.write_text(json.dumps({"1": {"candidate_steps": [0]}}))
    with pytest.raises(EagleTritonConfigError, match="starting at steps 0"):
        _args("--speculative-adaptive", "--speculative-adaptive-config", str(cfg))


def test_adaptive_tree_candidates_take_their_draft_tokens_from_the_config(tmp_path, monkeypatch):
    """topk > 1 under --speculative-adaptive: every candidate is (steps, topk, draft tokens from
    the config file); the KV reservation and buffers hold the widest (max of steps * topk and draft tokens)."""
    cfg = tmp_path / "adaptive.json"
    trees = {"1": {"candidate_steps": [0, 1, 3, 5]}, "16": {"candidate_steps": [0, 1]}}
    cfg.write_text(json.dumps({**trees, config.ADAPTIVE_DRAFT_TOKENS_KEY: {"1": 2, "3": 8, "5": 32}}))
    flags = ["--speculative-adaptive", "--speculative-adaptive-config", str(cfg), "--speculative-eagle-topk", "8"]
    sa = _args(*flags, "--speculative-num-steps", "3")
    assert (sa.speculative_num_steps, sa.speculative_eagle_topk, sa.speculative_num_draft_tokens) == (3, 8, 8)
    assert sa.max_speculative_num_draft_tokens == 5 * 8  # 5 levels of 8 candidates each get KV slots
    assert [config.adaptive_tree(sa, s) for s in (0, 1, 3, 5)] == [(8, 1), (8, 2), (8, 8), (8, 32)]
    # read once at start: the environment every process of the server inherits carries them (the file may be gone)
    assert json.loads(os.environ[config.ADAPTIVE_TREES_ENV]) == {"0": [8, 1], "1": [8, 2], "3": [8, 8], "5": [8, 32]}
    cfg.rename(tmp_path / "gone.json")
    assert [config.adaptive_tree(pickle.loads(pickle.dumps(sa.record)), s)[1] for s in (1, 3, 5)] == [2, 8, 32]
    (tmp_path / "gone.json").rename(cfg)
    monkeypatch.delenv(config.ADAPTIVE_TREES_ENV)  # a process that did not inherit it (e.g. a Ray actor) reads the file
    assert [config.adaptive_tree(sa.record, s)[1] for s in (1, 3, 5)] == [2, 8, 32]
    assert os.environ[config.ADAPTIVE_TREES_ENV]
    assert _args(*flags, "--speculative-num-steps", "5").speculative_num_draft_tokens == 32
    assert _args("--speculative-adaptive").max_speculative_num_draft_tokens == 8  # chains: SGLang's own sizing
    cfg.write_text(json.dumps({**trees, config.ADAPTIVE_DRAFT_TOKENS_KEY: {"1": 2, "3": 8, "5": 32},
                               config.ADAPTIVE_POLICY_KEY: "cost"}))
    assert config.adaptive_policy(_args(*flags, "--speculative-num-steps", "3")) == "cost"  # rank-aware acceptance

    def refused(message, settings=None, extra=()):
        cfg.write_text(json.dumps({**trees, config.ADAPTIVE_DRAFT_TOKENS_KEY: {"1": 2, "3": 8, "5": 32},
                                   **(settings or {})}))
        with pytest.raises(EagleTritonConfigError, match=re.escape(message)):
            _args(*flags, "--speculative-num-steps", "3", *extra)

    refused("without the draft tokens of candidate steps [5]", {config.ADAPTIVE_DRAFT_TOKENS_KEY: {"1": 2, "3": 8}})
    refused("draft-tokens 1 with steps=3, topk=8 (eagle_triton_draft_tokens of candidate 3)",
            {config.ADAPTIVE_DRAFT_TOKENS_KEY: {"1": 2, "3": 1, "5": 32}})
    refused("--speculative-eagle-topk 8 and --page-size 16 yet", extra=["--page-size", "16"])
    with pytest.raises(EagleTritonConfigError, match=re.escape("--speculative-eagle-topk 32")):
        _args("--speculative-adaptive", "--speculative-adaptive-config", str(cfg), "--speculative-eagle-topk", "32",
              "--speculative-num-steps", "3")
    # candidates narrower than the server's topk ([topk, n]: a chain among trees)
    mixed = {config.ADAPTIVE_DRAFT_TOKENS_KEY: {"1": [1, 2], "3": [1, 4], "5": 32}}
    cfg.write_text(json.dumps({**trees, **mixed}))
    sa = _args(*flags, "--speculative-num-steps", "3")
    assert [config.adaptive_tree(sa, s) for s in (0, 1, 3, 5)] == [
        (8, 1), (1, 2), (1, 4), (8, 32)]
    assert sa.speculative_eagle_topk == 8 and sa.max_speculative_num_draft_tokens == 5 * 8
    refused("the tree entry [9, 4]", {config.ADAPTIVE_DRAFT_TOKENS_KEY: {"1": 2, "3": [9, 4], "5": 32}})
    refused("the tree entry 'four'", {config.ADAPTIVE_DRAFT_TOKENS_KEY: {"1": 2, "3": "four", "5": 32}})
    refused('"eagle_triton_draft_tokens": [2, 8, 32]', {config.ADAPTIVE_DRAFT_TOKENS_KEY: [2, 8, 32]})
    refused("the tree entry [True, 4]", {config.ADAPTIVE_DRAFT_TOKENS_KEY: {"1": 2, "3": [True, 4], "5": 32}})
    refused("--speculative-num-draft-tokens 5 with steps=3, topk=1", {config.ADAPTIVE_DRAFT_TOKENS_KEY: {
        "1": 2, "3": [1, 5], "5": 32}})
    monkeypatch.setenv(config.DRAFT_CHECK_ENV, "/tmp/check")
    refused("SGLANG_EAGLE_TRITON_DRAFT_CHECK with adaptive candidates narrower", mixed, extra=["--disable-cuda-graph"])


def test_shared_logits_buffer_holds_the_widest_adaptive_candidate():
    """SGLang 0.5.17 sizes the target's shared CUDA-graph logits buffer for the initial candidate (3 steps: 4 rows per
    request); the hook widens it to the widest (7 steps: 8), for EAGLE_TRITON adaptive servers only."""
    from sglang.srt.model_executor.model_runner import ModelRunner
    from sglang.srt.plugins.hook_registry import HookRegistry

    def runner(sa, draft=False):
        r = ModelRunner.__new__(ModelRunner)
        r.server_args, r.is_draft_worker = sa.record, draft
        r.decode_num_tokens_per_req = lambda **kwargs: sa.speculative_num_draft_tokens
        return r

    adaptive = _args("--speculative-adaptive")
    with published(adaptive.record):
        assert config.shared_logits_rows(16 * 4, runner(adaptive)) == 16 * 8
        assert config.shared_logits_rows(16 * 4, runner(adaptive, draft=True)) == 16 * 4
    ours = _args()
    with published(ours.record):
        assert config.shared_logits_rows(16 * 8, runner(ours)) == 16 * 8
    hooks = HookRegistry._hooks[HOOKS["shared_logits_rows"].target]
    assert any(hook is config.shared_logits_rows for _, hook, _ in hooks)


def test_adaptive_policy_is_chosen_in_the_config_file(tmp_path, monkeypatch):
    cfg = tmp_path / "adaptive.json"
    cfg.write_text(json.dumps({"eagle_triton_policy": "cost", "1": {"candidate_steps": [0, 1, 3, 7]}}))
    sa = _args("--speculative-adaptive", "--speculative-adaptive-config", str(cfg))
    assert config.adaptive_policy(sa) == "cost" and sa.speculative_num_steps == 3
    assert config.adaptive_policy(_args("--speculative-adaptive")) == "sglang"
    with pytest.raises(EagleTritonConfigError, match="'cost' with --disable-cuda-graph"):
        _args("--speculative-adaptive", "--speculative-adaptive-config", str(cfg), "--disable-cuda-graph")
    # each TP rank times its own cycles: rank 0 decides for all; run on GPUs at --tp 2, a trial at other sizes
    assert config.adaptive_policy(_args("--speculative-adaptive", "--speculative-adaptive-config", str(cfg), "--tp",
                                        "2")) == "cost"
    with pytest.raises(EagleTritonConfigError, match="'cost' with --tp 4 without "
                       "SGLANG_EAGLE_TRITON_EXPERIMENTAL_TP=1 .* at --tp 1 or 2 only"):
        _args("--speculative-adaptive", "--speculative-adaptive-config", str(cfg), "--tp", "4")
    monkeypatch.setenv(config.EXPERIMENTAL_TP_ENV, "1")
    assert config.adaptive_policy(_args("--speculative-adaptive", "--speculative-adaptive-config", str(cfg), "--tp",
                                        "4")) == "cost"
    monkeypatch.delenv(config.EXPERIMENTAL_TP_ENV)
    cfg.write_text(json.dumps({"eagle_triton_policy": "greedy", "1": {"candidate_steps": [0, 1]}}))
    with pytest.raises(EagleTritonConfigError, match="eagle_triton_policy 'greedy'"):
        _args("--speculative-adaptive", "--speculative-adaptive-config", str(cfg))


def test_adaptive_switched_off_by_sglang_is_refused(monkeypatch):
    """Were our hook missing, SGLang would fall back to static speculation with a warning: refuse instead."""
    from sglang.srt.speculative import adaptive_spec_params

    monkeypatch.setattr(adaptive_spec_params, "adaptive_unsupported_reason", lambda sa: "no hook")
    monkeypatch.setattr(config, "stock_adaptive_reason", lambda sa, original=None: None)
    with pytest.raises(EagleTritonConfigError, match="SGLang switched it off"):
        _args("--speculative-adaptive")


def test_unsupported_draft_architecture(tmp_path):
    with pytest.raises(EagleTritonConfigError, match="Qwen3ForCausalLMEagle3"):
        _args(draft=_unsupported_draft(tmp_path))


@pytest.mark.parametrize(
    "changes, message",
    [
        (dict(num_hidden_layers=2), "a draft with 2 decoder layers"),
        (dict(hidden_act="gelu"), "the draft activation 'gelu'"),
        (dict(mlp_bias=True), "a draft MLP with biases"),
        (dict(partial_rotary_factor=0.5), "partial rotary embeddings"),
        (dict(rope_scaling={"rope_type": "default", "mrope_section": [16, 24, 24]}), "multimodal RoPE"),
        (dict(norm_output=True), "drafts with norm_output"),
        (dict(head_dim=24), "draft head_dim 24"),
        (dict(head_dim=32), "draft head_dim 32"),
        (dict(rope_is_neox_style=False), "non-neox RoPE drafts"),
        (dict(torch_dtype="float32", dtype="float32"), "serving a bfloat16 target with a float16 draft"),
    ],
)
def test_unsupported_draft_config_refused(tmp_path, changes, message):
    with pytest.raises(EagleTritonConfigError, match=re.escape(message)):
        _args(draft=_draft_with(tmp_path, **changes))


@pytest.mark.parametrize("extra, dtype", [(["--dtype", "float16"], "float16"), (["--dtype", "half"], "half"),
                                          (["--dtype", "bfloat16"], "bfloat16"), ([], "auto")])
def test_fp16_and_bf16_serving_accepted(extra, dtype):
    assert _args(*extra).dtype == dtype


@pytest.mark.parametrize("kv", ["fp8_e4m3", "fp8_e5m2", "bf16", "auto"])
def test_fp8_kv_cache_accepted(kv):
    assert _args("--kv-cache-dtype", kv).kv_cache_dtype == kv


def test_topk_beyond_lm_head_limit_refused():
    with pytest.raises(EagleTritonConfigError, match=re.escape("1 <= topk <= 16")):
        _args("--speculative-num-steps", "2", "--speculative-eagle-topk", "17", "--speculative-num-draft-tokens", "20")


def test_draft_check_needs_eager_drafts(monkeypatch, tmp_path):
    monkeypatch.setenv(config.DRAFT_CHECK_ENV, str(tmp_path / "check.jsonl"))
    with pytest.raises(EagleTritonConfigError, match="--disable-cuda-graph"):
        _args()
    _args("--disable-cuda-graph")


def test_tree_aware_simulated_acceptance_only_in_benchmark_mode(monkeypatch):
    from sgl_eagle_triton import simulated_acceptance

    monkeypatch.setenv(simulated_acceptance.PROFILE_ENV, "llama31-8b-eagle3")
    monkeypatch.delenv(simulated_acceptance.BENCHMARK_ENV, raising=False)
    with pytest.raises(EagleTritonConfigError, match="SGLANG_EAGLE_TRITON_BENCHMARK=1"):
        _args()
    monkeypatch.setenv(simulated_acceptance.BENCHMARK_ENV, "1")
    assert _args().speculative_algorithm == "EAGLE_TRITON"


def test_simulated_acceptance_accepted(monkeypatch):
    monkeypatch.setenv("SGLANG_SIMULATE_ACC_LEN", "3")  # benchmarks: verify.py applies it as stock's eagle_sample
    assert _args().speculative_algorithm == "EAGLE_TRITON"


def test_missing_draft_path():
    with pytest.raises(EagleTritonConfigError, match="--speculative-draft-model-path"):
        _args(draft=None)


def test_non_cuda_device_refused(monkeypatch):
    monkeypatch.setattr(config, "SUPPORTED_DEVICES", ("cuda",))
    if DEVICE == "cuda":
        pytest.skip("needs a machine whose SGLang device is not cuda")
    with pytest.raises(EagleTritonConfigError, match="--device cpu"):
        _args()


def test_create_worker_returns_triton_worker():
    from sglang.srt.speculative.eagle_worker_v2 import EagleDraftWorker, EAGLEWorkerV2

    from sgl_eagle_triton.worker import EagleTritonWorkerV2, TritonEagleDraftWorker

    sa = _args()
    assert SpeculativeAlgorithm.from_string("EAGLE_TRITON").create_worker(sa) is EagleTritonWorkerV2
    assert issubclass(EagleTritonWorkerV2, EAGLEWorkerV2) and issubclass(TritonEagleDraftWorker, EagleDraftWorker)


def test_stack_dump_diagnostics_arm_a_faulthandler_timer(monkeypatch):
    """config.STACK_DUMP_ENV: every process that loads the plugin dumps its stacks periodically (a hung rank's log
    shows where it waits); unset, no timer."""
    import faulthandler

    from sgl_eagle_triton import plugin

    armed = []
    monkeypatch.setattr(faulthandler, "dump_traceback_later", lambda s, repeat=False: armed.append((s, repeat)))
    plugin.register()
    monkeypatch.setenv(config.STACK_DUMP_ENV, "120")
    plugin.register()
    assert armed == [(120.0, True)]


def test_verify_attention_1_starts_only_where_its_kernel_runs(monkeypatch):
    """VERIFY_ATTENTION_ENV=1 (ours required): a triton, page-1, 16-bit server starts; another backend, a paged or FP8
    pool is refused (the kernel would never run there). Unset ("auto") or 0 those servers start (SGLang's verify
    attention there); another value, or the retired trial variable, is refused with what to set instead."""
    unserved = {("--attention-backend", "flashinfer"): "=1 with the flashinfer attention backend",
                ("--attention-backend", "triton", "--page-size", "16"): "=1 with --page-size 16",
                ("--attention-backend", "triton", "--kv-cache-dtype", "fp8_e4m3"): "=1 with --kv-cache-dtype fp8_e4m3"}
    for flags in unserved:
        _args(*flags)
        monkeypatch.setenv(config.VERIFY_ATTENTION_ENV, "0")
        _args(*flags)
        monkeypatch.delenv(config.VERIFY_ATTENTION_ENV)
    monkeypatch.setenv(config.VERIFY_ATTENTION_ENV, "yes")
    with pytest.raises(EagleTritonConfigError, match="Use one of auto, 1, 0"):
        _args("--attention-backend", "triton")
    monkeypatch.delenv(config.VERIFY_ATTENTION_ENV)
    for retired in config.RETIRED_VERIFY_ATTENTION_ENVS:
        monkeypatch.setenv(retired, "1")
        with pytest.raises(EagleTritonConfigError, match=f"{retired} any more.*{config.VERIFY_ATTENTION_ENV}=1"):
            _args("--attention-backend", "triton")
        monkeypatch.delenv(retired)
    monkeypatch.setenv(config.VERIFY_ATTENTION_ENV, "1")
    _args("--attention-backend", "triton")
    for flags, message in unserved.items():
        with pytest.raises(EagleTritonConfigError, match=message):
            _args(*flags)


def test_the_verify_attention_hook_swaps_only_an_eagle_triton_targets_backend(monkeypatch):
    from types import SimpleNamespace

    from sglang.srt.layers.attention.triton_backend import TritonAttnBackend

    from sgl_eagle_triton import verify

    def runner(draft=False, algorithm="EAGLE_TRITON", page_size=1, kv_cache_dtype=torch.bfloat16):
        return SimpleNamespace(is_draft_worker=draft, page_size=page_size, kv_cache_dtype=kv_cache_dtype,
                               server_args=SimpleNamespace(speculative_algorithm=algorithm))

    def fresh():
        backend = TritonAttnBackend.__new__(TritonAttnBackend)
        backend.extend_attention_fwd = "sglang's kernel"
        return backend

    def hook(backend, **kwargs):  # as SGLang calls the hooked function: keywords only
        return plugin.verify_attention_backend(backend, resolved=None, init_new_workspace=False, **kwargs)

    swapped = hook(fresh(), model_runner=runner())  # the default ("auto")
    assert type(swapped) is verify.TreeVerifyAttention and swapped._sglang_extend_attention_fwd == "sglang's kernel"
    assert type(hook(fresh(), model_runner=runner(page_size=16))) is TritonAttnBackend  # pools it does not read
    assert type(hook(fresh(), model_runner=runner(kv_cache_dtype=torch.float8_e5m2))) is TritonAttnBackend
    assert type(hook(fresh(), model_runner=runner(kv_cache_dtype=torch.float16))) is verify.TreeVerifyAttention
    monkeypatch.setenv(config.VERIFY_ATTENTION_ENV, "0")
    assert type(hook(fresh(), model_runner=runner())) is TritonAttnBackend  # turned off
    monkeypatch.setenv(config.VERIFY_ATTENTION_ENV, "1")
    assert type(hook(fresh(), model_runner=runner())) is verify.TreeVerifyAttention
    assert type(hook(fresh(), model_runner=runner(draft=True))) is TritonAttnBackend
    assert type(hook(fresh(), model_runner=runner(algorithm="EAGLE3"))) is TritonAttnBackend
    other = SimpleNamespace()
    assert hook(other, model_runner=runner()) is other


def test_every_attention_backend_sglang_builds_passes_the_verify_attention_hook():
    """SGLang builds the model runner's backend (start-up) and each adaptive state's through
    ``_build_resolved_backend``, the hooked function: were that to change, the trial would not reach the target
    (the worker then refuses to start: test_worker)."""
    import importlib

    from sgl_eagle_triton.glue.call_sites import reaches

    module_path, name = HOOKS["verify_attention_backend"].target.rsplit(".", 1)
    module = importlib.import_module(module_path)
    assert callable(getattr(module, name))
    assert reaches(module.build_attention_backends, module, name)
    assert reaches(module.get_attention_backend, module, name)


def test_a_bad_cycle_timing_value_is_refused_at_start(monkeypatch):
    """SGLANG_EAGLE_TRITON_CYCLE_TIMING (diagnostics): a whole number of decode steps, else refused naming it."""
    monkeypatch.setenv(config.CYCLE_TIMING_ENV, "often")
    with pytest.raises(EagleTritonConfigError, match="SGLANG_EAGLE_TRITON_CYCLE_TIMING='often'.*whole number"):
        _args()
    monkeypatch.setenv(config.CYCLE_TIMING_ENV, "40")
    _args()


def test_a_cycle_timing_scope_is_all_or_scheduler_with_the_cycle_timing(monkeypatch):
    """SGLANG_EAGLE_TRITON_CYCLE_TIMING_SCOPE (diagnostics): all or scheduler, with the cycle timing; scheduler leaves
    the worker's timing out, so an A/B inside the server (timed there) is refused with it."""
    chain = ("--speculative-eagle-topk", "1", "--speculative-num-steps", "3", "--speculative-num-draft-tokens", "4")
    _start_in_steps(monkeypatch, [
        ({config.CYCLE_TIMING_ENV: None, config.AB_STEPS_ENV: None, config.CYCLE_TIMING_SCOPE_ENV: "workers"}, (),
         "CYCLE_TIMING_SCOPE='workers'.*all, scheduler"),
        ({config.CYCLE_TIMING_SCOPE_ENV: "scheduler"}, (),
         "CYCLE_TIMING_SCOPE without SGLANG_EAGLE_TRITON_CYCLE_TIMING"),
        ({config.CYCLE_TIMING_ENV: "200"}, (), None),
        ({config.AB_STEPS_ENV: "16"}, (), "AB_STEPS with SGLANG_EAGLE_TRITON_CYCLE_TIMING_SCOPE=scheduler"),
        ({config.CYCLE_TIMING_SCOPE_ENV: "all", config.VERIFY_IN_GRAPH_ENV: "1"}, chain, None),
    ])


def test_sglangs_skip_of_the_steps_0_extend_is_refused(monkeypatch):
    """SGLANG_SPEC_SKIP_ZERO_STEP_DRAFT_EXTEND (SGLang's): it would skip our steps-0 KV fill with the extend."""
    for value in ("1", "true", "Y"):
        monkeypatch.setenv(config.SKIP_ZERO_STEP_EXTEND_ENV, value)
        with pytest.raises(EagleTritonConfigError, match="SKIP_ZERO_STEP_DRAFT_EXTEND=.*Unset"):
            _args()
    monkeypatch.setenv(config.SKIP_ZERO_STEP_EXTEND_ENV, "0")
    _args()


def test_a_cycle_profile_needs_a_count_and_the_cycle_timing(monkeypatch):
    """SGLANG_EAGLE_TRITON_CYCLE_PROFILE (diagnostics): a whole number of functions, logged with the cycle timing's
    summaries, so refused without it."""
    _start_in_steps(monkeypatch, [
        ({config.CYCLE_TIMING_ENV: None, config.CYCLE_PROFILE_ENV: "all"}, (),
         "SGLANG_EAGLE_TRITON_CYCLE_PROFILE='all'.*whole number"),
        ({config.CYCLE_PROFILE_ENV: "30"}, (), "CYCLE_PROFILE without SGLANG_EAGLE_TRITON_CYCLE_TIMING"),
        ({config.CYCLE_TIMING_ENV: "200"}, (), None),
    ])


def test_a_cycle_profile_folder_needs_the_profile_and_a_writable_folder(monkeypatch, tmp_path):
    """SGLANG_EAGLE_TRITON_CYCLE_PROFILE_DIR keeps the listed profiles whole: refused without the profile, or naming no
    writable folder."""
    monkeypatch.setenv(config.CYCLE_TIMING_ENV, "200")
    monkeypatch.delenv(config.CYCLE_PROFILE_ENV, raising=False)
    monkeypatch.setenv(config.CYCLE_PROFILE_DIR_ENV, str(tmp_path))
    with pytest.raises(EagleTritonConfigError, match="CYCLE_PROFILE_DIR without SGLANG_EAGLE_TRITON_CYCLE_PROFILE"):
        _args()
    monkeypatch.setenv(config.CYCLE_PROFILE_ENV, "30")
    monkeypatch.setenv(config.CYCLE_PROFILE_DIR_ENV, str(tmp_path / "missing"))
    with pytest.raises(EagleTritonConfigError, match="not a writable folder.*Create the folder"):
        _args()
    monkeypatch.setenv(config.CYCLE_PROFILE_DIR_ENV, str(tmp_path))
    _args()


def test_the_verify_in_graph_and_its_ab_are_refused_where_they_cannot_run(monkeypatch):
    """SGLANG_EAGLE_TRITON_VERIFY_IN_GRAPH: 0 or 1, 1 refused with trees; SGLANG_EAGLE_TRITON_AB_STEPS /
    _AB_FEATURE (diagnostics): a whole number of steps, a known feature, with the cycle timing and what the feature
    needs. Each step sets variables (None: unset) and
    expects a refusal matching the pattern, or none."""
    chain = ("--speculative-eagle-topk", "1", "--speculative-num-steps", "3", "--speculative-num-draft-tokens", "4")
    steps = [
        ({config.VERIFY_IN_GRAPH_ENV: "yes"}, (), "SGLANG_EAGLE_TRITON_VERIFY_IN_GRAPH='yes'.*Give 1"),
        ({config.VERIFY_IN_GRAPH_ENV: "1"}, ("--speculative-eagle-topk", "4", "--speculative-num-draft-tokens", "8"),
         "VERIFY_IN_GRAPH=1 with --speculative-eagle-topk 4.*topk 1"),
        ({}, chain, None),
        ({config.AB_STEPS_ENV: "many"}, chain, "SGLANG_EAGLE_TRITON_AB_STEPS='many'.*whole number"),
        ({config.AB_STEPS_ENV: "16", config.CYCLE_TIMING_ENV: None}, chain,
         "AB_STEPS without SGLANG_EAGLE_TRITON_CYCLE_TIMING"),
        ({config.CYCLE_TIMING_ENV: "200"}, chain, None),
        ({config.VERIFY_IN_GRAPH_ENV: None}, (), "AB_STEPS for verify_in_graph without .*VERIFY_IN_GRAPH=1"),
        ({config.AB_FEATURE_ENV: "everything"}, (), "AB_FEATURE='everything'.*verify_in_graph, lean_draft"),
        ({config.AB_FEATURE_ENV: "lean_draft"}, (), None),  # the lean draft phase runs by default
        ({config.LEAN_DRAFT_ENV: "0"}, (), "AB_STEPS for lean_draft where the lean draft phase does not"),
        ({config.LEAN_DRAFT_ENV: None, config.AB_FEATURE_ENV: "plain_direct"}, ("--speculative-adaptive",),
         "AB_STEPS for plain_direct without .*PLAIN_OFF=1.*Set"),
        ({config.PLAIN_OFF_ENV: "1"}, ("--speculative-adaptive",),
         "AB_STEPS for plain_direct without .*OFF_NONSPEC=0.*Set"),  # held steps run as no-spec decode by default
        ({config.OFF_NONSPEC_ENV: "0"}, ("--speculative-adaptive",), None),
    ]
    _start_in_steps(monkeypatch, steps)


def _start_in_steps(monkeypatch, steps) -> None:
    """Each step ``(env, argv, refused)``: set ``env``'s variables (None: unset), then a start with ``argv`` is refused
    matching ``refused``, or (None) starts."""
    for env, argv, refused in steps:
        for name, value in env.items():
            if value is None:
                monkeypatch.delenv(name, raising=False)
            else:
                monkeypatch.setenv(name, value)
        if refused is None:
            _args(*argv)
        else:
            with pytest.raises(EagleTritonConfigError, match=refused):
                _args(*argv)


def _ab_of(monkeypatch, feature: str) -> None:
    """An A/B inside one server of ``feature`` asked for: 16 steps an arm, with the cycle timing."""
    for name, value in ((config.AB_STEPS_ENV, "16"), (config.CYCLE_TIMING_ENV, "200"),
                        (config.AB_FEATURE_ENV, feature)):
        monkeypatch.setenv(name, value)


def test_the_lean_extend_is_the_default_and_refused_under_1_where_it_cannot_run(monkeypatch):
    """SGLANG_EAGLE_TRITON_LEAN_EXTEND: 0 or 1, unset the default (wherever it can run: the worker declines it
    elsewhere, so no server args are refused for it); 1 only on the SGLang it was read from and GPU-run on, with a
    chain (topk 1), one GPU and the overlap scheduler; its A/B only under 1. Each refusal names what to change."""
    chain = ("--speculative-eagle-topk", "1", "--speculative-num-steps", "3", "--speculative-num-draft-tokens", "4")
    tree = ("--speculative-eagle-topk", "4", "--speculative-num-steps", "3", "--speculative-num-draft-tokens", "8")
    monkeypatch.delenv(config.LEAN_EXTEND_ENV, raising=False)
    assert config.lean_extend_mode() == "auto"
    for argv in (chain, tree, (*chain, "--disable-overlap-schedule")):
        _args(*argv)
    monkeypatch.setenv(config.LEAN_EXTEND_ENV, "yes")
    with pytest.raises(EagleTritonConfigError, match="SGLANG_EAGLE_TRITON_LEAN_EXTEND='yes'.*Give 1"):
        _args(*chain)
    monkeypatch.setenv(config.LEAN_EXTEND_ENV, "0")
    _args(*chain)
    assert config.lean_extend_mode() == "off"
    _ab_of(monkeypatch, "lean_extend")
    with pytest.raises(EagleTritonConfigError, match="AB_STEPS for lean_extend without .*LEAN_EXTEND=1.*Set"):
        _args(*chain)
    monkeypatch.setenv(config.LEAN_EXTEND_ENV, "1")
    assert config.lean_extend_mode() == "on"
    if config.versions.installed() not in config.versions.GPU_TESTED:  # an SGLang lane: refused there
        with pytest.raises(EagleTritonConfigError, match=r"LEAN_EXTEND=1 with SGLang .*Use SGLang 0\.5\.17"):
            _args(*chain)
        return
    _args(*chain)
    for argv, refused in ((tree, "LEAN_EXTEND=1 with --speculative-eagle-topk 4.*Use --speculative-eagle-topk 1"),
                          ((*chain, "--disable-overlap-schedule"),
                           "LEAN_EXTEND=1 with --disable-overlap-schedule.*Remove --disable-overlap-schedule")):
        with pytest.raises(EagleTritonConfigError, match=refused):
            _args(*argv)
    args = _args(*chain)
    with pytest.raises(EagleTritonConfigError, match=re.escape("LEAN_EXTEND=1 with --tp 2") + ".*Use --tp 1"):
        config._validate(Overlay(args.record, tp_size=2))


def test_the_plain_off_step_is_asked_for_with_1_under_adaptive_on_one_gpu(monkeypatch):
    """SGLANG_EAGLE_TRITON_PLAIN_OFF (adaptive steps 0 as a plain decode step): 0 or 1, and 1 only
    with --speculative-adaptive, each refusal naming what to change."""
    monkeypatch.setenv(config.PLAIN_OFF_ENV, "yes")
    with pytest.raises(EagleTritonConfigError, match="SGLANG_EAGLE_TRITON_PLAIN_OFF='yes'.*Give 1"):
        _args()
    monkeypatch.setenv(config.PLAIN_OFF_ENV, "1")
    with pytest.raises(EagleTritonConfigError, match="PLAIN_OFF=1 without --speculative-adaptive.*Add"):
        _args()
    monkeypatch.setenv(config.PLAIN_OFF_ENV, "0")
    _args()
    monkeypatch.setenv(config.PLAIN_OFF_ENV, "1")
    args = _args("--speculative-adaptive")
    with pytest.raises(EagleTritonConfigError, match=re.escape("PLAIN_OFF=1 with --tp 2") + ".*Use --tp 1"):
        config._validate(Overlay(args.record, tp_size=2))


def test_held_steps_0_as_a_non_speculative_batch_is_the_default_and_required_with_1(monkeypatch):
    """SGLANG_EAGLE_TRITON_OFF_NONSPEC: unset (wherever it can run: the worker declines it elsewhere,
    config.off_nonspec_unserved naming why), 0 or 1; 1 refused with the plain step off (PLAIN_OFF=0), several GPUs,
    without the overlap scheduler, at page size > 1 and with hierarchical sparse attention; its A/B only under 1.
    Each refusal names what to change (the worker checks SGLang's touchpoints at start)."""
    adaptive = ("--speculative-adaptive",)
    assert config.off_nonspec_mode() == "auto"
    _args(*adaptive, "--disable-overlap-schedule")  # unset: served elsewhere, the worker declines it (logged)
    assert config.off_nonspec_unserved(_args(*adaptive, "--page-size", "16").record)[1] == "Use --page-size 1"
    monkeypatch.setenv(config.OFF_NONSPEC_ENV, "yes")
    with pytest.raises(EagleTritonConfigError, match="SGLANG_EAGLE_TRITON_OFF_NONSPEC='yes'.*Give 1"):
        _args(*adaptive)
    monkeypatch.setenv(config.OFF_NONSPEC_ENV, "1")
    _args(*adaptive)
    with pytest.raises(EagleTritonConfigError, match="OFF_NONSPEC=1 with no --speculative-adaptive.*Add"):
        _args()
    monkeypatch.setenv(config.PLAIN_OFF_ENV, "0")
    with pytest.raises(EagleTritonConfigError, match="OFF_NONSPEC=1 with SGLANG_EAGLE_TRITON_PLAIN_OFF=0.*Unset"):
        _args(*adaptive)
    monkeypatch.setenv(config.PLAIN_OFF_ENV, "1")
    _args(*adaptive)
    with pytest.raises(EagleTritonConfigError, match="OFF_NONSPEC=1 with --disable-overlap-schedule.*Remove"):
        _args(*adaptive, "--disable-overlap-schedule")
    with pytest.raises(EagleTritonConfigError, match="OFF_NONSPEC=1 with --page-size 16.*Use --page-size 1"):
        _args(*adaptive, "--page-size", "16")
    with pytest.raises(EagleTritonConfigError, match="OFF_NONSPEC=1 with --enable-hisparse.*Remove --enable-hisparse"):
        config._validate(Overlay(_args(*adaptive).record, enable_hisparse=True))
    monkeypatch.delenv(config.PLAIN_OFF_ENV)
    with pytest.raises(EagleTritonConfigError, match="OFF_NONSPEC=1 with --tp 2 --dp 1.*Serve one GPU"):
        config._validate(Overlay(_args(*adaptive).record, tp_size=2))
    with pytest.raises(EagleTritonConfigError, match="OFF_NONSPEC=1 with --tp 1 --dp 2.*Serve one GPU"):
        config._validate(Overlay(_args(*adaptive).record, dp_size=2))
    _ab_of(monkeypatch, "off_nonspec")
    _args(*adaptive)
    monkeypatch.setenv(config.OFF_NONSPEC_ENV, "0")
    with pytest.raises(EagleTritonConfigError, match="AB_STEPS for off_nonspec without .*OFF_NONSPEC=1.*Set"):
        _args(*adaptive)
    monkeypatch.delenv(config.OFF_NONSPEC_ENV)
    with pytest.raises(EagleTritonConfigError, match="AB_STEPS for off_nonspec without .*OFF_NONSPEC=1.*Set"):
        _args(*adaptive)


def test_the_lean_draft_is_the_default_and_required_with_1_on_one_gpu_without_the_draft_check_or_paged_trees(
        monkeypatch):
    """SGLANG_EAGLE_TRITON_LEAN_DRAFT (the draft phase without SGLang's prepare_for_draft): unset (the lean phase
    wherever it can run: the worker declines it elsewhere, config.lean_draft_unserved naming why), 0 or 1; 1
    refused under --tp > 1, with the draft check, and with page size > 1 and topk > 1, each refusal naming what to
    change."""
    monkeypatch.setenv(config.LEAN_DRAFT_ENV, "on")
    with pytest.raises(EagleTritonConfigError, match="SGLANG_EAGLE_TRITON_LEAN_DRAFT='on'.*Give 1"):
        _args()
    monkeypatch.delenv(config.LEAN_DRAFT_ENV)
    args = _args()
    assert config.lean_draft_mode() == "auto" and not config.lean_draft()
    assert config.lean_draft_unserved(args.record) is None
    config._validate(Overlay(args.record, tp_size=2))  # declined by the worker, not refused
    assert "--tp 2" in config.lean_draft_unserved(Overlay(args.record, tp_size=2))[0]
    monkeypatch.setenv(config.LEAN_DRAFT_ENV, "0")
    _args()
    assert config.lean_draft_mode() == "off" and not config.lean_draft()
    monkeypatch.setenv(config.LEAN_DRAFT_ENV, "1")
    args = _args()
    assert config.lean_draft()
    with pytest.raises(EagleTritonConfigError, match=re.escape("LEAN_DRAFT=1 with --tp 2") + ".*Use --tp 1"):
        config._validate(Overlay(args.record, tp_size=2))
    with pytest.raises(EagleTritonConfigError, match=re.escape("LEAN_DRAFT=1 with --page-size 16 and "
                                                               "--speculative-eagle-topk 4") + ".*Use --page-size 1"):
        config._validate(Overlay(args.record, page_size=16, speculative_eagle_topk=4))
    config._validate(Overlay(args.record, page_size=16, speculative_eagle_topk=1, attention_backend="triton"))
    monkeypatch.setenv(config.DRAFT_CHECK_ENV, "/tmp/check.jsonl")
    with pytest.raises(EagleTritonConfigError, match="LEAN_DRAFT=1 with SGLANG_EAGLE_TRITON_DRAFT_CHECK.*Unset"):
        _args("--disable-cuda-graph")


@pytest.mark.parametrize("backend", ["fa3", "flashinfer", "wave", "torch_native"])
def test_rocm_refuses_attention_backends_it_does_not_serve(monkeypatch, backend):
    """On a ROCm build of torch (faked here): a backend other than triton and aiter is refused at start, naming what
    to change; so is an FP8 KV pool (an MI300X's are e4m3fnuz)."""
    args = _args()
    monkeypatch.setattr(torch.version, "hip", "6.3.0", raising=False)
    with pytest.raises(EagleTritonConfigError, match=re.escape(
            f"the {backend} attention backend on ROCm (AMD GPUs). Use --attention-backend triton or aiter")):
        config._validate(Overlay(args.record, attention_backend=backend))
    with pytest.raises(EagleTritonConfigError, match=re.escape(f"the {backend} attention backend on ROCm")):
        config._validate(Overlay(args.record, attention_backend=None, decode_attention_backend=backend,
                                 prefill_attention_backend="triton"))
    with pytest.raises(EagleTritonConfigError, match=re.escape("--kv-cache-dtype fp8_e4m3 on ROCm")):
        config._validate(Overlay(args.record, attention_backend="triton", kv_cache_dtype="fp8_e4m3"))
    monkeypatch.setattr(torch.version, "hip", None)
    config._validate(Overlay(args.record, attention_backend=backend))  # on CUDA: SGLang's own checks decide


@pytest.mark.parametrize("backend", [None, "triton", "aiter"])
def test_rocm_accepts_triton_and_aiter(monkeypatch, backend):
    """triton (our verify attention where its kernel applies: 16-bit pools of page size 1) and aiter (SGLang's
    verify; its default on ROCm, none named); under VERIFY_ATTENTION_ENV=1 only triton."""
    args = _args()
    monkeypatch.setattr(torch.version, "hip", "6.3.0", raising=False)
    config._validate(Overlay(args.record, attention_backend=backend, kv_cache_dtype="bf16"))
    config._validate(Overlay(args.record, attention_backend=None, decode_attention_backend=backend,
                             prefill_attention_backend="triton"))
    assert config.verify_attention_wanted(1, "bf16") and not config.verify_attention_wanted(16, "bf16")
    monkeypatch.setenv(config.VERIFY_ATTENTION_ENV, "1")
    if backend == "triton":
        config._validate(Overlay(args.record, attention_backend=backend))
    else:
        with pytest.raises(EagleTritonConfigError, match="Use --attention-backend triton"):
            config._validate(Overlay(args.record, attention_backend=backend))
