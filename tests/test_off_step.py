"""Adaptive steps 0 as a plain decode step (sgl_eagle_triton/off_step.py; by default where it can run,
``SGLANG_EAGLE_TRITON_PLAIN_OFF`` 1 requires it, 0 keeps SGLang's verify) on the CPU: which batches take it, the
one-token forward and SGLang's sampler it runs, the result SGLang's spec-v2 result processing reads, the worker's
routing inside SGLang's steps-0 flow, and the start-up checks (small stand-ins for SGLang's runner, worker and
batch)."""

from types import SimpleNamespace

import pytest
import torch
from sglang.srt.managers.scheduler_components.batch_result_processor import SchedulerBatchResultProcessor
from sglang.srt.managers.utils import GenerationBatchResult
from sglang.srt.model_executor.forward_batch_info import CaptureHiddenMode, ForwardBatch, ForwardMode
from sglang.srt.speculative.eagle_info import EagleDraftInput, EagleVerifyInput
from sglang.srt.speculative.eagle_worker_v2 import EAGLEWorkerV2
from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

from sgl_eagle_triton import config, off_step, verify, worker
from sgl_eagle_triton.glue import call_sites, nonspec
from sgl_eagle_triton.off_step import PlainOff
from sgl_eagle_triton.worker import EagleTritonWorkerV2, TritonEagleDraftWorker
from tests import fake_sglang


def _batch(seq_lens=(7, 30, 2), rows=(3, 1, 5), bonus=(11, 12, 13), **flags):
    """A steps-0 decode batch as SGLang's scheduler hands it to the worker: spec-v2 ``seq_lens`` (committed tokens,
    the bonus token excluded), the relayed bonus tokens in ``spec_info``."""
    return SimpleNamespace(
        forward_mode=fake_sglang.ForwardMode(idle=flags.get("idle", False)),
        return_logprob=flags.get("return_logprob", False), return_hidden_states=flags.get("hidden", False),
        has_grammar=flags.get("grammar", False), seq_lens=torch.tensor(seq_lens), req_pool_indices=torch.tensor(rows),
        spec_info=SimpleNamespace(bonus_tokens=torch.tensor(bonus)), input_ids=None, out_cache_loc=None,
        sampling_info=SimpleNamespace(is_all_greedy=True))


def test_only_plain_batches_take_the_plain_step():
    assert off_step.serves(_batch())
    for flag in ("idle", "return_logprob", "hidden", "grammar"):
        assert not off_step.serves(_batch(**{flag: True})), flag


def test_the_one_node_input_is_sglangs_without_launches():
    off, batch = PlainOff("cpu"), _batch()
    verify_input = off.verify_input(batch, topk=1)
    assert isinstance(verify_input, EagleVerifyInput) and verify_input.is_verify_input()
    assert verify_input.draft_token is batch.spec_info.bonus_tokens and verify_input.draft_token_num == 1
    assert verify_input.positions is batch.seq_lens and verify_input.custom_mask is None  # int64 already: no cast
    assert verify_input.retrieve_index.tolist() == [[0], [1], [2]]
    assert verify_input.retrieve_next_token.tolist() == [[-1]] * 3
    again = off.verify_input(_batch(), topk=1)  # per-size constants, made once
    assert again.retrieve_index is verify_input.retrieve_index
    assert off.verify_input(_batch(seq_lens=(4,), rows=(2,), bonus=(9,)), topk=1).retrieve_index.tolist() == [[0]]


def test_a_held_steps_input_is_one_object_a_batch_size_with_this_steps_tokens_and_positions():
    """PlainOff.held_input: the one-node input of a held step, made at a size's first held step and then given each
    step's tokens and positions (int64), the size's constants kept; another size or topk gets its own."""
    off = PlainOff("cpu")
    first = off.held_input(torch.tensor([5, 6]), torch.tensor([10, 20]), topk=1)
    assert first.draft_token.tolist() == [5, 6] and first.positions.tolist() == [10, 20]
    tokens, lengths = torch.tensor([7, 8]), torch.tensor([11, 21], dtype=torch.int32)
    again = off.held_input(tokens, lengths, topk=1)
    assert again is first and again.draft_token is tokens and again.positions.dtype == torch.int64
    assert again.positions.tolist() == [11, 21] and again.retrieve_index.tolist() == [[0], [1]]
    assert again.draft_token_num == 1 and again.custom_mask is None
    other = off.held_input(torch.tensor([1]), torch.tensor([3]), topk=1)
    assert other is not first and other.retrieve_index.tolist() == [[0]]
    assert off.held_input(tokens, lengths, topk=2) is not first


