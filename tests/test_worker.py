"""worker.py on the CPU: the start-up proof that SGLang still reaches every call site we swap, the first-step
check that our kernels ran, the ``/server_info`` report, ``draft_forward``'s contract, the ``alloc_memory_pool``
binding and ``drafter.draft_weights`` (small stand-ins for SGLang's objects: tests/fake_sglang.py)."""

import logging
import os
import re
from collections import Counter
from types import SimpleNamespace

import pytest
import sglang
import torch
from sglang.srt.speculative import eagle_utils, eagle_worker_common
from sglang.srt.speculative.eagle_worker_v2 import EagleDraftWorker, EAGLEWorkerV2
from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

from sgl_eagle_triton import config, plugin, verify, worker
from sgl_eagle_triton.devtools.testing import random_batch, random_draft
from sgl_eagle_triton.drafter import FusedDrafter, draft_weights
from sgl_eagle_triton.glue import relay
from sgl_eagle_triton.glue.hooks import HOOKS
from sgl_eagle_triton.worker import EagleTritonWorkerV2, TritonEagleDraftWorker
from tests import fake_sglang
from tests.sglang_compat import adaptive_trees, published
from tests.tiny_models import TRAINED_PAIR


@pytest.fixture
def fresh_counts(monkeypatch):
    """``verify.RAN`` and the worker's error list emptied for the test, restored after it."""
    saved = verify.RAN.copy()
    verify.RAN.clear()
    monkeypatch.setattr(worker, "_errors", [])
    yield verify.RAN
    verify.RAN.clear()
    verify.RAN.update(saved)


# --- after the first step: the kernel that should have run did -----------------------------------------------------


def _greedy_batch():
    return SimpleNamespace(forward_mode=fake_sglang.ForwardMode(), sampling_info=SimpleNamespace(is_all_greedy=True))


def _verify_worker():
    w = EagleTritonWorkerV2.__new__(EagleTritonWorkerV2)
    w._verify_checks_left = {verify.VERIFY_GREEDY, verify.VERIFY_SAMPLING}
    w.adaptive_controller, w.cost_policy, w._policy_checked = None, None, False
    w._eagle_sample, w._cycle_knob = verify.eagle_sample, False
    return w


def _adaptive_worker(candidates):
    """An EagleTritonWorkerV2 with SGLang's AdaptiveController over stand-in runtime states (each just its step
    count; applying one sets the worker's steps, as SGLang's apply_runtime_state does)."""
    from sglang.srt.speculative.adaptive_runtime_state import AdaptiveController

    w = _verify_worker()
    w.speculative_num_steps, w.steps_in_force, w._cycle_position = candidates[0], Counter(), 0
    w.topk, w.server_args = 1, SimpleNamespace(speculative_eagle_topk=1)
    w._draft_worker, w.resumes = SimpleNamespace(draft_stale=False, fill_kv_only=False), 0
    w.apply_runtime_state = lambda state: setattr(w, "speculative_num_steps", state.speculative_num_steps)
    controller = AdaptiveController.__new__(AdaptiveController)
    controller.worker, controller._states = w, {s: SimpleNamespace(speculative_num_steps=s) for s in candidates}
    controller.params = SimpleNamespace(candidate_steps=candidates, get_steps_for_batch=lambda bs: candidates[-1])
    w.adaptive_controller = controller
    return w


def test_a_prefill_between_decode_steps_is_not_timed_as_a_cycle(monkeypatch):
    """The e2e's sequential requests put a prefill (and the gap before it) between two decode steps at batch 1: the
    cost policy had learnt the 3-step chain's rest there as 70 ms and never ran it again."""
    from sgl_eagle_triton.adaptive import CostAwarePolicy, CycleCost

    now = [0.0]
    w = _verify_worker()
    w.cost_policy = CostAwarePolicy([0, 3], 3, clock=lambda: now[0])
    w.cost_policy.set_costs(CycleCost({(0, 1): 4.0, (3, 1): 5.0}))
    monkeypatch.setattr(EAGLEWorkerV2, "forward_batch_generation", lambda self, batch, *a, **k: "sglang's")

    def step(mode, gap_ms):
        now[0] += gap_ms / 1e3
        batch = SimpleNamespace(forward_mode=SimpleNamespace(is_extend=lambda: mode == "extend"),
                                is_extend_in_batch=False)
        assert w.forward_batch_generation(batch) == "sglang's"
        if mode == "decode":
            w.cost_policy.get_steps_for_batch(1)

    for mode, gap in [("decode", 0), ("extend", 70), ("decode", 30), ("extend", 70), ("decode", 30), ("decode", 6),
                      ("decode", 6)]:  # two requests starting among the first samples (one would be outvoted)
        step(mode, gap)
    assert w.cost_policy.costs.rest[3, 1] == pytest.approx(1.0)  # 6 ms cycles: the prefills' 100 ms never counted
    # /server_info shows each rest and the spread of the rests it was learnt from
    report = w.cost_policy.report()
    assert report["rest_ms"] == {"3,1": 1.0} and report["rest_spread_ms"] == {"3,1": [1.0, 1.0, 1]}
    assert report["timed_dropped"] == {"3,1": [1, 0]}  # one cycle timed (none dropped: the prefills broke the pairs)


def test_adaptive_steps_follow_sglangs_controller_and_are_reported():
    w = _adaptive_worker([0, 1, 3])
    for _ in range(3):
        w.activate_step_by_batch(4)
    assert w.speculative_num_steps == 3 and w.kernel_report()["adaptive_steps_in_force"] == {"3": 3}
    assert w.kernel_report()["adaptive_trees"] == {"0": [0, 1, 1], "1": [1, 1, 2], "3": [3, 1, 4]}


def test_adaptive_cycle_knob_changes_the_shape_every_step():
    w = _adaptive_worker([0, 1, 3, 7])
    w._cycle_knob = True  # config.ADAPTIVE_CYCLE_ENV set at worker start
    seen = []
    for _ in range(8):
        w.activate_step_by_batch(4)
        seen.append(w.speculative_num_steps)
    assert seen == [1, 3, 7, 0, 1, 3, 7, 0]
    assert w.kernel_report()["adaptive_steps_in_force"] == {"0": 2, "1": 2, "3": 2, "7": 2}


def _run_steps(w, count, batch_size=4):
    """``count`` decode steps of ``w`` (an :func:`_adaptive_worker`): its draft worker's extend as
    TritonEagleDraftWorker's (at steps 0 with ``fill_kv_only`` the draft KV alone, leaving the carried state stale;
    else the full extend); returns the step count each step ran at."""
    ran = []
    for _ in range(count):
        w.activate_step_by_batch(batch_size)
        dw = w.draft_worker
        assert not (w.speculative_num_steps > 0 and dw.draft_stale), "a draft from a stale carried state"
        dw.draft_stale = w.speculative_num_steps == 0 and dw.fill_kv_only
        ran.append(w.speculative_num_steps)
    return ran


def test_off_fills_the_draft_kv_and_resumes_through_one_full_extend():
    """At steps 0 the draft extend is skipped (KV only); the policy's move back to a positive step count first runs
    one more step at 0 with the full draft extend, then drafts."""
    w = _adaptive_worker([0, 1, 3])
    want = iter([0, 0, 0, 3, 3, 0, 1, 1])
    w.adaptive_controller.params.get_steps_for_batch = lambda bs: next(want)
    forgotten = []  # the cost policy does not time a resume step as one of its state's cycles
    w.cost_policy = SimpleNamespace(costs=True, forget_last_step=lambda: forgotten.append(w.speculative_num_steps),
                                    report=dict)
    assert _run_steps(w, 8) == [0, 0, 0, 0, 3, 0, 0, 1]
    assert w.resumes == 2 and w.kernel_report()["adaptive_resumes"] == 2 and forgotten == [0, 0]


@pytest.mark.parametrize("instrument", [False, True])
def test_the_cycle_timing_is_told_each_steps_state(monkeypatch, instrument):
    """Under the cycle timing (diagnostics) every decode step's state is labelled on the worker's timing as it is put
    in force (a resume from steps 0 apart; off_route's held step "steps0-held", test_off_route), for its per-state
    lines; without the instrument nothing is touched."""
    from sgl_eagle_triton import cycle_timing

    monkeypatch.setattr(cycle_timing, "ACTIVE", instrument)
    w = _adaptive_worker([0, 3])
    want = iter([0, 0, 3, 3])
    w.adaptive_controller.params.get_steps_for_batch = lambda bs: next(want)
    timing = w.__dict__["_cycle_timing"] = SimpleNamespace(state="")
    labels = []
    for _ in range(4):
        _run_steps(w, 1)
        labels.append(timing.state)
    assert labels == (["steps0", "steps0", "steps0-resume", "steps3"] if instrument else [""] * 4)


def test_cycle_knob_runs_every_candidate_with_off_filling_the_kv():
    w = _adaptive_worker([0, 1, 3, 7])
    w._cycle_knob = True
    assert _run_steps(w, 10) == [1, 3, 7, 0, 0, 1, 3, 7, 0, 0]
    assert w.resumes == 2


def test_the_first_decode_steps_run_every_candidate_once_and_feed_no_policy(monkeypatch):
    """Adaptive servers put each candidate in force once at their first decode steps (SGLang's warm-up request), so
    that every state's kernels outside CUDA graphs compile before traffic; leaving steps 0 still resumes through one
    full extend; the policy then decides, fed only the verifies of its own steps (an idle batch forces nothing)."""
    w = _adaptive_worker([0, 1, 3, 7])
    w._states_to_warm = (0, 1, 3, 7)
    w.adaptive_controller.params.get_steps_for_batch = lambda bs: 3
    fed = []
    monkeypatch.setattr(EAGLEWorkerV2, "on_verify_complete_cpu", lambda self, correct, batch_size=0: fed.append(
        correct))
    assert _run_steps(w, 1, batch_size=0) == [3]  # idle: the policy's call, nothing forced
    ran = []
    for step in range(8):
        ran += _run_steps(w, 1)
        w.on_verify_complete_cpu([step] * 4, 4)
    assert ran == [0, 0, 1, 3, 7, 3, 3, 3] and w.resumes == 1  # 0, its resume, 1, 3, 7, then the policy's 3
    assert fed == [[5] * 4, [6] * 4, [7] * 4] and not w._states_to_warm


