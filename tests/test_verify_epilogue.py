"""The greedy verify of chains inside the target's verify graphs (sgl_eagle_triton/verify_epilogue.py): the chain's
retrieve arrays are build_tree's, the hook's outputs are the reference walk's, they are served only for the graph
that wrote them and only where SGLang's sampler would take the argmax; the worker marks, checks and declines (CPU;
small stand-ins for SGLang's graph runner, forward batch and sampling info; the GPU run is the e2e tests)."""

import logging
from collections import Counter
from types import SimpleNamespace

import pytest
import torch
from sglang.srt.model_executor.forward_batch_info import ForwardMode

from sgl_eagle_triton import config, verify, verify_epilogue
from sgl_eagle_triton.devtools.reference import verify_greedy as reference
from sgl_eagle_triton.devtools.testing import draft_tree
from sgl_eagle_triton.glue import call_sites
from sgl_eagle_triton.kernels import build_tree
from sgl_eagle_triton.verify import RAN, VERIFY_GREEDY
from sgl_eagle_triton.verify_epilogue import VERIFY_IN_GRAPH, VerifyEpilogue, chain_tree, from_graph
from sgl_eagle_triton.worker import EagleTritonWorkerV2
from tests.test_graph_epilogue import _whole_graphs


@pytest.mark.parametrize("bs,steps", [(1, 1), (3, 3), (2, 6)])
def test_the_chain_tree_is_build_trees_tree_of_topk_1(bs, steps, device):
    gen = torch.Generator().manual_seed(bs * 10 + steps)
    n = steps + 1
    parent_list, selected = draft_tree(bs, 1, steps, n, gen)
    draft = torch.randint(0, 100, (bs, n - 1), generator=gen)
    seq_lens = torch.randint(1, 50, (bs,), generator=gen)
    inputs = [t.to(device) for t in (torch.zeros(bs, dtype=torch.int64), parent_list, selected, draft, seq_lens)]
    built = build_tree.build_tree_kernel_efficient(*inputs, int(seq_lens.sum()), 1, steps, n)
    for got, want in zip(chain_tree(bs, n, "cpu"), built[2:5], strict=True):
        assert got.dtype == torch.int64 and torch.equal(got, want.cpu())