def _target(vocab=8, features=6):
    """A target worker whose forward returns logits favouring token ``(row + 2) % vocab`` and whose sampler is the
    argmax, recording what SGLang's would be handed."""
    seen = {}

    def forward_batch_generation(batch, forward_batch=None, is_verify=False, **kwargs):
        seen["forward"] = (batch, forward_batch, is_verify, forward_batch.forward_mode)
        bs = forward_batch.input_ids.shape[0]
        logits = torch.zeros(bs, vocab)
        logits[torch.arange(bs), (torch.arange(bs) + 2) % vocab] = 1.0
        seen["output"] = GenerationBatchResult(  # as TpModelWorker's verify forward returns it: no token
            logits_output=SimpleNamespace(next_token_logits=logits, hidden_states=torch.randn(bs, features)),
            can_run_cuda_graph=True)
        return seen["output"]

    def sample(logits_output, forward_batch):
        seen["sample"] = (logits_output, forward_batch.forward_mode)
        return torch.argmax(logits_output.next_token_logits, -1)

    runner = SimpleNamespace(sample=sample)
    return SimpleNamespace(model_runner=runner, forward_batch_generation=forward_batch_generation), seen


@pytest.fixture
def init_new(monkeypatch):
    """SGLang's ``ForwardBatch.init_new`` as a recorder: the forward batch holds what the step put on the batch."""
    made = []

    def fake(batch, model_runner, *, capture_hidden_mode=None, return_hidden_states_before_norm):
        fb = SimpleNamespace(forward_mode=batch.forward_mode, input_ids=batch.input_ids, seq_lens=batch.seq_lens,
                             out_cache_loc=batch.out_cache_loc, positions=batch.spec_info.positions,
                             capture_hidden_mode=capture_hidden_mode, model_runner=model_runner)
        made.append(fb)
        return fb

    monkeypatch.setattr(ForwardBatch, "init_new", staticmethod(fake))
    return made


def test_the_plain_step_is_the_targets_one_token_forward_and_sglangs_sampler(init_new):
    """The bonus token is fed at its reserved slot (req_to_token at the committed length) and position, the target's
    one-token forward captures the hidden states the draft KV fill reads, SGLang's no-spec sampler picks the token
    (seeing a decode step: no-spec's positions), and the result is the one SGLang's verify would hand over for one
    committed token per request."""
    target, seen = _target()
    off, batch = PlainOff("cpu"), _batch()
    batch.spec_info = off.verify_input(batch, topk=1)
    req_to_token = torch.arange(6 * 40, dtype=torch.int32).view(6, 40)
    result = off.step(batch, target, req_to_token)

    fb, = init_new
    assert batch.input_ids.tolist() == [11, 12, 13] and batch.forward_mode == ForwardMode.TARGET_VERIFY
    assert batch.out_cache_loc.dtype == torch.int64
    assert batch.out_cache_loc.tolist() == [3 * 40 + 7, 40 + 30, 5 * 40 + 2]  # req_to_token[row, seq_len]
    assert fb.capture_hidden_mode == CaptureHiddenMode.FULL and fb.positions.tolist() == [7, 30, 2]
    assert seen["forward"] == (None, fb, True, ForwardMode.TARGET_VERIFY)
    assert seen["sample"][1] == ForwardMode.DECODE and fb.forward_mode == ForwardMode.TARGET_VERIFY  # restored
    assert isinstance(result, GenerationBatchResult) and result.speculative_num_draft_tokens == 1
    assert result.next_token_ids.tolist() == [2, 3, 4] and result.logits_output is seen["sample"][0]
    assert result.accept_lens.dtype == torch.int32 and result.accept_lens.tolist() == [1, 1, 1]
    assert result.new_seq_lens.tolist() == [8, 31, 3] and result.can_run_cuda_graph
    assert isinstance(result.next_draft_input, EagleDraftInput)
    assert result.next_draft_input.bonus_tokens.dtype == torch.int32
    assert result.next_draft_input.bonus_tokens.tolist() == [2, 3, 4] and result.extra_keep_alive_refs == [fb]