def test_first_verify_without_our_kernel_is_an_error(monkeypatch, fresh_counts, caplog):
    monkeypatch.setattr(EAGLEWorkerV2, "verify", lambda self, batch, grammar_barrier=None: "stock result")
    w = _verify_worker()
    with caplog.at_level(logging.ERROR, logger=worker.logger.name):
        assert w.verify(_greedy_batch()) == "stock result"
        w.verify(_greedy_batch())  # checked once
    report = w.kernel_report()
    assert len(report["errors"]) == 1 and "triton verify_tree_greedy did not run in the first greedy verify" in (
        report["errors"][0])
    assert report["errors"][0] in caplog.text
    assert report["sglang_version"] == sglang.__version__
    assert report["kernels"] == {**worker.KERNELS_IN_USE, "verify attention": "not yet built"}


def test_first_verify_through_the_swapped_names_is_ours(monkeypatch, fresh_counts, device):
    def stock_verify(self, batch, grammar_barrier=None):  # SGLang's greedy path, reaching the swapped name
        outputs = (torch.zeros(2, dtype=torch.int32), torch.full((1, 2), -1, dtype=torch.int32),
                   torch.zeros(1, dtype=torch.int32))
        tree = [torch.tensor([[5, 6]]), torch.tensor([[0, 1]]), torch.tensor([[1, -1]]), torch.tensor([[-1, -1]]),
                torch.tensor([[6, 9]])]
        return eagle_utils.verify_tree_greedy_func(*(t.to(device) for t in (*outputs, *tree)))

    monkeypatch.setattr(EAGLEWorkerV2, "verify", stock_verify)
    w = _verify_worker()
    predicts, accept_index, accepted = w.verify(_greedy_batch())
    assert accepted.tolist() == [1] and fresh_counts[verify.VERIFY_GREEDY] == 1
    assert w.kernel_report()["errors"] == [] and w._verify_checks_left == {verify.VERIFY_SAMPLING}


def test_first_draft_without_our_kernels_is_an_error(monkeypatch, fresh_counts):
    monkeypatch.setattr(EagleDraftWorker, "draft", lambda self, batch: "stock tree")
    w = TritonEagleDraftWorker.__new__(TritonEagleDraftWorker)
    assert w.draft(SimpleNamespace(forward_mode=fake_sglang.ForwardMode(idle=True))) == "stock tree"
    assert worker._errors == []  # idle batches are not checked
    w.draft(SimpleNamespace(forward_mode=fake_sglang.ForwardMode()))
    assert [e.split(" did not run")[0] for e in worker._errors] == [
        "EAGLE_TRITON: triton fused drafter", "EAGLE_TRITON: triton build_tree"]


def test_first_draft_through_the_swapped_build_tree_is_ours(monkeypatch, fresh_counts):
    def stock_draft(self, batch):  # looks the swapped name up at call time, as SGLang's draft does
        return eagle_worker_common.build_tree_kernel_efficient()

    monkeypatch.setattr(EagleDraftWorker, "draft", stock_draft)
    monkeypatch.setattr(worker, "_build_tree", verify.witnessed(lambda: None, worker.BUILD_TREE))
    fresh_counts[worker.FUSED_DRAFTER] = 1  # captured in the draft graph at start-up
    w = TritonEagleDraftWorker.__new__(TritonEagleDraftWorker)
    w.draft(SimpleNamespace(forward_mode=fake_sglang.ForwardMode()))
    assert worker._errors == [] and fresh_counts[worker.BUILD_TREE] == 1


def test_server_info_hook_adds_the_report(fresh_counts):
    from sglang.srt.managers.io_struct import GetInternalStateReqOutput

    w = _verify_worker()
    out = plugin.report_kernels(GetInternalStateReqOutput(internal_state={"avg_spec_accept_length": 2.0}),
                                SimpleNamespace(draft_worker=w))
    state = out.internal_state
    assert state["avg_spec_accept_length"] == 2.0 and state["eagle_triton"]["errors"] == []
    stock = plugin.report_kernels(GetInternalStateReqOutput(internal_state={"x": 1}),
                                  SimpleNamespace(draft_worker=SimpleNamespace()))
    assert stock.internal_state == {"x": 1}


def test_server_info_hook_is_applied():
    from sglang.srt.managers.scheduler import Scheduler
    from sglang.srt.plugins import load_plugins
    from sglang.srt.plugins.hook_registry import HookRegistry

    load_plugins()
    target = HOOKS["report_kernels"].target
    assert any(hook is plugin.report_kernels for _, hook, _ in HookRegistry._hooks[target])
    assert target in HookRegistry._patched
    assert Scheduler.get_internal_state.__wrapped__.__qualname__ == "Scheduler.get_internal_state"


# --- draft_forward and alloc_memory_pool ----------------------------------------------------------------------------

TOPK, STEPS, N = 4, 3, 8


def _bound_draft_worker(w, batch, steps=STEPS, n=N):
    dw = TritonEagleDraftWorker.__new__(TritonEagleDraftWorker)
    dw._drafter_binding = (w, batch["k_cache"], batch["v_cache"], batch["req_to_token"], 1.0, 1.0)
    dw._drafters, dw.topk, dw.speculative_num_steps, dw.speculative_num_draft_tokens = {}, TOPK, steps, n
    dw.server_args = SimpleNamespace(speculative_adaptive=False, speculative_eagle_topk=TOPK)
    return dw


def test_draft_forward_follows_sglangs_contract(fresh_counts, device):
    """``(parent_list, top_scores_index, draft_tokens, None)`` of the fused drafter, positions advanced by
    steps - 1 in place (the fused drafter against its twin: tests/test_drafter.py)."""
    w, gen = random_draft(True, device, seed=5)
    batch = random_batch(w, 2, TOPK, STEPS, [9, 4], gen, device)
    spec_info = SimpleNamespace(topk_p=batch["topk_p"], topk_index=batch["topk_index"], hidden_states=batch["hidden"])
    forward_batch = SimpleNamespace(spec_info=spec_info, positions=batch["positions"].clone(),
                                    seq_lens=batch["seq_lens"], req_pool_indices=batch["req_pool_indices"])
    out = _bound_draft_worker(w, batch).draft_forward(forward_batch)
    assert len(out) == 4 and out[3] is None and fresh_counts[worker.FUSED_DRAFTER] == 1
    positions = batch["positions"].clone()
    expected = _bound_draft_worker(w, batch).fused_drafter.draft(
        batch["topk_p"], batch["topk_index"], batch["hidden"], positions, batch["seq_lens"], batch["req_pool_indices"])
    assert all(torch.equal(o, e) for o, e in zip(out[:3], expected[:3], strict=True))
    assert [t.shape for t in out[:3]] == [(2, TOPK * (STEPS - 1) + 1), (2, N - 1), (2, N - 1)]
    assert torch.equal(forward_batch.positions, positions)
    assert torch.equal(positions, batch["positions"] + STEPS - 1)


@pytest.fixture
def pool_worker(monkeypatch, eagle_triton_args):
    """A TritonEagleDraftWorker whose SGLang ``alloc_memory_pool`` hands it stand-in pools; returns
    ``(worker, weights, pools)`` before the call."""
    w, _ = random_draft(True, "cpu", seed=1)
    sa = eagle_triton_args(["--model-path", str(TRAINED_PAIR / "target"), "--speculative-algorithm", "EAGLE_TRITON",
                            "--speculative-draft-model-path", str(TRAINED_PAIR / "eagle3"),
                            "--speculative-num-steps", "5", "--speculative-eagle-topk", "4",
                            "--speculative-num-draft-tokens", "8"])
    context = 64
    pools = {"k": torch.zeros(10, w.num_kv_heads, w.head_dim), "v": torch.zeros(10, w.num_kv_heads, w.head_dim),
             "req_to_token": torch.zeros(3, context + 40, dtype=torch.int32)}

    def stock_alloc(self, **kwargs):
        self.req_to_token_pool = SimpleNamespace(req_to_token=pools["req_to_token"])

    monkeypatch.setattr(EagleDraftWorker, "alloc_memory_pool", stock_alloc)
    dw = TritonEagleDraftWorker.__new__(TritonEagleDraftWorker)
    buffers = {"k": {3: pools["k"]}, "v": {3: pools["v"]}}  # the draft layer's layer_id is 3 (fake_sglang)
    dw.draft_runner = SimpleNamespace(model=fake_sglang.draft_model(w, vocab_padding=8),
                                      token_to_kv_pool=SimpleNamespace(get_key_buffer=buffers["k"].__getitem__,
                                                                       get_value_buffer=buffers["v"].__getitem__))
    dw.target_worker = SimpleNamespace(model_config=SimpleNamespace(context_len=context))
    dw.server_args, dw.hot_token_id = sa.record, w.token_map
    dw.topk, dw.speculative_num_steps, dw.speculative_num_draft_tokens = 4, 5, 8
    with published(sa.record):  # what the scheduler's worker reads its reservation from (0.5.18+)
        yield dw, w, pools


def test_alloc_memory_pool_binds_the_drafter_to_sglangs_pools(pool_worker):
    dw, w, pools = pool_worker
    dw.alloc_memory_pool(memory_pool_config=None)
    d = dw.fused_drafter
    assert d.k_cache is pools["k"] and d.v_cache is pools["v"] and d.req_to_token is pools["req_to_token"]
    assert (d.topk, d.num_steps, d.num_draft_tokens) == (4, 5, 8)
    assert d.w.qkv.data_ptr() == w.qkv.data_ptr() and d.w.token_map is w.token_map and d.w.eagle3
    assert dw.fused_drafter is d  # one drafter per shape


