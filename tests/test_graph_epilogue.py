"""Steps 0's graph epilogue (sgl_eagle_triton/off_step.py GraphEpilogue): the greedy token and its draft KV fill
captured at the end of the steps-0 state's target CUDA graphs through SGLang's capture tail hook, and the plain step
taking the token from the graph only where SGLang's sampler would pick the same (CPU; small stand-ins for SGLang's
graph runner, forward batch and sampling info; the GPU run is tests/test_e2e_adaptive.py)."""

from types import SimpleNamespace

import pytest
import torch
from sglang.srt.model_executor.forward_batch_info import ForwardMode

from sgl_eagle_triton import worker
from sgl_eagle_triton.glue import call_sites
from sgl_eagle_triton.off_step import GraphEpilogue, PlainOff
from sgl_eagle_triton.worker import EagleTritonWorkerV2, TritonEagleDraftWorker
from tests.test_off_step import _batch, _target, init_new  # noqa: F401 (fixture)


class _Capture:
    """What SGLang's decode-graph capture hands a tail hook: the forward batch of the graph's static buffers and
    the forward's output; ``capturing`` says whether the call is the capture itself or a warm-up run."""

    def __init__(self, bs, width=1, vocab=10, features=4, mode=ForwardMode.TARGET_VERIFY, seed=0):
        g = torch.Generator().manual_seed(seed)
        n = bs * width
        # distinct maxima, at least 0.5 above the rest: no near-ties
        logits = torch.rand(n, vocab, generator=g)
        self.best = torch.randint(0, vocab, (n,), generator=g)
        logits[torch.arange(n), self.best] = 2.0
        self.out = SimpleNamespace(next_token_logits=logits, hidden_states=torch.randn(n, features, generator=g))
        self.fb = SimpleNamespace(forward_mode=mode, batch_size=bs, positions=torch.arange(n) + 100,
                                  out_cache_loc=torch.arange(n) + 7)
        self.n = n


def _epilogue(capturing=True, **kwargs):
    fills = []
    epilogue = GraphEpilogue(lambda *rows: fills.append(rows), capturing=lambda: capturing, **kwargs)
    return epilogue, fills


def test_the_epilogue_writes_the_greedy_token_and_fills_its_draft_kv():
    """Inside a steps-0 graph (TARGET_VERIFY, one token per request): argmax of the logits, the fill of that token
    with the target's features at the fed token's position and slot; the captured tokens kept by graph size."""
    epilogue, fills = _epilogue()
    for bs in (1, 2, 4):
        c = _Capture(bs, seed=bs)
        epilogue.hook("runner", c.out, c.fb, c.n)
        tokens, hidden, positions, slots = fills[-1]
        assert torch.equal(tokens, c.best) and tokens.dtype == torch.int64
        assert hidden is c.out.hidden_states and positions is c.fb.positions and slots is c.fb.out_cache_loc
        assert epilogue.tokens[bs] is tokens
    assert sorted(epilogue.tokens) == [1, 2, 4] and not epilogue.ambiguous


def test_the_epilogue_leaves_drafting_graphs_and_warm_up_runs_alone():
    epilogue, fills = _epilogue()
    c = _Capture(2, width=4)  # a drafting state's verify graph: four tokens per request
    epilogue.hook("runner", c.out, c.fb, c.n)
    c = _Capture(2, mode=ForwardMode.DECODE)
    epilogue.hook("runner", c.out, c.fb, c.n)
    c = _Capture(2)
    c.out.hidden_states = None  # captured without the hidden states the fill reads
    epilogue.hook("runner", c.out, c.fb, c.n)
    assert fills == [] and epilogue.tokens == {}
    warm, fills = _epilogue(capturing=False)  # a warm-up run fills (eagerly, harmless) but keeps no buffer
    c = _Capture(2)
    warm.hook("runner", c.out, c.fb, c.n)
    assert len(fills) == 1 and warm.tokens == {}


def test_the_tokens_of_a_batch_are_those_of_the_graph_it_is_padded_to():
    epilogue, _ = _epilogue()
    captured = {}
    for bs in (1, 2, 4, 8):
        c = _Capture(bs, seed=bs)
        epilogue.hook("runner", c.out, c.fb, c.n)
        captured[bs] = c.best
    assert torch.equal(epilogue.tokens_of(1), captured[1])
    assert torch.equal(epilogue.tokens_of(3), captured[4][:3])  # SGLang pads 3 to its 4-graph
    assert torch.equal(epilogue.tokens_of(5), captured[8][:5])
    assert epilogue.tokens_of(9) is None  # larger than any graph: SGLang runs it eagerly
    c = _Capture(4, seed=9)  # a second graph of size 4 (several streams or variants): whose tokens is unknown
    epilogue.hook("runner", c.out, c.fb, c.n)
    assert 4 in epilogue.ambiguous and epilogue.tokens_of(3) is None and epilogue.tokens_of(2) is not None