def test_a_held_step_takes_the_slots_and_lengths_sglangs_preparation_made(init_new):
    """Under the non-speculative route (off_route): the slots are the preparation's ``out_cache_loc`` (no gather from
    ``req_to_token``, which here holds other slots), the lengths after the token its ``seq_lens``, and the result has no
    accept lengths; SGLang's non-speculative result processing reads the token alone, and its copy to the host copies
    nothing else."""
    target, seen = _target()
    off, batch = PlainOff("cpu"), _batch()
    batch.spec_info = off.verify_input(batch, topk=1)
    slots, after = torch.tensor([101, 102, 103]), torch.tensor([8, 31, 3])
    result = off.step(batch, target, torch.zeros(6, 40, dtype=torch.int32), off_step.HeldStep(slots, after))
    fb, = init_new
    assert batch.out_cache_loc is slots and fb.out_cache_loc is slots
    assert result is seen["output"] and result.extra_keep_alive_refs == [fb]  # the forward's own result, as no-spec's
    assert result.new_seq_lens is after and result.accept_lens is None
    assert result.next_token_ids.tolist() == [2, 3, 4]
    assert result.next_draft_input is None  # the scheduler relays the token itself (glue.relay: the token alone)
    if nonspec.problems():  # SGLang's processing of it where the route runs (0.5.17: it refuses other releases)
        return
    result.copy_done = SimpleNamespace(record=lambda: None)  # (the scheduler's event)
    result.copy_to_cpu(return_logprob=False, return_hidden_states=False)
    assert result.accept_lens is None and result.next_token_ids.device.type == "cpu"
    nonspec_batch = SimpleNamespace(spec_algorithm=SpeculativeAlgorithm.NONE, return_logprob=False)
    tokens, _ = SchedulerBatchResultProcessor._normalize_decode_outputs(
        None, batch=nonspec_batch, result=result, logits_output=result.logits_output,
        next_token_ids=result.next_token_ids)
    assert tokens == [[2], [3], [4]]


class _Req:
    """What SGLang's spec-v2 result processing touches on a request (the committed length on the request up to 0.5.18,
    on ``req.kv`` from 0.5.19: both are this object's)."""

    def __init__(self):
        self.kv_committed_len, self.spec_verify_ct, self.spec_num_correct_drafts, self.grammar = 10, 0, 0, None
        self.kv = self
        self.histogram = []
        self.is_retracted = False

    def finished(self):
        return False

    def update_spec_correct_drafts_histogram(self, n):
        self.histogram.append(n)


def test_sglangs_spec_result_processing_reads_one_committed_token_per_request(init_new):
    """The scheduler's ``_resolve_spec_v2_tokens`` (after the result's copy to the host) commits the sampled token and
    nothing else, and feeds the adaptive policy an off step (0 correct drafts per request)."""
    target, _ = _target()
    off, batch = PlainOff("cpu"), _batch()
    batch.spec_info = off.verify_input(batch, topk=1)
    result = off.step(batch, target, torch.arange(6 * 40, dtype=torch.int32).view(6, 40))
    result.next_token_ids, result.accept_lens = result.next_token_ids.cpu(), result.accept_lens.cpu()
    fed = []
    processor = SimpleNamespace(
        model_worker=SimpleNamespace(on_verify_complete_cpu=lambda correct, batch_size=0: fed.append(correct)),
        advance_grammar_fsm=lambda result, batch: None,
        metrics_reporter=SimpleNamespace(snapshot_spec_decode_metrics=lambda batch, result: None))  # 0.5.23
    reqs = [_Req() for _ in range(3)]
    tokens = SchedulerBatchResultProcessor._resolve_spec_v2_tokens(processor, result, SimpleNamespace(reqs=reqs))
    assert tokens == [[2], [3], [4]] and fed == [[0, 0, 0]] and result.num_correct_drafts == 0
    assert [r.kv_committed_len for r in reqs] == [11] * 3 and [r.histogram for r in reqs] == [[0]] * 3