def test_the_drafter_follows_the_shape_sglang_puts_in_force(pool_worker):
    """Adaptive speculation: SGLang sets the worker's steps / draft tokens per runtime state (while capturing that
    state's draft graph, and when switching): each shape gets its own drafter on the same weights and pools."""
    dw, w, pools = pool_worker
    dw.alloc_memory_pool(memory_pool_config=None)
    first = dw.fused_drafter
    dw.topk, dw.speculative_num_steps, dw.speculative_num_draft_tokens = 1, 3, 4
    chain = dw.fused_drafter
    assert (chain.topk, chain.num_steps, chain.num_draft_tokens) == (1, 3, 4)
    assert chain.k_cache is first.k_cache and chain.req_to_token is first.req_to_token and chain.w is first.w
    dw.topk, dw.speculative_num_steps, dw.speculative_num_draft_tokens = 4, 5, 8
    assert dw.fused_drafter is first


def test_draft_forward_runs_the_shape_in_force(fresh_counts, device):
    w, gen = random_draft(True, device, seed=6)
    batch = random_batch(w, 2, TOPK, 5, [9, 4], gen, device)
    spec_info = SimpleNamespace(topk_p=batch["topk_p"], topk_index=batch["topk_index"], hidden_states=batch["hidden"])
    dw = _bound_draft_worker(w, batch)
    for steps, n in ((5, 12), (2, 5), (1, 4)):
        dw.speculative_num_steps, dw.speculative_num_draft_tokens = steps, n
        forward_batch = SimpleNamespace(spec_info=spec_info, positions=batch["positions"].clone(),
                                        seq_lens=batch["seq_lens"], req_pool_indices=batch["req_pool_indices"])
        parents, index, tokens, _ = dw.draft_forward(forward_batch)
        assert parents.shape == (2, TOPK * (steps - 1) + 1 if steps > 1 else 0) and tokens.shape == (2, n - 1)
        assert torch.equal(forward_batch.positions, batch["positions"] + steps - 1)


def test_an_adaptive_state_narrower_than_the_server_drafts_at_its_own_topk(fresh_counts, device, monkeypatch):
    """Adaptive candidates (steps 1, topk 1) and (steps 2, topk 2) in a topk-TOPK server: each state's drafter runs at
    its own topk and returns its tree in the server's layout (tests/test_tree_layout.py); a full-width state as
    before."""
    w, gen = random_draft(True, device, seed=7)
    batch = random_batch(w, 2, TOPK, 3, [9, 4], gen, device)
    spec_info = SimpleNamespace(topk_p=batch["topk_p"], topk_index=batch["topk_index"], hidden_states=batch["hidden"])
    dw = _bound_draft_worker(w, batch)
    dw.server_args = SimpleNamespace(speculative_adaptive=True, speculative_eagle_topk=TOPK)
    adaptive_trees(monkeypatch, {0: (TOPK, 1), 1: (1, 2), 2: (2, 4), 3: (TOPK, 8)})
    for steps, n, k in ((1, 2, 1), (2, 4, 2), (3, 8, TOPK)):
        dw.speculative_num_steps, dw.speculative_num_draft_tokens = steps, n
        forward_batch = SimpleNamespace(spec_info=spec_info, positions=batch["positions"].clone(),
                                        seq_lens=batch["seq_lens"], req_pool_indices=batch["req_pool_indices"])
        parents, index, tokens, _ = dw.draft_forward(forward_batch)
        drafter = dw.fused_drafter
        assert (drafter.topk, drafter.layout_topk) == (k, TOPK)
        assert parents.shape == (2, TOPK * (steps - 1) + 1 if steps > 1 else 0) and tokens.shape == (2, n - 1)
        assert torch.equal(forward_batch.positions, batch["positions"] + steps - 1)
        if k == 1:  # a chain: child 0 of frontier row 0 at every level, in the server's list
            assert index.tolist() == [[0]] * 2


def test_alloc_memory_pool_refuses_rows_without_the_reservation(pool_worker):
    dw, _, pools = pool_worker
    pools["req_to_token"] = torch.zeros(3, 64 + 4 + 8, dtype=torch.int32)  # SGLang's own width at page size 1
    with pytest.raises(RuntimeError, match="req_to_token rows hold 76 tokens.*reserves up to 104"):
        dw.alloc_memory_pool(memory_pool_config=None)


@pytest.mark.parametrize("eagle3", [True, False], ids=["eagle3", "eagle1"])
def test_draft_weights_bind_sglangs_tensors_by_reference(eagle3):
    w, _ = random_draft(eagle3, "cpu")
    model = fake_sglang.draft_model(w, vocab_padding=8)
    if not eagle3:  # SGLang's EAGLE-1 fc is a torch.nn.Linear: parameters that require grad
        model.model.fc.weight, model.model.fc.bias = (torch.nn.Parameter(t) for t in (w.fc, w.fc_bias))
    bound = draft_weights(model, w.token_map)
    assert bound.eagle3 == eagle3 and bound.token_map is w.token_map
    for name in ("embed", "qkv", "o_proj", "post_norm", "gate_up", "down", "input_norm", "hidden_norm", "final_norm",
                 "fc", "fc_bias", "qkv_bias"):
        ours, sglangs = getattr(bound, name), getattr(w, name)
        assert (ours is None) == (sglangs is None), name
        if ours is not None:  # the same storage, outside autograd (the draft's out= ops run in grad mode)
            assert ours.data_ptr() == sglangs.data_ptr() and ours.shape == sglangs.shape, name
            assert not ours.requires_grad, name
    # the LM head without SGLang's padding rows, still a view of the model's tensor
    assert bound.lm_head.shape == w.lm_head.shape and bound.lm_head.data_ptr() == model.lm_head.weight.data_ptr()
    assert (bound.num_q_heads, bound.num_kv_heads, bound.head_dim, bound.eps) == (
        w.num_q_heads, w.num_kv_heads, w.head_dim, w.eps)
    assert bound.rotary is model.model.layers[0].self_attn.rotary_emb


def test_draft_weights_refuse_the_fallback_rope_fp32_and_mixed_dtypes():
    w, _ = random_draft(True, "cpu")
    model = fake_sglang.draft_model(w)
    model.model.layers[0].self_attn.rotary_emb.use_fallback_kernel = True
    with pytest.raises(ValueError, match="neox RoPE"):
        draft_weights(model, w.token_map)
    model = fake_sglang.draft_model(w)
    model.model.layers[0].mlp.down_proj.weight = w.down.half()
    with pytest.raises(ValueError, match="all bf16 or all fp16; this draft holds bfloat16 and float16 weights"):
        draft_weights(model, w.token_map)
    w32, _ = random_draft(False, "cpu", dtype=torch.float32)
    with pytest.raises(ValueError, match="this draft holds float32 weights"):
        draft_weights(fake_sglang.draft_model(w32), None)


@pytest.mark.parametrize("eagle3", [True, False], ids=["eagle3", "eagle1"])
def test_draft_weights_accept_fp16(eagle3):
    w, _ = random_draft(eagle3, "cpu", dtype=torch.float16)
    bound = draft_weights(fake_sglang.draft_model(w), w.token_map)
    assert bound.dtype == torch.float16 and bound.qkv.data_ptr() == w.qkv.data_ptr()


# --- steps 0 ("off"): the draft KV without the draft extend; the one-node verify attends as a decode -------------


class _RecordingPool:
    def __init__(self):
        self.writes = []

    def set_kv_buffer(self, layer, loc, k, v, k_scale=None, v_scale=None):
        self.writes.append((layer, loc, k, v, k_scale, v_scale))