def test_the_epilogue_sanitizes_as_sglangs_sampler_when_told_to():
    c = _Capture(2)
    c.out.next_token_logits[0, 3] = float("nan")  # torch's argmax takes NaN as the maximum
    plain, _ = _epilogue()
    plain.hook("runner", c.out, c.fb, c.n)
    assert plain.tokens[2][0] == 3
    sanitized, _ = _epilogue(sanitize_nan=True)
    sanitized.hook("runner", c.out, c.fb, c.n)
    assert torch.equal(sanitized.tokens[2], c.best)


def _greedy(**changes):
    info = SimpleNamespace(is_all_greedy=True, has_custom_logit_processor=False, acc_additive_penalties=None,
                           acc_scaling_penalties=None, penalizer_orchestrator=SimpleNamespace(is_required=False),
                           grammar_mask=None, logit_bias=None, return_sampling_masks=None)
    for key, value in changes.items():
        setattr(info, key, value)
    return info


# each of these makes SGLang's sampler pick something else than the argmax of the raw logits
NOT_ARGMAX = {"sampled": {"is_all_greedy": False}, "custom processor": {"has_custom_logit_processor": True},
              "additive penalties": {"acc_additive_penalties": torch.zeros(1)},
              "scaling penalties": {"acc_scaling_penalties": torch.ones(1)},
              "penalizer": {"penalizer_orchestrator": SimpleNamespace(is_required=True)},
              "grammar": {"grammar_mask": object()}, "logit bias": {"logit_bias": torch.zeros(1)},
              "sampling masks": {"return_sampling_masks": [False, True]}}


def test_the_argmax_is_sglangs_sample_only_without_anything_that_moves_it():
    assert call_sites.argmax_is_sample(_greedy())
    assert call_sites.argmax_is_sample(_greedy(return_sampling_masks=[False], penalizer_orchestrator=None))
    for case, changes in NOT_ARGMAX.items():
        assert not call_sites.argmax_is_sample(_greedy(**changes)), case


def _captured_epilogue(sizes=(1, 2, 4), vocab=8):
    """An epilogue captured at ``sizes`` whose tokens differ from the sampler of tests.test_off_step._target (which
    picks (row + 2) % vocab): row i's token is 5 + i."""
    epilogue, fills = _epilogue()
    for bs in sizes:
        c = _Capture(bs, vocab=vocab)
        c.out.next_token_logits = torch.zeros(bs, vocab)
        c.out.next_token_logits[torch.arange(bs), (torch.arange(bs) + 5) % vocab] = 1.0
        epilogue.hook("runner", c.out, c.fb, c.n)
    return epilogue


@pytest.mark.usefixtures("init_new")
def test_a_greedy_plain_step_takes_the_graphs_token_and_fill():
    target, seen = _target()
    epilogue = _captured_epilogue()
    off, batch = PlainOff("cpu", epilogue), _batch()
    batch.spec_info = off.verify_input(batch, topk=1)
    result = off.step(batch, target, torch.arange(6 * 40, dtype=torch.int32).view(6, 40))
    assert off.filled and "sample" not in seen  # SGLang's sampler not called
    assert result.next_token_ids.tolist() == [5, 6, 7]  # the 4-graph's first three rows
    assert result.next_token_ids.data_ptr() != epilogue.tokens[4].data_ptr()  # a copy: the next replay rewrites
    assert result.next_draft_input.bonus_tokens.tolist() == [5, 6, 7]


@pytest.mark.usefixtures("init_new")
@pytest.mark.parametrize("case", ["sampled", "penalizer", "eager forward", "no graph of its size", "no epilogue"])
def test_any_other_plain_step_samples_with_sglang_and_fills_itself(case):
    target, seen = _target()
    epilogue = None if case == "no epilogue" else _captured_epilogue(sizes=(1, 2) if case == "no graph of its size"
                                                                    else (1, 2, 4))
    off, batch = PlainOff("cpu", epilogue), _batch()
    if case in NOT_ARGMAX:
        batch.sampling_info = _greedy(**NOT_ARGMAX[case])
    batch.spec_info = off.verify_input(batch, topk=1)
    forward = target.forward_batch_generation
    if case == "eager forward":  # the batch did not replay a graph: the epilogue's buffers are stale
        target.forward_batch_generation = lambda *a, **k: SimpleNamespace(**{**vars(forward(*a, **k)),
                                                                           "can_run_cuda_graph": False})
    result = off.step(batch, target, torch.arange(6 * 40, dtype=torch.int32).view(6, 40))
    assert not off.filled and "sample" in seen and result.next_token_ids.tolist() == [2, 3, 4]