def _routing_worker(monkeypatch, fill_kv_only=True):
    w = EagleTritonWorkerV2.__new__(EagleTritonWorkerV2)
    w.plain_off, w.topk, w._verify_checks_left = PlainOff("cpu"), 1, set()
    w._draft_worker = SimpleNamespace(fill_kv_only=fill_kv_only)
    w._target_worker = "target"
    w._eagle_sample = verify.eagle_sample
    monkeypatch.setattr(EAGLEWorkerV2, "req_to_token_pool", SimpleNamespace(req_to_token="rows"), raising=False)
    monkeypatch.setattr(EAGLEWorkerV2, "_build_trivial_verify_input", lambda self, batch: "sglang's input")
    monkeypatch.setattr(EAGLEWorkerV2, "verify", lambda self, batch, *args, **kwargs: "sglang's verify")
    published = []
    monkeypatch.setattr(call_sites, "publish_read_done", published.append)
    ran = []
    monkeypatch.setattr(worker, "_plain_step",
                        lambda off, batch, target, rows, held=None: ran.append((off, target, rows)) or "plain")
    return w, published, ran


def test_steps_0_takes_the_plain_step_when_it_fills_the_kv_only_and_serves_the_batch(monkeypatch):
    """SGLang's steps-0 flow calls ``_build_trivial_verify_input`` then ``verify``: both are the plain step's when it is
    on, the step fills the draft KV only (not a resume step) and the batch is a plain one; else SGLang's, untouched."""
    w, published, ran = _routing_worker(monkeypatch)
    batch = _batch()
    assert isinstance(w._build_trivial_verify_input(batch), EagleVerifyInput)
    assert w.verify(batch, grammar_barrier=None) == "plain" and ran == [(w.plain_off, "target", "rows")]
    assert published == [] and not w._plain_now  # the choice is used once
    w._draft_worker.read_done_after_fill()  # the WAR barrier's event, published by the fill (next test)
    assert published == [w]
    for why in ({"return_logprob": True}, {"grammar": True}):
        assert w._build_trivial_verify_input(_batch(**why)) == "sglang's input"
        assert w.verify(_batch(**why)) == "sglang's verify"
    w._draft_worker.fill_kv_only = False  # a resume step: SGLang's verify, then the full draft extend
    assert w._build_trivial_verify_input(batch) == "sglang's input" and w.verify(batch) == "sglang's verify"
    w._draft_worker.fill_kv_only, w.plain_off = True, None  # the variable unset
    assert w._build_trivial_verify_input(batch) == "sglang's input" and w.verify(batch) == "sglang's verify"
    assert len(ran) == 1 and len(published) == 1


def test_the_read_done_event_is_published_after_the_steps_0_fill_once(monkeypatch):
    """The plain step's WAR event comes after the draft KV fill (the step's last reads of shared buffers), once: a
    later fill without a plain step publishes nothing."""
    d = TritonEagleDraftWorker.__new__(TritonEagleDraftWorker)
    d.fill_kv_only, d.speculative_num_steps, order = True, 0, []
    monkeypatch.setattr(TritonEagleDraftWorker, "fill_draft_kv", lambda self, batch, result: order.append("fill"))
    d.read_done_after_fill = lambda: order.append("event")
    batch = _batch()
    assert d._draft_extend_for_decode(batch, "result") is None and order == ["fill", "event"]
    d._draft_extend_for_decode(batch, "result")
    assert order == ["fill", "event", "fill"] and d.read_done_after_fill is None and d.draft_stale


def _starting_worker(state=True, ours=True, tensor_parallel=False):
    """A worker at ``start_plain_off``: a steps-0 state (``state``) whose target attention is ours (``ours``) or
    SGLang's triton backend, the draft under tensor parallelism or not."""
    from sglang.srt.layers.attention.triton_backend import TritonAttnBackend

    w = EagleTritonWorkerV2.__new__(EagleTritonWorkerV2)
    w.device = "cpu"
    backend = TritonAttnBackend.__new__(TritonAttnBackend)
    backend = verify.one_node_verify_attention(backend) if ours else backend
    w.adaptive_controller = SimpleNamespace(_states={0: SimpleNamespace(target_attn_backend=backend)} if state else {})
    w._draft_worker = SimpleNamespace(_tensor_parallel=object() if tensor_parallel else None)
    return w


# what keeps each worker of _starting_worker from the plain step, matched in the refusal, the log and the report
CANNOT_RUN = {"no steps-0 state": ({"state": False}, "steps 0 is not an adaptive candidate"),
              "SGLang's attention": ({"ours": False}, "target attention is TritonAttnBackend, not ours"),
              "tensor parallelism": ({"tensor_parallel": True}, "the draft runs under tensor parallelism")}