@pytest.mark.parametrize("eagle3", [True, False], ids=["eagle3", "eagle1"])
def test_off_fills_the_draft_kv_of_the_committed_tokens(fresh_counts, device, eagle3, monkeypatch):
    """fill_draft_kv stores FusedDrafter.draft_kv of (each request's new token, its carried hidden state: EAGLE-3's
    fc of the target's features, EAGLE-1's target hidden state, the verified position) at the verify's KV slots,
    through SGLang's pool with the draft layer's scales, and leaves stubs of SGLang's shapes."""
    w, gen = random_draft(eagle3, device, seed=11)
    bs, H = 3, w.hidden_size
    features = 3 * H if eagle3 else H
    fc = torch.nn.Linear(features, H, bias=False).to(w.dtype).to(device)
    dw = TritonEagleDraftWorker.__new__(TritonEagleDraftWorker)
    dw._drafter_binding, dw._drafters, dw._stubs = (w, None, None, None, 1.0, 1.0), {}, None
    dw.topk, dw.speculative_num_steps, dw.speculative_num_draft_tokens = 1, 0, 1
    dw.server_args = SimpleNamespace(speculative_adaptive=True, speculative_eagle_topk=1)
    dw._draft_attention = SimpleNamespace(k_scale=None, v_scale=None)
    pool = _RecordingPool()
    dw.draft_runner = SimpleNamespace(
        token_to_kv_pool=pool, model=SimpleNamespace(model=SimpleNamespace(fc=fc, num_aux_hidden_states=3)),
        spec_algorithm=SimpleNamespace(is_standalone=lambda: False),
        model_config=SimpleNamespace(spec_hidden_size=H, dtype=w.dtype))
    seq_lens = torch.tensor([7, 30, 2], device=device)
    batch = SimpleNamespace(seq_lens=seq_lens, out_cache_loc=torch.tensor([40, 12, 99], device=device),
                            forward_mode=fake_sglang.ForwardMode())
    target_hidden = torch.randn(bs, features, generator=gen).to(w.dtype).to(device)
    next_tokens = torch.randint(0, w.embed.shape[0], (bs,), generator=gen, dtype=torch.int32).to(device)
    result = SimpleNamespace(next_token_ids=next_tokens, logits_output=SimpleNamespace(hidden_states=target_hidden),
                             next_draft_input=SimpleNamespace())
    dw.fill_kv_only = True
    assert dw._draft_extend_for_decode(batch, result) is None and dw.draft_stale

    (layer, loc, k, v, k_scale, v_scale), = pool.writes
    carried = fc(target_hidden) if eagle3 else target_hidden
    want_k, want_v = dw.fused_drafter.draft_kv(next_tokens.long(), carried, seq_lens)
    assert layer is dw._draft_attention and torch.equal(loc, batch.out_cache_loc) and k_scale is v_scale is None
    assert torch.equal(k, want_k) and torch.equal(v, want_v) and fresh_counts[worker.DRAFT_KV_FILL] == 1
    stub = result.next_draft_input
    assert stub.topk_p.shape == (bs, 1) and stub.topk_index.dtype == torch.int64
    assert stub.hidden_states.shape == (bs, H) and stub.hidden_states.dtype == w.dtype
    assert not stub.topk_p.any() and not stub.hidden_states.any()
    # marked: the scheduler's relay carries the bonus token alone after this step (glue.relay)
    assert relay.is_stub(stub.topk_p) and relay.is_stub(stub.topk_index) and relay.is_stub(stub.hidden_states)

    def fill(rows):  # the stubs of a batch of ``rows`` requests
        b = SimpleNamespace(seq_lens=seq_lens[:rows], out_cache_loc=batch.out_cache_loc[:rows],
                            forward_mode=batch.forward_mode)
        r = SimpleNamespace(next_token_ids=next_tokens[:rows], next_draft_input=SimpleNamespace(),
                            logits_output=SimpleNamespace(hidden_states=target_hidden[:rows]))
        dw.fill_draft_kv(b, r)
        return r.next_draft_input

    smaller = fill(2)  # views of one zero buffer, as large as the largest batch so far
    assert smaller.hidden_states.shape == (2, H) and smaller.hidden_states.data_ptr() == stub.hidden_states.data_ptr()

    # compiled before serving (EagleTritonWorkerV2.compile_eager_kernels): one fill of each row-count class, nothing
    # stored, nothing counted
    pool.writes.clear()
    seen, draft_kv = [], FusedDrafter.draft_kv
    monkeypatch.setattr(FusedDrafter, "draft_kv", lambda self, ids, hidden, positions: seen.append(
        (ids.shape[0], tuple(hidden.shape), hidden.dtype)) or draft_kv(self, ids, hidden, positions))
    dw.compile_draft_kv()
    assert seen == [(rows, (rows, H), w.dtype) for rows in worker.DRAFT_KV_ROWS]
    assert not pool.writes and fresh_counts[worker.DRAFT_KV_FILL] == 2


class _TensorPool:
    """A draft KV pool of tensors (writes a CUDA graph can capture)."""

    def __init__(self, slots, heads, head_dim, dtype, device):
        self.k = torch.zeros(slots, heads, head_dim, dtype=dtype, device=device)
        self.v = torch.zeros_like(self.k)

    def set_kv_buffer(self, layer, loc, k, v, k_scale=None, v_scale=None):
        self.k[loc] = k
        self.v[loc] = v


def _off_draft_worker(w, eagle3, pool, device):
    """A draft worker at steps 0 over ``pool``, its draft model's ``fc`` shaped as SGLang's (EAGLE-3: the target's
    three auxiliary hidden states in; EAGLE-1: embedding and hidden state in, unused by the fill), the target
    capturing auxiliary hidden states for EAGLE-3 only; returns it and the width of the target's hidden states."""
    H = w.hidden_size
    features = 3 * H if eagle3 else H
    fc = torch.nn.Linear(3 * H if eagle3 else 2 * H, H, bias=False).to(w.dtype).to(device)
    dw = TritonEagleDraftWorker.__new__(TritonEagleDraftWorker)
    dw._drafter_binding, dw._drafters, dw._stubs = (w, None, None, None, 1.0, 1.0), {}, None
    dw.topk, dw.speculative_num_steps, dw.speculative_num_draft_tokens = 1, 0, 1
    dw.server_args = SimpleNamespace(speculative_adaptive=True, speculative_eagle_topk=1)
    dw._draft_attention = SimpleNamespace(k_scale=None, v_scale=None)
    dw.draft_runner = SimpleNamespace(
        token_to_kv_pool=pool, model=SimpleNamespace(model=SimpleNamespace(fc=fc, num_aux_hidden_states=3)),
        spec_algorithm=SimpleNamespace(is_standalone=lambda: False),
        model_config=SimpleNamespace(spec_hidden_size=w.hidden_size, dtype=w.dtype))
    dw.target_worker = SimpleNamespace(model_runner=SimpleNamespace(
        spec_aux_config=SimpleNamespace(eagle_use_aux_hidden_state=eagle3)))
    dw.fill_kv_only = True
    return dw, features


@pytest.mark.parametrize("eagle3", [True, False], ids=["eagle3", "eagle1"])
def test_off_fill_replays_its_graphs_as_the_eager_fill_stores(fresh_counts, device, eagle3):
    """capture_draft_kv: steps 0's fill replayed from one graph per batch size (CUDA graphs on CUDA; on the CPU a
    stand-in replaying the captured call) stores the same draft K / V as the eager fill for batches of 1-5 requests
    (3 padded into the 4-request graph, 5 eager above the largest), writing nothing else but SGLang's padding slot 0;
    every fill counted."""
    from tests.test_row_graphs import RecordedGraph, recording

    w, gen = random_draft(eagle3, device, seed=12)
    pools = [_TensorPool(64, w.num_kv_heads, w.head_dim, w.dtype, device) for _ in range(2)]
    graphed, features = _off_draft_worker(w, eagle3, pools[0], device)
    eager, _ = _off_draft_worker(w, eagle3, pools[1], device)
    eager.draft_runner.model.model.fc = graphed.draft_runner.model.model.fc
    if device == "cuda":
        graphed.capture_draft_kv([1, 2, 4], capturing=lambda g: torch.cuda.graph(g))
    else:
        calls, fill_rows = [], graphed._fill_rows

        def recorded(*rows):
            calls.append(lambda: fill_rows(*rows))
            fill_rows(*rows)

        graphed._fill_rows = recorded
        graphed.capture_draft_kv([1, 2, 4], graph=RecordedGraph, capturing=recording(calls))
    for pool in pools:
        pool.k.zero_(), pool.v.zero_()
    for n, first in ((4, 1), (3, 10), (5, 20), (1, 30), (2, 40)):
        seq_lens = torch.randint(1, 500, (n,), generator=gen).to(device)
        batch = SimpleNamespace(seq_lens=seq_lens, out_cache_loc=torch.arange(first, first + n, device=device),
                                forward_mode=fake_sglang.ForwardMode())
        target_hidden = torch.randn(n, features, generator=gen).to(w.dtype).to(device)
        next_tokens = torch.randint(0, w.embed.shape[0], (n,), generator=gen, dtype=torch.int32).to(device)
        for dw in (graphed, eager):
            result = SimpleNamespace(next_token_ids=next_tokens, next_draft_input=SimpleNamespace(),
                                     logits_output=SimpleNamespace(hidden_states=target_hidden))
            assert dw._draft_extend_for_decode(batch, result) is None
        assert torch.equal(pools[0].k[1:], pools[1].k[1:]) and torch.equal(pools[0].v[1:], pools[1].v[1:]), n
    assert pools[0].k[1:].any() and fresh_counts[worker.DRAFT_KV_FILL] == 10
    assert graphed._fill_graphs.replays == 4 and graphed._fill_graphs.eager == 1  # captured at the target's width
    assert graphed._fill_graphs.mismatched == 0


def test_off_fill_graphs_at_the_steps_0_verify_graphs_sizes_on_one_gpu_only():
    """EagleTritonWorkerV2.capture_draft_kv: at the batch sizes of the steps-0 state's verify graphs; none without
    steps 0, with --disable-cuda-graph, or under tensor parallelism (eager there)."""
    captured = []
    w = EagleTritonWorkerV2.__new__(EagleTritonWorkerV2)
    w._draft_worker = SimpleNamespace(capture_draft_kv=captured.append, _tensor_parallel=None)
    w.server_args = SimpleNamespace(disable_cuda_graph=False)
    states = {0: SimpleNamespace(target_graph_runner=SimpleNamespace(capture_bs=[4, 1, 2, 4])),
              3: SimpleNamespace(target_graph_runner=SimpleNamespace(capture_bs=[8]))}
    w.adaptive_controller = SimpleNamespace(_states=states)
    w.capture_draft_kv()
    assert captured == [[1, 2, 4]]
    w.server_args.disable_cuda_graph = True
    w.capture_draft_kv()
    w.server_args.disable_cuda_graph = False
    w.draft_worker._tensor_parallel = object()
    w.capture_draft_kv()
    w.draft_worker._tensor_parallel = None
    w.adaptive_controller = SimpleNamespace(_states={3: states[3]})
    w.capture_draft_kv()
    w.adaptive_controller = None
    w.capture_draft_kv()
    assert captured == [[1, 2, 4]]


def test_off_runs_the_full_extend_unless_told_to_fill_the_kv_only(monkeypatch):
    monkeypatch.setattr(EagleDraftWorker, "_draft_extend_for_decode", lambda self, batch, result: "extended")
    dw = TritonEagleDraftWorker.__new__(TritonEagleDraftWorker)
    dw.speculative_num_steps, dw.draft_stale = 0, True
    batch = SimpleNamespace(forward_mode=fake_sglang.ForwardMode())
    assert dw._draft_extend_for_decode(batch, None) == "extended" and not dw.draft_stale  # a resume step
    dw.fill_kv_only, dw.speculative_num_steps = True, 3
    assert dw._draft_extend_for_decode(batch, None) == "extended"  # only steps 0 skips the extend
    dw.draft_stale = True
    idle = SimpleNamespace(forward_mode=fake_sglang.ForwardMode(idle=True))
    assert dw._draft_extend_for_decode(idle, None) == "extended" and dw.draft_stale  # an idle batch extends nobody