def test_an_epilogue_never_captured_is_not_used():
    assert PlainOff("cpu", _epilogue()[0]).epilogue is None


def test_the_draft_worker_skips_its_fill_after_the_graphs_once(monkeypatch):
    d = TritonEagleDraftWorker.__new__(TritonEagleDraftWorker)
    d.topk, d._stubs = 1, None
    fills = []
    d._fill_graphs = lambda *rows: fills.append(rows)
    monkeypatch.setattr(call_sites, "draft_recurrent_hidden_state_spec", lambda runner: (4, torch.float32))
    d.draft_runner = None
    before = dict(worker.RAN)
    batch = _batch()
    result = SimpleNamespace(next_token_ids=torch.tensor([1, 2, 3]), next_draft_input=SimpleNamespace(),
                             logits_output=SimpleNamespace(hidden_states=torch.zeros(3, 4)))
    batch.out_cache_loc = torch.tensor([4, 5, 6])
    d.kv_filled_in_graph = True
    d.fill_draft_kv(batch, result)
    assert fills == [] and not d.kv_filled_in_graph  # once
    assert worker.RAN[worker.GRAPH_EPILOGUE] == before.get(worker.GRAPH_EPILOGUE, 0) + 1
    assert worker.RAN[worker.DRAFT_KV_FILL] == before.get(worker.DRAFT_KV_FILL, 0) + 1
    d.fill_draft_kv(batch, result)
    assert len(fills) == 1 and worker.RAN[worker.GRAPH_EPILOGUE] == before.get(worker.GRAPH_EPILOGUE, 0) + 1
    assert result.next_draft_input.topk_p.shape == (3, 1)  # the stubs either way


def _whole_graphs():
    from sglang.srt.model_executor.runner_backend.full_cuda_graph_backend import FullCudaGraphBackend

    return FullCudaGraphBackend.__new__(FullCudaGraphBackend)


def test_the_epilogue_is_used_only_if_it_went_once_into_every_steps_0_graph():
    w = EagleTritonWorkerV2.__new__(EagleTritonWorkerV2)
    state = SimpleNamespace(target_graph_runner=SimpleNamespace(capture_bs=[1, 2, 4], backend=_whole_graphs()))
    assert w._usable_graph_epilogue(state) is None  # none captured
    w._graph_epilogue = _captured_epilogue(sizes=(1, 2, 4))
    assert w._usable_graph_epilogue(state) is w._graph_epilogue
    pieces = SimpleNamespace(target_graph_runner=SimpleNamespace(capture_bs=[1, 2, 4], backend=object()))
    assert w._usable_graph_epilogue(pieces) is None  # SGLang's breakable backend: replays with eager breaks
    w._graph_epilogue = _captured_epilogue(sizes=(1, 4))  # a graph without it: its batches would read stale tokens
    assert w._usable_graph_epilogue(state) is None
    w._graph_epilogue = _captured_epilogue(sizes=(1, 2, 4, 4))
    assert w._usable_graph_epilogue(state) is None


def test_the_capture_tail_hook_is_there_for_the_capture_only():
    runner = SimpleNamespace(capture_tail_hooks=["sglang's"])
    with call_sites.capture_tail_hook(runner, "ours"):
        assert runner.capture_tail_hooks == ["sglang's", "ours"]
    assert runner.capture_tail_hooks == ["sglang's"]
    with call_sites.capture_tail_hook(runner, None):
        assert runner.capture_tail_hooks == ["sglang's"]


def test_the_epilogues_touchpoints_hold_on_this_sglang():
    assert call_sites.graph_epilogue_problems(SimpleNamespace(capture_tail_hooks=[])) == []
    assert call_sites.replays_whole_graphs(SimpleNamespace(backend=_whole_graphs()))
    assert not call_sites.replays_whole_graphs(None)
    assert call_sites.graph_epilogue_problems(SimpleNamespace()) == [
        "types.SimpleNamespace keeps no capture_tail_hooks list"]