@pytest.mark.parametrize("case", sorted(CANNOT_RUN))
def test_the_plain_step_is_refused_at_start_where_it_cannot_run_when_required(monkeypatch, case):
    """``=1``: refused (naming what to change) without a steps-0 state, where steps 0's target attention is not ours
    (it reads no mask and runs SGLang's decode kernels) or the draft runs under tensor parallelism."""
    monkeypatch.setenv(config.PLAIN_OFF_ENV, "1")
    kwargs, why = CANNOT_RUN[case]
    with pytest.raises(RuntimeError, match=f"PLAIN_OFF=1, but .*{why}.*unset"):
        _starting_worker(**kwargs).start_plain_off()


@pytest.mark.parametrize("case", sorted(set(CANNOT_RUN) - {"no steps-0 state"}))
def test_the_plain_step_is_declined_by_default_where_it_cannot_run(monkeypatch, case, caplog):
    """Unset: SGLang's steps-0 verify, the reason logged and in the kernel report; without a steps-0 state nothing to
    decline (no log, no report)."""
    monkeypatch.delenv(config.PLAIN_OFF_ENV, raising=False)
    kwargs, why = CANNOT_RUN[case]
    w = _starting_worker(**kwargs)
    with caplog.at_level("WARNING", logger=worker.logger.name):
        w.start_plain_off()
    assert w.plain_off is None and why in w.plain_off_declined and why in caplog.text
    w = _starting_worker(state=False)
    w.start_plain_off()
    assert w.plain_off is None and w.plain_off_declined is None


def test_the_plain_step_is_declined_by_default_where_its_touchpoints_moved(monkeypatch):
    monkeypatch.delenv(config.PLAIN_OFF_ENV, raising=False)
    monkeypatch.setattr(call_sites, "plain_off_problems", lambda: ["X.y (missing)"])
    w = _starting_worker()
    w.start_plain_off()
    assert w.plain_off is None and "touchpoints moved: X.y (missing)" in w.plain_off_declined
    monkeypatch.setenv(config.PLAIN_OFF_ENV, "1")
    with pytest.raises(RuntimeError, match=r"PLAIN_OFF=1, but its SGLang .* touchpoints moved: X.y \(missing\)"):
        _starting_worker().start_plain_off()


@pytest.mark.parametrize("value", [None, "1"])
def test_the_plain_step_starts_where_it_can_run_by_default_or_required(monkeypatch, value):
    if value is None:
        monkeypatch.delenv(config.PLAIN_OFF_ENV, raising=False)
    else:
        monkeypatch.setenv(config.PLAIN_OFF_ENV, value)
    w = _starting_worker()
    w.start_plain_off()
    assert isinstance(w.plain_off, PlainOff) and w.plain_off_declined is None


def test_0_keeps_sglangs_steps_0_verify(monkeypatch):
    monkeypatch.setenv(config.PLAIN_OFF_ENV, "0")
    for kwargs in ({}, {"ours": False}):
        w = _starting_worker(**kwargs)
        w.start_plain_off()
        assert w.plain_off is None and w.plain_off_declined is None


def test_the_plain_steps_touchpoints_hold_on_this_sglang():
    """Checked at start wherever steps 0 is a candidate: SGLang's steps-0 flow still calls the input builder we
    override, and the calls, constructors and fields the plain step uses are where it expects them."""
    classes = (TritonEagleDraftWorker, EagleTritonWorkerV2)
    assert call_sites.glue_problems(worker.REPLACEMENTS, classes, plain_off=True) == []
    assert call_sites.plain_off_problems() == []
    assert all(call_sites.reaches(getattr(owner, attr), module, name)
               for owner, attr, module, name in call_sites.PLAIN_OFF_CALL_SITES)