def test_one_node_verify_attends_as_a_decode(monkeypatch):
    """OneNodeVerifyAttention hands SGLang's Triton backend a decode view of a verify batch (mode DECODE, no spec
    info, KV lengths counting the verified token) for eager metadata, graph capture and replay, and runs the
    verify's attention through forward_decode; other modes pass through."""
    from sglang.srt.layers.attention.triton_backend import TritonAttnBackend
    from sglang.srt.model_executor.forward_batch_info import ForwardMode

    seen = []
    monkeypatch.setattr(TritonAttnBackend, "init_forward_metadata", lambda self, fb: seen.append(("eager", fb)))
    monkeypatch.setattr(TritonAttnBackend, "init_forward_metadata_out_graph",
                        lambda self, fb, in_capture=False: seen.append(("graph", fb, in_capture)))
    monkeypatch.setattr(TritonAttnBackend, "forward_decode", lambda self, *args, **kwargs: "decode")
    monkeypatch.setattr(TritonAttnBackend, "forward_extend", lambda self, *args, **kwargs: "extend")
    backend = verify.one_node_verify_attention(TritonAttnBackend.__new__(TritonAttnBackend))
    assert type(backend) is verify.OneNodeVerifyAttention
    other = SimpleNamespace()
    assert verify.one_node_verify_attention(other) is other  # other backends keep SGLang's verify attention

    batch = SimpleNamespace(forward_mode=ForwardMode.TARGET_VERIFY, spec_info="tree", batch_size=2,
                            seq_lens=torch.tensor([5, 9]), seq_lens_sum=14, out_cache_loc=torch.tensor([3, 4]))
    backend.init_forward_metadata(batch)
    backend.init_forward_metadata_out_graph(batch, in_capture=True)
    for _, view, *_ in seen:
        assert view.forward_mode == ForwardMode.DECODE and view.spec_info is None and view.seq_lens_sum == 16
        assert view.seq_lens.tolist() == [6, 10] and view.out_cache_loc is batch.out_cache_loc
        assert view.seq_lens_cpu is None  # the verify batch has no host lengths
    batch.seq_lens_cpu = torch.tensor([5, 9])
    backend.init_forward_metadata(batch)
    assert seen[-1][1].seq_lens_cpu.tolist() == [6, 10] and batch.seq_lens_cpu.tolist() == [5, 9]
    batch.seq_lens_sum = None
    backend.init_forward_metadata(batch)
    assert seen[-1][1].seq_lens_sum is None
    assert seen[1][2] is True
    assert backend.forward_extend(None, None, None, None, batch) == "decode"
    extend = SimpleNamespace(forward_mode=ForwardMode.DRAFT_EXTEND_V2)
    assert backend.forward_extend(None, None, None, None, extend) == "extend"
    backend.init_forward_metadata(extend)
    assert seen[-1] == ("eager", extend)


def test_tensor_parallel_binds_sglangs_tp_group_and_vocabulary_shards(pool_worker):
    """With a TP group of several ranks the drafter gets its all-reduce / all-gather and the rank's embedding and
    LM-head shards (SGLang's ``shard_indices``); on one GPU none (the drafter's one-GPU path)."""
    dw, w, pools = pool_worker
    dw.draft_runner.tp_group = SimpleNamespace(world_size=1)
    dw.alloc_memory_pool(memory_pool_config=None)
    assert dw.fused_drafter.tp is None

    calls = []
    model = dw.draft_runner.model
    rows, head_rows = model.model.embed_tokens.weight.shape[0], model.lm_head.weight.shape[0]

    def rank_0_like(layout):  # rank 0's start-up layout: this rank's with offsets 0
        return ((0, layout[0][1]), (0, layout[1][1]), *layout[2:])

    group = SimpleNamespace(
        world_size=2, rank_in_group=1, all_reduce=lambda t: calls.append("reduce") or t * 2,
        all_gather=lambda t, dim: calls.append(("gather", tuple(t.shape), dim)) or torch.cat([t, t]),
        all_gather_object=lambda layout: [rank_0_like(layout), layout])
    shard = SimpleNamespace
    model.model.embed_tokens.shard_indices = shard(padded_org_vocab_start_index=rows, num_org_elements=rows - 3)
    model.lm_head.shard_indices = shard(padded_org_vocab_start_index=head_rows, num_org_elements=head_rows - 5)
    dw.draft_runner.tp_group = group
    dw.alloc_memory_pool(memory_pool_config=None)
    tp = dw.fused_drafter.tp
    assert (tp.size, tp.rank, tp.embed_shard, tp.lm_head_shard) == (2, 1, (rows, rows - 3), (head_rows, head_rows - 5))
    t = torch.ones(3)
    assert tp.all_reduce is group.all_reduce  # SGLang's own (its result used: no copy back into the input)
    assert tp.all_reduce(t).tolist() == [2.0] * 3 and t.tolist() == [1.0] * 3
    assert tp.all_gather(torch.ones(4, 2)).shape == (2, 4, 2) and calls == ["reduce", ("gather", (1, 4, 2), 0)]
    # a rank whose LM-head rows do not start at rank x rows is refused at start, naming it
    model.lm_head.shard_indices = shard(padded_org_vocab_start_index=64, num_org_elements=56)
    with pytest.raises(RuntimeError, match=f"rank 1's LM head rows start at id 64, not 1 x {head_rows}"):
        dw.alloc_memory_pool(memory_pool_config=None)


def test_steps_0_state_gets_the_one_node_verify_attention(monkeypatch):
    """build_adaptive_runtime_state: while SGLang builds steps 0's state, the target backends it makes attend as
    OneNodeVerifyAttention; other states' and later backends stay SGLang's."""
    from sglang.srt.layers.attention.triton_backend import TritonAttnBackend

    hooks_seen = []

    def stock_build(self, steps, n, cuda_graph_bs=None):  # SGLang builds the state's target backend this way
        hooks_seen.append(list(self._target_worker.model_runner.capture_tail_hooks))  # as its graph capture reads them
        return self._target_worker.model_runner._get_attention_backend(init_new_workspace=True)

    monkeypatch.setattr(EAGLEWorkerV2, "build_adaptive_runtime_state", stock_build)
    monkeypatch.delenv(config.PLAIN_OFF_ENV, raising=False)
    runner = SimpleNamespace(_get_attention_backend=lambda **kwargs: TritonAttnBackend.__new__(TritonAttnBackend),
                             capture_tail_hooks=[])
    w = EagleTritonWorkerV2.__new__(EagleTritonWorkerV2)
    w._target_worker = SimpleNamespace(model_runner=runner)
    w._draft_worker = SimpleNamespace(_tensor_parallel=None, _fill_rows=lambda *rows: None)
    w.server_args = SimpleNamespace(speculative_eagle_topk=1, disable_cuda_graph=False)
    assert type(w.build_adaptive_runtime_state(0, 1)) is verify.OneNodeVerifyAttention
    assert type(w.build_adaptive_runtime_state(3, 4)) is TritonAttnBackend
    assert type(runner._get_attention_backend()) is TritonAttnBackend  # SGLang's again after the build
    # steps 0's target graphs are captured with the graph epilogue's hook (off_step.GraphEpilogue), no other state's
    assert [len(h) for h in hooks_seen] == [1, 0] and hooks_seen[0][0] == w._graph_epilogue.hook
    assert runner.capture_tail_hooks == []
    # none where the plain step is off, without CUDA graphs, or with the draft under tensor parallelism
    for plain_off, no_graphs, tensor_parallel in (("0", False, None), (None, True, None), (None, False, object())):
        if plain_off is not None:
            monkeypatch.setenv(config.PLAIN_OFF_ENV, plain_off)
        else:
            monkeypatch.delenv(config.PLAIN_OFF_ENV, raising=False)
        w = EagleTritonWorkerV2.__new__(EagleTritonWorkerV2)
        w._target_worker = SimpleNamespace(model_runner=runner)
        w._draft_worker = SimpleNamespace(_tensor_parallel=tensor_parallel)
        w.server_args = SimpleNamespace(speculative_eagle_topk=1, disable_cuda_graph=no_graphs)
        w.build_adaptive_runtime_state(0, 1)
        assert hooks_seen[-1] == [] and w._graph_epilogue is None, (plain_off, no_graphs, tensor_parallel)


def test_adaptive_tree_candidates_are_built_with_their_draft_tokens(monkeypatch):
    """With topk > 1 SGLang's controller asks for steps + 1 draft tokens per candidate; each state is built with the
    config file's (config.adaptive_tree), steps 0 with one."""
    built = []
    monkeypatch.setattr(EAGLEWorkerV2, "build_adaptive_runtime_state",
                        lambda self, steps, n, cuda_graph_bs=None: built.append((steps, n)))
    runner = SimpleNamespace(_get_attention_backend=lambda **kwargs: None)
    w = EagleTritonWorkerV2.__new__(EagleTritonWorkerV2)
    w._target_worker = SimpleNamespace(model_runner=runner)
    w.server_args = SimpleNamespace(speculative_eagle_topk=4, disable_cuda_graph=True)  # the config file's draft
    # tokens, as read at start; no CUDA graphs: no graph epilogue for steps 0's
    adaptive_trees(monkeypatch, {0: (4, 1), 1: (4, 2), 3: (4, 12)})
    for steps in (0, 1, 3):
        w.build_adaptive_runtime_state(steps, steps + 1)
    assert built == [(0, 1), (1, 2), (3, 12)]