class _Graph:
    """A target verify graph's capture as SGLang hands it to a tail hook: ``size`` requests of ``n`` tokens (the
    static input ids: the candidates, the bonus token first), logits whose argmax continues each request's chain
    for ``accepted[b]`` tokens then departs (distinct maxima, 1.0 above the rest: no near-ties)."""

    def __init__(self, size, n, accepted, vocab=37, mode=ForwardMode.TARGET_VERIFY, seed=0, device="cpu"):
        g = torch.Generator().manual_seed(seed)
        self.candidates = torch.randint(0, vocab, (size, n), generator=g)
        target = torch.randint(0, vocab, (size, n), generator=g)
        for b, m in enumerate(accepted):
            target[b, :m] = self.candidates[b, 1:m + 1]
            if m < n - 1:
                target[b, m] = (self.candidates[b, m + 1] + 1) % vocab  # the walk stops at depth m
        self.target = target
        logits = torch.rand(size * n, vocab, generator=g)
        logits[torch.arange(size * n), target.flatten()] = 2.0
        self.out = SimpleNamespace(next_token_logits=logits.to(device), hidden_states=None)
        self.fb = SimpleNamespace(forward_mode=mode, batch_size=size, input_ids=self.candidates.flatten().to(device))
        self.num_tokens = size * n

    def capture(self, epilogue):
        epilogue.hook("runner", self.out, self.fb, self.num_tokens)

    def replay_logits(self, bs):
        """What SGLang's replay hands the verify: the graph's logits buffer cut to the batch's rows."""
        return self.out.next_token_logits[: bs * (self.num_tokens // self.fb.batch_size)]


def _want(graph, bs, n):
    predict = torch.zeros(bs * n, dtype=torch.int32)
    accept_index = torch.full((bs, n), -1, dtype=torch.int32)
    num = torch.empty(bs, dtype=torch.int32)
    reference.verify_tree_greedy(predict, accept_index, num, graph.candidates[:bs], *chain_tree(bs, n, "cpu"),
                                 graph.target[:bs])
    return predict, num + 1, accept_index


def _verify_input(n, steps=None, topk=1):
    return SimpleNamespace(draft_token_num=n, spec_steps=n - 1 if steps is None else steps, topk=topk)


def _epilogue(n=4, capturing=True):
    epilogue = VerifyEpilogue(capturing=lambda: capturing)
    epilogue.chain = (n, n)
    return epilogue


@pytest.mark.parametrize("size,bs", [(1, 1), (4, 4), (4, 3), (8, 5)])
def test_the_graph_writes_the_reference_walks_outputs(size, bs, device):
    """Accepting none, some and all of a chain, in a graph of the batch's size or padded to a larger one."""
    n = 4
    epilogue = _epilogue(n)
    accepted = [(b * 2) % n for b in range(size)]  # 0, 2, 0 (n - 1 = 3: all) ...
    accepted[-1] = n - 1
    graph = _Graph(size, n, accepted, seed=size, device=device)
    graph.capture(epilogue)
    epilogue.enable(n)
    got = epilogue.outputs(_verify_input(n), bs, graph.replay_logits(bs))
    want = _want(graph, bs, n)
    for g, w in zip(got, want, strict=True):
        assert g.dtype == torch.int32 and torch.equal(g.cpu(), w)
    assert got[1].tolist() == [m + 1 for m in accepted[:bs]]


def test_outputs_are_copies_a_later_replay_does_not_change(device):
    epilogue, graph = _epilogue(), _Graph(2, 4, [1, 3], device=device)
    graph.capture(epilogue)
    epilogue.enable(4)
    predict, lens, index = epilogue.outputs(_verify_input(4), 2, graph.replay_logits(2))
    epilogue.captured[4, 2].flat.fill_(-7)
    assert lens.tolist() == [2, 4] and (predict != -7).all() and (index != -7).all()


def test_only_the_graph_that_ran_is_read(device):
    epilogue = _epilogue()
    graphs = {size: _Graph(size, 4, [1] * size, seed=size, device=device) for size in (1, 2, 4)}
    for graph in graphs.values():
        graph.capture(epilogue)
    vi = _verify_input(4)
    assert epilogue.outputs(vi, 2, graphs[2].replay_logits(2)) is None  # not enabled yet
    epilogue.enable(4)
    assert epilogue.outputs(vi, 3, graphs[4].replay_logits(3)) is not None  # padded to 4
    assert epilogue.outputs(vi, 3, graphs[4].replay_logits(3).clone()) is None  # an eager forward's logits
    assert epilogue.outputs(vi, 2, graphs[4].replay_logits(2)) is None  # not the graph a batch of 2 replays
    assert epilogue.outputs(vi, 5, torch.zeros(20, 37)) is None  # larger than every graph: eager
    assert epilogue.outputs(_verify_input(4, topk=2), 2, graphs[2].replay_logits(2)) is None
    assert epilogue.outputs(_verify_input(4, steps=5), 2, graphs[2].replay_logits(2)) is None
    assert epilogue.outputs(_verify_input(3), 2, graphs[2].replay_logits(2)) is None  # another state's n
    _Graph(2, 4, [0, 0], seed=9, device=device).capture(epilogue)  # a second graph of size 2: whose outputs is unknown
    assert epilogue.outputs(vi, 2, graphs[2].replay_logits(2)) is None and epilogue.sizes(4) == [1, 4]


def test_other_graphs_and_warm_up_runs_are_left_alone(device):
    epilogue = _epilogue()
    _Graph(2, 4, [1, 1], mode=ForwardMode.DECODE, device=device).capture(epilogue)
    _Graph(2, 3, [1, 1], device=device).capture(epilogue)  # three tokens a request: not the chain being captured
    epilogue.chain = None
    _Graph(2, 4, [1, 1], device=device).capture(epilogue)
    warm = _epilogue(capturing=False)
    _Graph(2, 4, [1, 1], device=device).capture(warm)
    assert epilogue.captured == {} and warm.captured == {}


def _batch(**info):
    return SimpleNamespace(forward_mode=SimpleNamespace(is_idle=lambda: False), seq_lens=torch.zeros(2),
                           sampling_info=SimpleNamespace(**{"is_all_greedy": True, **info}))


@pytest.mark.parametrize("case", ["greedy", "penalty", "bias", "sampled", "grammar", "uno", "simulated", "eager"])
def test_a_verify_takes_the_graphs_outputs_only_where_the_argmax_is_the_sample(case, monkeypatch, device, caplog):
    monkeypatch.setattr(verify, "RAN", Counter())  # a fresh process's: the first serve logs the kernel's line
    epilogue, graph = _epilogue(), _Graph(2, 4, [2, 0], device=device)
    graph.capture(epilogue)
    epilogue.enable(4)
    calls = []
    sample = from_graph(epilogue, lambda *args, **kwargs: calls.append(args) or "eagle_sample")
    monkeypatch.setattr(call_sites, "sglang_simulates_acceptance", lambda: case == "simulated")
    info = {"penalty": {"acc_additive_penalties": torch.zeros(2, 37)}, "bias": {"logit_bias": torch.zeros(2, 37)},
            "sampled": {"is_all_greedy": False}}.get(case, {})
    batch = _batch(**info)
    logits = graph.replay_logits(2).clone() if case == "eager" else graph.replay_logits(2)
    kwargs = {"uno_target_max_top_k": 4} if case == "uno" else {}
    with caplog.at_level(logging.INFO, logger=verify.__name__):
        result = sample(_verify_input(4), batch, SimpleNamespace(next_token_logits=logits),
                        object() if case == "grammar" else None, **kwargs)
    ran = verify.RAN
    if case == "greedy":
        assert calls == [] and ran[VERIFY_IN_GRAPH] == ran[VERIFY_GREEDY] == 1 and result[1].tolist() == [3, 1]
        # the e2e tests read this line as the proof that our greedy kernel ran
        assert "triton verify_tree_greedy ran (inside the target's verify graph; first call" in caplog.text
    else:
        assert result == "eagle_sample" and len(calls) == 1 and ran[VERIFY_IN_GRAPH] == 0 and "ran" not in caplog.text


# -- the worker ---------------------------------------------------------------------------------------------------


def _worker(monkeypatch, topk=1, tp=1, steps=3, n=4, adaptive=None):
    w = EagleTritonWorkerV2.__new__(EagleTritonWorkerV2)
    w.server_args = SimpleNamespace(tp_size=tp, disable_cuda_graph=False, speculative_eagle_topk=topk)
    monkeypatch.setattr(config.glue_args, "settings", lambda sa: sa)
    w.verify_epilogue = VerifyEpilogue(capturing=lambda: True)
    w.speculative_num_steps, w.speculative_num_draft_tokens, w.adaptive_controller = steps, n, adaptive
    w._target_worker = SimpleNamespace(model_runner=SimpleNamespace(capture_tail_hooks=[]))
    return w


def test_the_worker_hooks_the_targets_captures_with_the_initial_chain_marked(monkeypatch):
    w = _worker(monkeypatch)
    w.mark_chain_graphs()
    assert w.target_worker.model_runner.capture_tail_hooks == [w.verify_epilogue.hook]
    assert w.verify_epilogue.chain == (4, 4) and w.verify_in_graph_declined is None


@pytest.mark.parametrize("case", ["topk", "tp", "sanitize", "no hooks"])
def test_the_worker_declines_where_it_cannot_run(case, monkeypatch):
    def make():
        w = _worker(monkeypatch, topk=4 if case == "topk" else 1, tp=2 if case == "tp" else 1)
        if case == "no hooks":
            w._target_worker.model_runner = SimpleNamespace()
        return w

    monkeypatch.setattr(call_sites, "sanitizes_nan_logits", lambda: case == "sanitize")
    w = make()
    w.mark_chain_graphs()
    assert w.verify_in_graph_declined and w.verify_epilogue.chain is None
    assert getattr(w.target_worker.model_runner, "capture_tail_hooks", []) == []
    monkeypatch.setenv(config.VERIFY_IN_GRAPH_ENV, "1")
    with pytest.raises(RuntimeError, match=config.VERIFY_IN_GRAPH_ENV):
        make().mark_chain_graphs()


def _runner(sizes, whole=True, ragged=False):
    return SimpleNamespace(capture_bs=list(sizes), backend=_whole_graphs() if whole else object(),
                           ragged_verify_mode=ragged)


def _adaptive(**states):
    return SimpleNamespace(_states={int(s): SimpleNamespace(speculative_num_draft_tokens=n, target_graph_runner=r)
                                    for s, (n, r) in states.items()})


def test_each_chain_state_is_served_only_if_every_verify_graph_took_the_epilogue(monkeypatch, device):
    runners = {"1": (2, _runner([1, 2, 4])), "3": (4, _runner([1, 2, 4])), "5": (6, _runner([1, 2, 4])),
               "7": (8, _runner([1, 2, 4], whole=False)), "2": (3, _runner([1, 2, 4], ragged=True)),
               "0": (1, _runner([1, 2, 4]))}
    w = _worker(monkeypatch, adaptive=_adaptive(**{f"{s}": r for s, r in runners.items()}))
    for steps, (n, _) in runners.items():
        w.verify_epilogue.chain = (n, n)
        for size in (1, 2) if steps == "5" else (1, 2, 4):  # state 5 missed a graph
            _Graph(size, n, [0] * size, device=device).capture(w.verify_epilogue)
    w.start_verify_in_graph()
    assert w.verify_epilogue.enabled == {2, 4} and w.verify_in_graph_declined is None
    w = _worker(monkeypatch, adaptive=_adaptive(**{"5": runners["5"]}))
    w.start_verify_in_graph()
    assert w.verify_epilogue.enabled == set() and "5 steps" in w.verify_in_graph_declined


def test_adaptive_states_are_marked_while_they_are_built(monkeypatch):
    w = _worker(monkeypatch)
    seen = []
    with w._chain_capture(5, 6):
        seen.append(w.verify_epilogue.chain)
    with w._chain_capture(0, 1):  # steps 0: its one-token graphs are the plain step's
        seen.append(w.verify_epilogue.chain)
    assert seen == [(6, 6), None] and w.verify_epilogue.chain is None
    w.verify_in_graph_declined = "declined"
    with w._chain_capture(5, 6):
        assert w.verify_epilogue.chain is None


def test_the_variable_is_validated(monkeypatch):
    monkeypatch.setenv(config.VERIFY_IN_GRAPH_ENV, "yes")
    assert config.verify_in_graph_mode() == "off"
    for value, mode in (("1", "on"), ("0", "off")):
        monkeypatch.setenv(config.VERIFY_IN_GRAPH_ENV, value)
        assert config.verify_in_graph_mode() == mode
    monkeypatch.delenv(config.VERIFY_IN_GRAPH_ENV)
    assert config.verify_in_graph_mode() == "auto"  # the default: wherever it can run
    sa = SimpleNamespace(tp_size=1, disable_cuda_graph=True, speculative_eagle_topk=1)
    monkeypatch.setattr(config.glue_args, "settings", lambda sa: sa)
    assert "--disable-cuda-graph" in config.verify_in_graph_unserved(sa)[0]
    sa.disable_cuda_graph = False
    assert config.verify_in_graph_unserved(sa) is None


def test_the_module_names_its_report_key():
    assert verify_epilogue.VERIFY_IN_GRAPH == "greedy verify in the target graph"


def test_the_kernel_report_says_where_greedy_verifies_ran_as_the_e2e_check_reads(monkeypatch):
    from tests.e2e import verify_in_graph_problem

    monkeypatch.setenv(config.VERIFY_IN_GRAPH_ENV, "1")
    w = _worker(monkeypatch)
    w.cost_policy = None
    w.verify_epilogue.enable(4)
    monkeypatch.setitem(RAN, VERIFY_IN_GRAPH, 3)
    report = w.kernel_report()
    assert report["kernels"]["greedy verify"].startswith("inside") and verify_in_graph_problem(report) is None
    assert "where none should" in verify_in_graph_problem(report, one_gpu=False)
    assert "where none should" in verify_in_graph_problem(report, chain=False)
    monkeypatch.setitem(RAN, VERIFY_IN_GRAPH, 0)
    assert verify_in_graph_problem(w.kernel_report()) == "no greedy verify ran inside the target's graph"
    w.verify_epilogue.enabled.clear()
    w.verify_in_graph_declined = "--tp 2 (untested under tensor parallelism)"
    report = w.kernel_report()
    assert report["kernels"]["greedy verify"].startswith("after the target's graphs (in-graph declined: --tp 2")
    assert verify_in_graph_problem(report, one_gpu=False) is None and verify_in_graph_problem(report) is not None


@pytest.mark.gpu
def test_the_epilogue_replayed_in_a_cuda_graph_matches_the_reference_walk():
    """Captured in a real CUDA graph (a stand-in forward: the logits copied from a static input), replayed with new
    candidates and logits, batches of the graph's size and padded to it: the reference walk's outputs each time."""
    n, size, vocab = 4, 8, 1000
    logits_in = torch.zeros(size * n, vocab, device="cuda")
    fb = SimpleNamespace(forward_mode=ForwardMode.TARGET_VERIFY, batch_size=size,
                         input_ids=torch.zeros(size * n, dtype=torch.int64, device="cuda"))
    epilogue = VerifyEpilogue()
    epilogue.chain = (n, n)
    out = {}

    def forward():
        out["logits"] = logits_in * 1.0
        epilogue.hook("runner", SimpleNamespace(next_token_logits=out["logits"]), fb, size * n)

    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        forward()  # warm-up (compiles the kernel; records nothing)
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        forward()
    assert epilogue.sizes(n) == [size]
    epilogue.enable(n)
    for seed, bs in ((1, 8), (2, 5), (3, 1)):
        case = _Graph(size, n, [(seed + b) % n for b in range(size)], vocab=vocab, seed=seed, device="cuda")
        logits_in.copy_(case.out.next_token_logits)
        fb.input_ids.copy_(case.fb.input_ids)
        graph.replay()
        got = epilogue.outputs(_verify_input(n), bs, out["logits"][: bs * n])
        for g, w in zip(got, _want(case, bs, n), strict=True):
            assert torch.equal(g.cpu(), w)


def test_an_ab_inside_one_server_alternates_the_verify_every_n_decode_steps(monkeypatch):
    """config.AB_STEPS_ENV: blocks of N decode steps verify in the graph, then after it, the cycle timing told each
    step's arm; a prefill or an idle batch is no step of either."""
    parent = call_sites.EAGLEWorkerV2  # SGLang's
    monkeypatch.setattr(parent, "forward_batch_generation", lambda self, batch: "out")
    w = _worker(monkeypatch)
    w.cost_policy, w._ab_steps = None, 2
    w.verify_epilogue.enable(4)
    w._cycle_timing = SimpleNamespace(arm="")
    seen = []

    def step(extend=False, idle=False):
        batch = SimpleNamespace(forward_mode=SimpleNamespace(is_extend=lambda: extend, is_idle=lambda: idle),
                                is_extend_in_batch=False)
        w.forward_batch_generation(batch)
        seen.append((w._cycle_timing.arm, w.verify_epilogue.paused))

    for _ in range(3):
        step()
    step(extend=True)
    step(idle=True)
    step()
    assert seen == [("in-graph", False), ("in-graph", False), ("after", True), ("after", True), ("after", True),
                    ("after", True)]
    step()
    assert seen[-1] == ("in-graph", False)


def test_an_ab_needs_the_cycle_timing_and_the_verify_in_graph(monkeypatch):
    monkeypatch.setenv(config.AB_STEPS_ENV, "16")
    assert config.ab_steps() == 16
    monkeypatch.setenv(config.AB_STEPS_ENV, "x")
    assert config.ab_steps() is None


def test_an_ab_of_the_lean_draft_phase_alternates_it(monkeypatch):
    """config.AB_FEATURE_ENV=lean_draft: blocks of the lean draft phase and SGLang's; nothing where it did not start."""
    parent = call_sites.EAGLEWorkerV2  # SGLang's
    monkeypatch.setattr(parent, "forward_batch_generation", lambda self, batch: "out")
    w = _worker(monkeypatch)
    w.cost_policy, w._ab_steps, w._ab_feature, w.lean_draft_on = None, 1, "lean_draft", True
    draft = SimpleNamespace(lean=True)
    monkeypatch.setattr(EagleTritonWorkerV2, "draft_worker", property(lambda self: draft))
    w._cycle_timing = SimpleNamespace(arm="")
    batch = SimpleNamespace(forward_mode=SimpleNamespace(is_extend=lambda: False, is_idle=lambda: False),
                            is_extend_in_batch=False)
    seen = []
    for _ in range(3):
        w.forward_batch_generation(batch)
        seen.append((w._cycle_timing.arm, draft.lean))
    assert seen == [("lean", True), ("sglang-draft", False), ("lean", True)]
    w.lean_draft_on, w._cycle_timing.arm = False, ""
    w.forward_batch_generation(batch)
    assert w._cycle_timing.arm == "" and draft.lean