def test_the_war_barriers_event_goes_where_the_scheduler_reads_it(monkeypatch):
    """0.5.17 reads ``war_fastpath_runner.war_fastpath_read_done_event``, 0.5.18+
    ``last_shared_read_runner.shared_read_done_event``: the event recorded now is put on the one the worker has."""
    recorded = []
    event = SimpleNamespace(record=lambda stream: recorded.append(stream))
    # recorded on the worker's device's current stream, asked by the device's index (found once)
    module = SimpleNamespace(Event=lambda: event, current_device=lambda: 3, current_stream=lambda index: f"s{index}")
    monkeypatch.setattr(call_sites.torch, "get_device_module", lambda device: module)
    runner = SimpleNamespace()

    class Old:
        device, war_fastpath_runner = "cpu", runner

    class New:
        device, last_shared_read_runner = "cpu", runner

    old = Old()
    call_sites.publish_read_done(old)
    call_sites.publish_read_done(New())
    assert runner.war_fastpath_read_done_event is event and runner.shared_read_done_event is event
    assert recorded == ["s3", "s3"]
    made = []  # one event a worker, recorded again at every step (the barrier waits on it at once)
    monkeypatch.setattr(call_sites.torch, "get_device_module",
                        lambda device: SimpleNamespace(Event=lambda: made.append(1) or event))
    call_sites.publish_read_done(old)
    assert made == [] and recorded == ["s3", "s3", "s3"]


def _decode_batch(**flags):
    batch = _batch(**flags)
    batch.forward_mode.is_extend = lambda: False
    batch.is_extend_in_batch = False
    return batch


def _direct_worker(monkeypatch, choices):
    """An adaptive worker over steps 0 and 3 whose policy picks ``choices`` step by step, SGLang's steps-0 flow stood
    in by one that puts the state in force (as SGLang's does first) and records what ran; the plain step and the
    draft extend record too (the extend leaves the carried state stale at steps 0, as the fill does)."""
    from tests.test_worker import _adaptive_worker

    w = _adaptive_worker([0, 3])
    w.plain_off, w.topk, w._target_worker = PlainOff("cpu"), 1, "target"
    picks = iter(choices)
    w.adaptive_controller.params.get_steps_for_batch = lambda bs: next(picks)
    ran = []

    def sglang_flow(self, batch, on_publish=None, grammar_barrier=None):
        if batch.forward_mode.is_extend():  # a prefill: SGLang's flow puts no state in force
            ran.append(("sglang's prefill",))
            return "sglang's"
        self.activate_step_by_batch(batch.seq_lens.shape[0])
        ran.append(("sglang's flow", self.speculative_num_steps, self.draft_worker.fill_kv_only))
        self.draft_worker._draft_extend_for_decode(batch, "sglang's")
        return "sglang's"

    def extend(batch, result):
        dw = w.draft_worker
        publish, dw.read_done_after_fill = dw.read_done_after_fill, None
        ran.append(("extend", dw.kv_filled_in_graph, publish is not None))
        dw.draft_stale = w.speculative_num_steps == 0 and dw.fill_kv_only

    monkeypatch.setattr(EAGLEWorkerV2, "forward_batch_generation", sglang_flow)
    monkeypatch.setattr(EAGLEWorkerV2, "req_to_token_pool", SimpleNamespace(req_to_token="rows"), raising=False)
    def plain_step(off, batch, target, rows, held=None):
        assert batch.spec_info.is_verify_input() and batch.spec_info.draft_token_num == 1  # the one-node input
        ran.append(("plain", target, rows))
        return SimpleNamespace(new_seq_lens="new lengths")

    monkeypatch.setattr(worker, "_plain_step", plain_step)
    w._draft_worker._draft_extend_for_decode = extend
    w._draft_worker.read_done_after_fill, w._draft_worker.kv_filled_in_graph = None, False
    return w, ran


def test_a_plain_step_is_entered_before_sglangs_steps_0_flow_its_state_put_in_force_once(monkeypatch):
    """The worker puts each decode step's state in force itself; a plain steps-0 step (fill only, a plain batch) then
    runs the flow SGLang's would (the one-node input, the plain step, the new lengths published before the fill) without
    it; any other step goes through SGLang's flow, whose own call to put the state in force is then a no-op: one
    activation a step either way (steps_in_force counts them), the resume after steps 0 included."""
    w, ran = _direct_worker(monkeypatch, [0, 0, 3, 3, 3])
    results = [w.forward_batch_generation(_decode_batch(), on_publish=lambda lens: ran.append(("publish", lens)),
                                          grammar_barrier=None) for _ in range(5)]
    assert ran == [("plain", "target", "rows"), ("publish", "new lengths"), ("extend", False, True)] * 2 + [
        ("sglang's flow", 0, False), ("extend", False, False),  # the resume: one more step at 0, the full extend
        ("sglang's flow", 3, True), ("extend", False, False), ("sglang's flow", 3, True), ("extend", False, False)]
    assert results[2:] == ["sglang's"] * 3
    assert sum(w.steps_in_force.values()) == 5 and w.steps_in_force == {0: 3, 3: 2} and w.resumes == 1
    assert verify.RAN[off_step.PLAIN_DIRECT] >= 2