def test_each_adaptive_state_captures_its_draft_extend_at_its_own_width(monkeypatch):
    """SGLang 0.5.17's draft-extend graph runner takes its width from the server args (the initial state's draft
    tokens): while a state is built it gets the state's. From 0.5.18 SGLang reads each state's own (no server args,
    nothing rebound). Either way a state captured at another width is refused."""
    import inspect

    from sglang.srt.speculative import eagle_draft_extend_cuda_graph_runner as runner_module

    server_args = SimpleNamespace(speculative_eagle_topk=1, speculative_num_draft_tokens=4)
    stock_resolve = runner_module.resolve_num_tokens_per_req
    reads_server_args = "server_args" in inspect.signature(stock_resolve).parameters

    def stock_build(self, steps, n, cuda_graph_bs=None):  # as SGLang's runner constructor reads it
        if reads_server_args:
            width = runner_module.resolve_num_tokens_per_req(phase="draft_extend", server_args=server_args)
        else:  # 0.5.18+: the state's own settings, published per state
            width = n
        return SimpleNamespace(cuda_graph_runner_for_draft_extend=SimpleNamespace(captured_req_width=width))

    monkeypatch.setattr(EAGLEWorkerV2, "build_adaptive_runtime_state", stock_build)
    w = EagleTritonWorkerV2.__new__(EagleTritonWorkerV2)
    w._target_worker = SimpleNamespace(model_runner=SimpleNamespace(_get_attention_backend=lambda **kwargs: None))
    w.server_args = server_args
    assert w.build_adaptive_runtime_state(7, 8).cuda_graph_runner_for_draft_extend.captured_req_width == 8
    assert w.build_adaptive_runtime_state(1, 2).cuda_graph_runner_for_draft_extend.captured_req_width == 2
    assert runner_module.resolve_num_tokens_per_req is stock_resolve  # restored
    if reads_server_args:
        assert runner_module.resolve_num_tokens_per_req(phase="draft_decode", server_args=server_args) == 1
    monkeypatch.setattr(EAGLEWorkerV2, "build_adaptive_runtime_state", lambda self, steps, n, cuda_graph_bs=None:
                        SimpleNamespace(cuda_graph_runner_for_draft_extend=SimpleNamespace(captured_req_width=4)))
    with pytest.raises(RuntimeError, match="captured its draft-extend graph 4 tokens wide, not its 8"):
        w.build_adaptive_runtime_state(7, 8)


def test_rank_zero_decides_broadcasts_over_the_tp_cpu_group():
    """The cost policy's ``agree`` under TP: SGLang's ``broadcast_object`` from rank 0 (here a fake group whose
    rank 0 proposed 7); none on one GPU or without a group."""
    class Group:
        def __init__(self, world_size):
            self.world_size, self.calls = world_size, []

        def broadcast_object(self, obj, src=0):
            self.calls.append((obj, src))
            return 7

    assert worker.rank_zero_decides(None) is None and worker.rank_zero_decides(Group(1)) is None
    group = Group(2)
    assert worker.rank_zero_decides(group)(3) == 7 and group.calls == [(3, 0)]


def test_the_verify_attention_in_use_is_reported_and_required_under_1(monkeypatch):
    """Which attention the target verify runs, as the start-up log and /server_info say it: ours once the hook
    swapped the backend, else SGLang's and why; ``VERIFY_ATTENTION_ENV=1`` and a backend the hook did not swap:
    refuse to start rather than run SGLang's verify attention under our name."""
    from types import SimpleNamespace

    from sglang.srt.layers.attention.triton_backend import TritonAttnBackend

    runner = SimpleNamespace(page_size=1, kv_cache_dtype=torch.bfloat16)  # as the model runner resolved them
    plain = TritonAttnBackend.__new__(TritonAttnBackend)
    ours = TritonAttnBackend.__new__(TritonAttnBackend)
    ours.extend_attention_fwd = "SGLang's kernel"  # set by TritonAttnBackend.__init__
    ours = verify.tree_verify_attention(ours)
    assert worker.verify_attention_in_use(ours, runner) == config.VERIFY_ATTENTION_IN_USE
    assert "(the plugin's hook on SGLang" in worker.verify_attention_in_use(plain, runner)  # wanted, not swapped
    assert "our kernel replaces the triton backend's, not SimpleNamespace's" in worker.verify_attention_in_use(
        SimpleNamespace(), runner)
    fp8 = SimpleNamespace(page_size=1, kv_cache_dtype=torch.float8_e4m3fn)  # e.g. "auto" on an FP8 checkpoint
    assert "(a float8_e4m3fn KV pool" in worker.verify_attention_in_use(plain, fp8)
    assert "(--page-size 16" in worker.verify_attention_in_use(plain, SimpleNamespace(page_size=16,
                                                                                      kv_cache_dtype=torch.float16))
    monkeypatch.setenv(config.VERIFY_ATTENTION_ENV, "0")
    assert worker.verify_attention_in_use(plain, runner) == "SGLang's TritonAttnBackend (turned off)"
    monkeypatch.setenv(config.VERIFY_ATTENTION_ENV, "1")
    for backend, model_runner in ((plain, runner), (plain, fp8)):
        with pytest.raises(RuntimeError, match="not ours"):
            worker.verify_attention_in_use(backend, model_runner)
    assert worker.verify_attention_in_use(ours, runner) == config.VERIFY_ATTENTION_IN_USE


def test_the_verify_attention_check_waits_for_the_target_backends(monkeypatch):
    """SGLang builds the target's attention backends after every worker's constructor (Scheduler.init_model_worker:
    workers, memory pools, then init_all_attention_backends): the worker must not read them while it is constructed,
    and checks them once built (a constructor that read ``model_runner.attn_backend`` stopped every server)."""
    from types import SimpleNamespace

    from sglang.srt.layers.attention.triton_backend import TritonAttnBackend
    from sglang.srt.speculative import base_spec_worker, eagle_worker_v2

    runner = SimpleNamespace(page_size=1, kv_cache_dtype=torch.bfloat16)  # attn_backend: set by init_attention_backends

    def sglang_init(self, *args, **kwargs):
        self._target_worker = SimpleNamespace(model_runner=runner)
        self.adaptive_controller, self.speculative_num_steps, self.topk = None, 3, 1
        self.speculative_num_draft_tokens = 4

    monkeypatch.setattr(worker.glue, "check_glue", lambda *args, **kwargs: None)  # reads the real constructor's source
    monkeypatch.setattr(eagle_worker_v2.EAGLEWorkerV2, "__init__", sglang_init)
    monkeypatch.setattr(base_spec_worker.BaseSpecWorker, "init_attention_backends",
                        lambda self: setattr(runner, "attn_backend", TritonAttnBackend.__new__(TritonAttnBackend)))
    monkeypatch.setenv(config.VERIFY_ATTENTION_ENV, "1")
    monkeypatch.setenv(config.DRAFT_KIND_ENV, "eagle3")
    spec_worker = worker.EagleTritonWorkerV2()
    with pytest.raises(RuntimeError, match="not ours"):  # SGLang's plain backend: the hook did not reach it
        spec_worker.init_attention_backends()


class MetadataBackend:
    """A stand-in for SGLang's multi-step draft decode backend: records its metadata calls."""

    def __init__(self):
        self.calls = []

    def init_forward_metadata_out_graph(self, forward_batch, in_capture: bool = False):
        self.calls.append(("out_graph", in_capture))

    def init_forward_metadata(self, forward_batch):
        self.calls.append(("eager", False))


def test_the_draft_decode_metadata_nobody_reads_is_not_computed(monkeypatch):
    """The fused drafter reads req_to_token itself: before a draft replay or an eager draft SGLang's draft decode
    backend computes nothing (on the triton backend two Triton launches a cycle); capture still sets it up; our
    draft worker applies it to every backend SGLang makes (once per adaptive state), except in draft check mode,
    where SGLang's own draft runs beside ours and needs it."""
    backend = MetadataBackend()
    worker.without_draft_metadata(backend)
    backend.init_forward_metadata_out_graph("fb")
    backend.init_forward_metadata("fb")
    backend.init_forward_metadata_out_graph("fb", in_capture=True)
    assert backend.calls == [("out_graph", True)]
    worker.without_draft_metadata(None)  # a backend SGLang did not make

    made = []

    def parent_init(self):
        self.draft_attn_backend = MetadataBackend()
        made.append(self.draft_attn_backend)

    monkeypatch.setattr(EagleDraftWorker, "init_attention_backend", parent_init)
    w = TritonEagleDraftWorker.__new__(TritonEagleDraftWorker)
    monkeypatch.delenv(config.DRAFT_CHECK_ENV, raising=False)
    w.init_attention_backend()
    w.init_attention_backend()  # a second adaptive state: its own backend, also without
    for b in made:
        b.init_forward_metadata_out_graph("fb")
        assert b.calls == []
    monkeypatch.setenv(config.DRAFT_CHECK_ENV, "/tmp/check.jsonl")
    w.init_attention_backend()
    made[-1].init_forward_metadata_out_graph("fb")
    made[-1].init_forward_metadata("fb")
    assert made[-1].calls == [("out_graph", False), ("eager", False)]


# --- the lean draft phase (config.LEAN_DRAFT_ENV) -------------------------------------------------------------------


def _recorded_trees(dw):
    """dw.lean_tree wrapped for the CPU stand-in graphs: each call records a replay that recomputes the tree from the
    (static) inputs as they are then, into the outputs the captured call returned."""
    from tests.test_row_graphs import RecordedGraph, recording

    calls, tree = [], dw.lean_tree

    def recorded(drafter, *rows):
        out = tree(drafter, *rows)
        calls.append(lambda: [o.copy_(n) for o, n in zip(out, tree(drafter, *rows), strict=True)])
        return out

    dw.lean_tree = recorded
    return {"graph": RecordedGraph, "capturing": recording(calls)}


def test_the_lean_draft_verifies_the_fused_drafters_tree_from_the_relayed_input(fresh_counts, device, monkeypatch):
    """lean_draft: SGLang's build_eagle_verify_input gets the tree the fused drafter makes of the relayed draft
    input at positions seq_lens (what SGLang's prepare_for_draft sets), for batches of 1-5 requests with ragged
    lengths replayed from graphs of 1, 2, 4 (3 padded into 4, 5 eager above the largest) and eagerly without graphs;
    dispatched by draft() for a decode batch only, and counted. A batch without ``seq_lens_sum`` (a request joined
    or left) gets it from its CPU lengths first, as SGLang's preparation backfills it (the verify input sizes a
    FULL_MASK tree mask by it)."""
    w, gen = random_draft(True, device, seed=21)
    pool = random_batch(w, 5, TOPK, STEPS, [9, 4, 30, 1, 17], gen, device)
    built = []

    def build_eagle_verify_input(batch, draft_input, parent_list, top_scores_index, draft_tokens, draft_probs, **kw):
        built.append((parent_list.clone(), top_scores_index.clone(), draft_tokens.clone(), draft_probs, kw,
                      batch.seq_lens_sum))
        return "verify input"

    monkeypatch.setattr(sglang.srt.speculative.eagle_worker_v2, "build_eagle_verify_input", build_eagle_verify_input)
    graphed, eager = _bound_draft_worker(w, pool), _bound_draft_worker(w, pool)
    for dw in (graphed, eager):
        dw.lean, dw.target_worker, dw.tree_mask_mode, dw.device = True, "target", "mode", device
    shape = graphed.drafter_shape()
    if device == "cuda":
        graphed.capture_lean_draft({shape: [1, 2, 4]}, capturing=lambda g: torch.cuda.graph(g))
    else:
        graphed.capture_lean_draft({shape: [1, 2, 4]}, **_recorded_trees(graphed))
    monkeypatch.setattr(EagleDraftWorker, "draft", lambda self, batch: "stock")
    for rows in ([2], [4, 0, 3], [1, 3], [0, 1, 2, 3, 4], [3, 2, 1, 0]):
        idx = torch.tensor(rows, device=device)
        spec_info = SimpleNamespace(topk_p=pool["topk_p"][idx], topk_index=pool["topk_index"][idx],
                                    hidden_states=pool["hidden"][idx])
        seq_lens = pool["seq_lens"][idx]
        batch = SimpleNamespace(spec_info=spec_info, seq_lens=seq_lens, seq_lens_sum=None, seq_lens_cpu=seq_lens.cpu(),
                                req_pool_indices=pool["req_pool_indices"][idx], forward_mode=fake_sglang.ForwardMode())
        expected = graphed.fused_drafter.draft(spec_info.topk_p, spec_info.topk_index, spec_info.hidden_states,
                                               batch.seq_lens.repeat_interleave(TOPK), batch.seq_lens,
                                               batch.req_pool_indices)
        for dw in (graphed, eager):
            built.clear()
            assert dw.draft(batch) == "verify input"
            (tree, kw), = [(b[:3], b[4]) for b in built]
            assert all(torch.equal(t, e) for t, e in zip(tree, expected[:3], strict=True)), (rows, dw is graphed)
            assert built[0][3] is None and kw == dict(target_worker="target", topk=TOPK, num_steps=STEPS,
                                                      num_draft_tokens=N, tree_mask_mode="mode", device=device)
            assert built[0][5] == int(seq_lens.sum()), rows
    graphs = graphed._lean_graphs[shape]
    assert (graphs.replays, graphs.eager, graphs.mismatched) == (4, 1, 0)
    assert fresh_counts[worker.LEAN_DRAFT] == 10
    idle = SimpleNamespace(forward_mode=fake_sglang.ForwardMode(idle=True))
    assert graphed.draft(idle) == "stock" and fresh_counts[worker.LEAN_DRAFT] == 10  # SGLang's for an idle batch
    graphed.lean = False
    assert graphed.draft(batch) == "stock"  # not asked for: SGLang's draft phase



def check_out_of_memory(monkeypatch, env, reset, start, refused, declined, after=lambda: True) -> None:
    """A lean phase whose capture runs out of GPU memory: under ``env=1`` ``start()`` raises a RuntimeError matching
    ``refused``; unset, ``start()`` declines (``declined()`` holds). ``reset()`` runs before each, ``after()`` must
    hold after each."""
    for value in ("1", None):
        reset()
        with monkeypatch.context() as patch:
            if value:
                patch.setenv(env, value)
                with pytest.raises(RuntimeError, match=refused):
                    start()
            else:
                patch.delenv(env, raising=False)
                start()
                assert declined()
        assert after()

def test_the_lean_draft_starts_on_every_drafting_state_at_its_draft_graphs_sizes_or_refuses(monkeypatch, caplog):
    """EagleTritonWorkerV2.start_lean_draft: by default and under SGLANG_EAGLE_TRITON_LEAN_DRAFT=1 (nothing under
    =0) each drafting state's drafter shape captured at its draft graphs' sizes (static: the one shape), none with
    CUDA graphs off (the lean phase eager). Where it cannot run (--tp > 1, the draft check, paged trees, SGLang's
    preparation planning the verify's KV window on 0.5.22+, DSA seeding its top-k, a KV canary watching the draft):
    by default declined, SGLang's draft phase kept and the reason logged and reported; under =1 refused, naming the
    variable. A state without draft graphs (SGLang captures none at 1 step) at its verify graphs' sizes; a capture
    out of GPU memory declines it by default."""
    caplog.set_level(logging.INFO)
    captured = []
    dw = SimpleNamespace(capture_lean_draft=captured.append, lean=False, _lean_graphs=None,
                         draft_runner=SimpleNamespace(canary_manager=None), seed_dsa_topk_from_draft_extend=False,
                         drafter_shape=lambda steps=None: (1, steps if steps is not None else 3, 4),
                         cuda_graph_runner=SimpleNamespace(capture_bs=[4, 1, 2]))
    w = EagleTritonWorkerV2.__new__(EagleTritonWorkerV2)
    w._draft_worker, w.adaptive_controller, w.speculative_num_steps = dw, None, 3
    w.server_args = SimpleNamespace(disable_cuda_graph=False, tp_size=1, page_size=1, speculative_eagle_topk=4)
    w._target_worker = SimpleNamespace(model_runner=SimpleNamespace(
        decode_cuda_graph_runner=SimpleNamespace(capture_bs=[2, 1, 16])))
    monkeypatch.setattr(worker.glue, "lean_draft_problems", lambda: [])
    monkeypatch.setenv(config.LEAN_DRAFT_ENV, "0")
    w.start_lean_draft()
    assert not dw.lean and captured == [] and w.lean_draft_declined is None
    for value in (None, "1"):
        if value is None:
            monkeypatch.delenv(config.LEAN_DRAFT_ENV)
        else:
            monkeypatch.setenv(config.LEAN_DRAFT_ENV, value)
        dw.lean = False
        w.start_lean_draft()
        assert dw.lean and w.lean_draft_on and captured[-1] == {(1, 3, 4): [1, 2, 4]}, value
        assert w.lean_draft_declined is None, value
    for how in ("the default", "SGLANG_EAGLE_TRITON_LEAN_DRAFT=1"):
        assert f"the draft phase runs without SGLang's prepare_for_draft ({how})" in caplog.text
    draft_graphs, dw.cuda_graph_runner = dw.cuda_graph_runner, None  # a static 1-step server: its verify graphs'
    w.start_lean_draft()
    assert captured[-1] == {(1, 3, 4): [1, 2, 16]}
    dw.cuda_graph_runner = draft_graphs
    verify_graphs = SimpleNamespace(capture_bs=[2, 1])
    states = {0: SimpleNamespace(cuda_graph_runner=None, target_graph_runner=verify_graphs),
              1: SimpleNamespace(cuda_graph_runner=None, target_graph_runner=verify_graphs),
              5: SimpleNamespace(cuda_graph_runner=SimpleNamespace(capture_bs=[8, 1]),
                                 target_graph_runner=verify_graphs)}
    w.adaptive_controller = SimpleNamespace(_states=states)
    # steps 0 drafts nothing; a state without draft graphs (SGLang's 1 step) at its verify graphs' sizes
    w.start_lean_draft()
    assert captured[-1] == {(1, 1, 4): [1, 2], (1, 5, 4): [1, 8]}
    states[1].target_graph_runner = None  # no graphs at all: eager
    w.start_lean_draft()
    assert captured[-1] == {(1, 5, 4): [1, 8]}
    # a capture out of GPU memory: by default SGLang's draft phase (its graphs are there), under =1 refused
    dw.capture_lean_draft = lambda shapes: (_ for _ in ()).throw(torch.cuda.OutOfMemoryError("CUDA out of memory"))

    def reset():
        dw.lean, w.lean_draft_on, w.lean_draft_declined = False, False, None

    check_out_of_memory(monkeypatch, config.LEAN_DRAFT_ENV, reset, lambda: w.start_lean_draft(),
                        "LEAN_DRAFT=1, but capturing its drafter graphs ran out",
                        lambda: not dw.lean and not w.lean_draft_on and "out of GPU memory" in w.lean_draft_declined)
    dw.capture_lean_draft, w.lean_draft_declined = captured.append, None
    w.server_args.disable_cuda_graph = True
    w.start_lean_draft()
    assert len(captured) == 5 and dw.lean
    cases = ((worker.glue, "lean_draft_problems", lambda: ["moved"], "touchpoints moved: moved"),
             (dw, "seed_dsa_topk_from_draft_extend", True, "seeds DSA"),
             (dw.draft_runner, "canary_manager", True, "a KV canary"),
             (w.server_args, "tp_size", 2, "--tp 2"),
             (w.server_args, "page_size", 16, "--page-size 16 and --speculative-eagle-topk 4"),
             (os.environ, config.DRAFT_CHECK_ENV, "/tmp/check.jsonl", "SGLANG_EAGLE_TRITON_DRAFT_CHECK"))
    for owner, attr, value, why in cases:
        with monkeypatch.context() as patch:
            if owner is os.environ:
                patch.setenv(attr, value)
            else:
                patch.setattr(owner, attr, value)
            patch.setenv(config.LEAN_DRAFT_ENV, "1")
            with pytest.raises(RuntimeError, match=f"LEAN_DRAFT=1, but .*{re.escape(why)}.*unset SGLANG_EAGLE_TRITON"):
                w.start_lean_draft()
            patch.delenv(config.LEAN_DRAFT_ENV)
            dw.lean, w.lean_draft_on, w.lean_draft_declined, before = False, False, None, len(captured)
            caplog.clear()
            w.start_lean_draft()
            assert not dw.lean and not w.lean_draft_on and len(captured) == before, why
            assert why in w.lean_draft_declined, why
            assert "not the lean draft phase" in caplog.text and why in caplog.text
            # a server argument that rules it out is information; anything else a warning
            levels = {r.levelno for r in caplog.records if "not the lean draft phase" in r.getMessage()}
            assert levels == {logging.INFO if owner in (w.server_args, os.environ) else logging.WARNING}, why