@pytest.mark.parametrize("why", ["grammar", "logprobs", "positional", "paused"])
def test_a_batch_the_plain_step_does_not_serve_keeps_sglangs_flow(monkeypatch, why):
    """A grammar or logprobs batch, a call with positional extras (not SGLang's scheduler's) or the A/B's other arm:
    SGLang's steps-0 flow, the state put in force once."""
    w, ran = _direct_worker(monkeypatch, [0])
    batch = _decode_batch(grammar=why == "grammar", return_logprob=why == "logprobs")
    args = ("extra",) if why == "positional" else ()
    w._direct_paused = why == "paused"
    if args:
        monkeypatch.setattr(EAGLEWorkerV2, "forward_batch_generation",
                            lambda self, batch, *a, **k: self.activate_step_by_batch(3) or ran.append("sglang's"))
    w.forward_batch_generation(batch, *args)
    assert "plain" not in [r[0] for r in ran] and sum(w.steps_in_force.values()) == 1


def test_a_state_put_in_force_ahead_is_not_carried_to_the_next_step(monkeypatch):
    """The ahead-of-flow mark lives for one call: a step whose flow never asked (an idle or prefill batch after it)
    does not skip the next step's decision."""
    w, ran = _direct_worker(monkeypatch, [3, 0])
    monkeypatch.setattr(EAGLEWorkerV2, "forward_batch_generation", lambda self, batch, **k: ran.append("no ask"))
    w.forward_batch_generation(_decode_batch())  # the state put in force, the flow never asks
    assert w._pre_activated
    w.forward_batch_generation(_decode_batch(idle=True))  # an idle batch: SGLang's flow alone
    assert not w._pre_activated
    monkeypatch.setattr(EAGLEWorkerV2, "forward_batch_generation", lambda self, batch, **k: None)
    w.forward_batch_generation(_decode_batch())
    assert w.speculative_num_steps == 0 and sum(w.steps_in_force.values()) == 2


def test_the_ab_arms_alternate_the_direct_entry(monkeypatch):
    """config.AB_FEATURE_ENV=plain_direct: every other N decode steps go through SGLang's steps-0 flow, the cycle
    timing told each step's arm; nothing where the plain step does not run."""
    w, ran = _direct_worker(monkeypatch, [0] * 8)
    w._ab_steps, w._ab_count, w._ab_feature = 2, 0, "plain_direct"
    for _ in range(8):
        w.forward_batch_generation(_decode_batch())
    kinds = [r[0] for r in ran if r[0] in ("plain", "sglang's flow")]
    assert kinds == ["plain", "plain", "sglang's flow", "sglang's flow"] * 2
    w.plain_off, w._ab_count = None, 2  # the off arm where the plain step does not run: nothing paused
    w._direct_paused = False
    w._next_ab_arm()
    assert not w._direct_paused


def test_a_prefill_or_a_batch_without_a_draft_input_keeps_sglangs_flow(monkeypatch):
    """A prefill puts no state in force (SGLang's flow does not either); a decode batch without a relayed draft
    input (SGLang then makes an idle one) takes SGLang's flow with the state put in force once; the graph epilogue's
    fill reaches the draft worker on a direct step."""
    w, ran = _direct_worker(monkeypatch, [0, 0])
    prefill = _decode_batch()
    prefill.forward_mode.is_extend = lambda: True
    w.forward_batch_generation(prefill)
    assert ran == [("sglang's prefill",)] and sum(w.steps_in_force.values()) == 0 and not w._pre_activated
    bare = _decode_batch()
    bare.spec_info = None
    w.forward_batch_generation(bare)
    assert ran[1] == ("sglang's flow", 0, True) and sum(w.steps_in_force.values()) == 1
    w.plain_off.filled = True  # the last plain step's token and fill came from the graph
    w.forward_batch_generation(_decode_batch())
    assert ran[-1] == ("extend", True, True)