def test_the_kernel_report_names_the_draft_phase_that_the_e2e_check_reads(fresh_counts, monkeypatch):
    """kernel_report's ``draft phase``: the lean one, or SGLang's with the reason it was declined; the e2e tests'
    check (tests.e2e.lean_draft_problem) passes only where every tree built came from a lean draft phase on one GPU,
    and none under tensor parallelism or SGLANG_EAGLE_TRITON_LEAN_DRAFT=0."""
    from tests.e2e import lean_draft_problem

    monkeypatch.delenv(config.LEAN_DRAFT_ENV, raising=False)
    w = EagleTritonWorkerV2.__new__(EagleTritonWorkerV2)
    w.adaptive_controller, w.cost_policy, w.lean_draft_on = None, None, True
    fresh_counts.update({worker.LEAN_DRAFT: 5, worker.BUILD_TREE: 5})
    report = w.kernel_report()
    assert report["kernels"]["draft phase"].startswith("lean") and lean_draft_problem(report) is None
    assert "lean draft phases where SGLang's" in lean_draft_problem(report, one_gpu=False)
    assert "lean draft phases where SGLang's" in lean_draft_problem(report, paged_tree=True)
    fresh_counts[worker.BUILD_TREE] = 6  # a tree built by SGLang's draft phase
    assert lean_draft_problem(w.kernel_report()) == "lean draft phases 5 of 6 drafts"
    w.lean_draft_on, w.lean_draft_declined = False, "--tp 2 (untested)"
    fresh_counts[worker.LEAN_DRAFT] = 0
    report = w.kernel_report()
    assert report["kernels"]["draft phase"] == ("SGLang's prepare_for_draft and draft graphs (lean declined: --tp 2 "
                                                "(untested))")
    assert lean_draft_problem(report, one_gpu=False) is None and lean_draft_problem(report) is not None
    w.lean_draft_declined = None  # declined without a reason in the report: caught
    assert "draft phase is ''" in lean_draft_problem(w.kernel_report(), one_gpu=False)
    monkeypatch.setenv(config.LEAN_DRAFT_ENV, "0")  # SGLang's draft phase asked for: no report line expected
    assert lean_draft_problem(w.kernel_report()) is None


def test_the_lean_draft_glue_holds_where_prepare_for_draft_plans_no_kv_window():
    """glue.lean_draft_problems: none on the SGLang releases whose prepare_for_draft plans no KV window (0.5.17 -
    0.5.21); on 0.5.22+ (``target_translator``: a chain's kv_loc_plan) the lean draft is declined (refused under =1)."""
    plans = "target_translator" in __import__("inspect").signature(eagle_worker_common.prepare_for_draft).parameters
    problems = worker.glue.lean_draft_problems()
    assert (problems != []) == plans, problems
    assert all("plans the verify's KV window" in p for p in problems)


def test_a_chain_lean_draft_leaves_the_batchs_sequence_lengths_alone(fresh_counts, device, monkeypatch):
    """topk 1 (a chain): the positions handed to the drafter, a broadcast of seq_lens, are a view of the batch's own
    sequence lengths, which the drafter advances in place; the lean draft copies them, eager and graphed."""
    w, gen = random_draft(True, device, seed=23)
    pool = random_batch(w, 3, 1, STEPS, [9, 4, 30], gen, device)
    built = []
    monkeypatch.setattr(sglang.srt.speculative.eagle_worker_v2, "build_eagle_verify_input",
                        lambda batch, draft_input, *tree, **kw: built.append([t.clone() for t in tree[:3]]))
    dw = _bound_draft_worker(w, pool, n=STEPS + 1)
    dw.topk, dw.server_args.speculative_eagle_topk = 1, 1
    dw.lean, dw.target_worker, dw.tree_mask_mode, dw.device = True, None, None, device
    seq_lens = pool["seq_lens"].clone()
    spec_info = SimpleNamespace(topk_p=pool["topk_p"], topk_index=pool["topk_index"], hidden_states=pool["hidden"])
    batch = SimpleNamespace(spec_info=spec_info, seq_lens=pool["seq_lens"], req_pool_indices=pool["req_pool_indices"],
                            forward_mode=fake_sglang.ForwardMode())
    expected = dw.fused_drafter.draft(pool["topk_p"], pool["topk_index"], pool["hidden"], seq_lens.clone(), seq_lens,
                                      pool["req_pool_indices"])
    dw.draft(batch)  # eager
    if device == "cuda":
        dw.capture_lean_draft({dw.drafter_shape(): [4]}, capturing=lambda g: torch.cuda.graph(g))
    else:
        dw.capture_lean_draft({dw.drafter_shape(): [4]}, **_recorded_trees(dw))
    dw.draft(batch)  # graphed, padded
    assert torch.equal(batch.seq_lens, seq_lens)
    for tree in built:
        assert all(torch.equal(t, e) for t, e in zip(tree, expected[:3], strict=True))
    assert len(built) == 2 and dw._lean_graphs[dw.drafter_shape()].replays == 1


def test_the_cost_policy_prices_held_steps_0_at_the_held_steps_cycle(monkeypatch):
    """Under the non-speculative route (off_route) the cost policy times each decode step at the batch's preparation:
    in a server that drafts at 5, moves to steps 0 (one plain step on the speculative path, then held steps), probes
    back and returns, steps 0's learnt rest is the held iteration's period less its graph, and the drafting state's
    its own (scheduler iterations of known length: held 1.9 ms, drafting 3.2 ms, the transitions 2.6 ms; the result
    of each step processed after the next one's launch, as SGLang's overlap loop does)."""
    from sgl_eagle_triton.adaptive import CostAwarePolicy, CycleCost
    from sgl_eagle_triton.glue import nonspec

    eagle = SpeculativeAlgorithm.EAGLE
    now = [0.0]
    w = _adaptive_worker([0, 5])
    w.speculative_num_steps = 5
    policy = CostAwarePolicy([0, 5], 5, clock=lambda: now[0], probe=(64, 1024, 4), reprice=None)
    policy.set_costs(CycleCost({(0, 4): 0.3, (5, 4): 0.6}))
    w.adaptive_controller.params = w.cost_policy = policy
    w.nonspec_on, w._ab_steps, w._nonspec_paused, w._plain_inflight, w._algorithm = True, 0, False, None, None
    monkeypatch.setattr(nonspec, "enter", lambda batch: setattr(batch, "spec_algorithm", nonspec.NO_SPEC))
    monkeypatch.setattr(nonspec, "leave", lambda batch, algorithm, stubs: setattr(batch, "spec_algorithm", algorithm))
    monkeypatch.setattr(nonspec, "can_stay", lambda batch: True)
    monkeypatch.setattr(nonspec, "trim", lambda batch: None)
    monkeypatch.setattr(nonspec, "feed_metrics", lambda processor, batch: None)
    w._draft_worker.stubs_of = lambda batch: (None, None, None)
    reqs = [object() for _ in range(4)]

    def plain_or_draft(batch, **_):  # the worker's step: a plain step at 0 (its fill leaves the draft stale)
        w._decided_at_prep = False
        plain = w.speculative_num_steps == 0 and w.draft_worker.fill_kv_only
        w._plain_inflight = reqs if plain else None
        w.draft_worker.draft_stale = plain
        return "plain" if plain else "draft"

    w._decode_step, w.plain_off = plain_or_draft, SimpleNamespace()
    w._nonspec_step = lambda batch: plain_or_draft(batch) and "held"
    batch = SimpleNamespace(reqs=reqs, spec_algorithm=eagle, seq_lens=torch.zeros(4), seq_lens_cpu=None,
                            return_logprob=False, return_hidden_states=False, has_grammar=False,
                            is_extend_in_batch=False,
                            forward_mode=SimpleNamespace(is_idle=lambda: False, is_extend=lambda: False))
    in_flight, ran = None, []
    for _ in range(400):
        w.prepare_decode(lambda b: None, batch)  # the policy's clock read here
        kind = w.forward_batch_generation(batch)
        ran.append(kind)
        if in_flight is not None:  # the step before's result, after this step's launch
            if in_flight == "held":
                w.feed_nonspec_step(SimpleNamespace(), batch)
            else:
                w.on_verify_complete_cpu([0] * 4, 4)  # nothing accepted: steps 0 is worth more
        in_flight = kind
        transition = len(ran) > 1 and ran[-2] != kind
        now[0] += (2.6 if transition else {"held": 1.9, "plain": 1.9, "draft": 3.2}[kind]) / 1e3
    assert ran.count("held") > 300 and "plain" in ran and policy.probes >= 1
    assert policy.costs.rest[0, 4] == pytest.approx(1.9 - 0.3, abs=0.05)
    assert policy.costs.rest[5, 4] == pytest.approx(3.2 - 0.6, abs=0.2)
