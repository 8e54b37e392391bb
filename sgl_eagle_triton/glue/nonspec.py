"""Adaptive steps 0 held as SGLang's non-speculative decode: the scheduler's side (config.OFF_NONSPEC_ENV).

While the adaptive policy holds steps 0, the plain step (:mod:`sgl_eagle_triton.off_step`) still runs inside SGLang's
speculative scheduler path: the spec-v2 preparation and its KV reservation, the relay's sequence-length resolve, the
batch snapshot around the launch, the speculative result processing. Under this route the running batch is a
non-speculative batch for the scheduler (``spec_algorithm`` NONE) for as long as the policy holds steps 0: SGLang's own
decode preparation (one KV slot a request, the commit), launch and result processing run, and our worker runs the
plain step inside (``EagleTritonWorkerV2._nonspec_step``). The batch turns back at the first step the policy drafts.

Lengths. A non-speculative batch's ``seq_lens`` count, before its preparation, the tokens whose KV is written or in
flight (the step's input token goes at that position), and its preparation commits the token (``kv_committed_len +=
1``) and allocates its slot. A speculative batch's ``seq_lens`` are resolved on the device at the launch, and its
``kv_committed_len`` lags by the step in flight (committed in its result processing).

- :func:`enter` (preparation of step i; the plain step i-1 in flight, results through i-2 processed, so each request's
  committed length is the one step i-1 reads, and step i-1 writes one token there): lengths ``committed + 1``; the
  reservation beyond them freed (no step in flight reads those slots) and ``kv_allocated_len`` set to them; no draft
  input; NONE. SGLang's non-speculative preparation then commits +1 and allocates the slot at the length; step i-1's
  result processing commits its own +1 after.
- :func:`trim` (preparation of a later step): requests merged in from a prefill since have their reservation beyond
  their length freed (their prefill commits at its preparation; none is in flight past the length).
- :func:`leave` (the policy drafts): the algorithm back; ``seq_lens`` already count what the speculative step reads
  (KV written, the commit exact); a draft input of marked stubs (``glue.relay``: the relay gathers the bonus token the
  last step stashed, the next step resumes with the full draft extend) that tells the relay's sequence-length resolve
  to keep ``seq_lens`` (``relay.LENGTHS_KEPT``: no held step writes the lengths that resolve reads, and a
  non-speculative publish would count one more than a speculative step reads); then SGLang's speculative preparation
  reserves from the exact commit.
- :func:`publish_unfenced` (after a held step): the scheduler's publish of its lengths is left out, write and spec-v2
  event (``glue.relay``: nothing reads them).
- :func:`relayed_tokens`: a held step's input tokens, the relay's gather or, for the previous held step's rows, that
  step's tokens.
- :func:`install`: SGLang's ``ScheduleBatch.prepare_for_decode`` runs through the route's preparation; a held
  batch's memory check (``new_tokens_required_next_decode``, before the preparation) asks room for the speculative
  reservation too, so that turning back never allocates past what SGLang checked (it evicts or retracts first); and its
  result processing of a non-speculative decode step feeds the speculative metrics and the adaptive policy a step of
  one token a request first (as the plain step's speculative processing does; SGLang's metrics log divides by the
  speculative steps of its interval).

Served where it was read and run: SGLang 0.5.17 (:func:`problems`), page size 1, overlap scheduling, one GPU.
"""

from __future__ import annotations

import functools
import operator

import torch
from sglang.srt.managers import overlap_utils, schedule_batch
from sglang.srt.managers.schedule_batch import ReqKvInfo, ScheduleBatch
from sglang.srt.managers.scheduler_components.batch_result_processor import SchedulerBatchResultProcessor
from sglang.srt.speculative.eagle_info import EagleDraftInput
from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

from sgl_eagle_triton.glue import relay, versions
from sgl_eagle_triton.glue.hooks import signature_problem

TESTED = ("0.5.17",)  # the releases this route was read and run on
_MARKER = "sgl_eagle_triton_nonspec"

ROUTE = None  # the worker whose route runs in this process (install), None without one
NO_SPEC = SpeculativeAlgorithm.NONE  # a non-speculative batch's ``spec_algorithm`` (an enum member: ``is`` compares)
# chosen once: where a request's committed length lives (0.5.17 the request; 0.5.19+ its ReqKvInfo), and whether
# SGLang's CI relay assertions run (a constant of its module)
_COMMITTED_ON_KV = "kv_committed_len" in getattr(ReqKvInfo, "__annotations__", {})
_CI_ASSERTS = relay.sglang_ci_asserts()
_reserve = None  # SGLang's KV reservation per request and speculative decode step, read at the first memory check:
# on 0.5.17 a constant of the server's arguments (0.5.18+ read the published speculative settings, which SGLang's
# adaptive switching moves: read it at every check there before TESTED takes them in)

# The held batch's hot path runs every decode step and its loops every request: plain loops over attribute reads
# (``committed`` an operator.attrgetter) and identity checks, so that the route adds as little Python to a step as it
# can (a loop without a Python call a request: ~0.1 us a request).

committed = operator.attrgetter("kv.kv_committed_len" if _COMMITTED_ON_KV else "kv_committed_len")
"""A request's committed KV length (0.5.17 ``Req.kv_committed_len``; 0.5.19+ ``req.kv.kv_committed_len``)."""


def _free_beyond(batch, lengths: list[int]) -> None:
    """Free each request's KV reserved at and beyond ``lengths[i]`` (``req_to_token[req, length:allocated]``) and set
    its ``kv_allocated_len`` to the length."""
    req_to_token = batch.req_to_token_pool.req_to_token
    freed = []
    for req, length in zip(batch.reqs, lengths, strict=True):
        allocated = req.kv.kv_allocated_len
        if allocated > length:
            freed.append(req_to_token[req.req_pool_idx, length:allocated])
            req.kv.kv_allocated_len = length
    if freed:
        batch.token_to_kv_pool_allocator.free(torch.cat(freed).to(torch.int64))


def _set_lengths(batch, lengths: list[int]) -> None:
    # pinned for the copy to the device (a pageable one could wait behind the WAR barrier on the schedule stream)
    lengths_cpu = torch.tensor(lengths, dtype=torch.int64, pin_memory=str(batch.device).startswith("cuda"))
    batch.seq_lens_cpu = lengths_cpu
    batch.seq_lens = lengths_cpu.to(batch.device, non_blocking=True)
    batch.orig_seq_lens = batch.seq_lens.to(torch.int32)
    batch.seq_lens_sum = None


def enter(batch) -> None:
    """``batch`` (speculative, its plain step in flight: one token a request, results before it processed) turned
    non-speculative before SGLang's non-speculative preparation (the module's docstring)."""
    lengths = [committed(req) + 1 for req in batch.reqs]
    _free_beyond(batch, lengths)
    _set_lengths(batch, lengths)
    batch.spec_info = None
    batch.spec_algorithm = SpeculativeAlgorithm.NONE


def can_stay(batch) -> bool:
    """Whether SGLang's non-speculative preparation can run on ``batch`` (non-speculative): it reads the host lengths,
    which a prefill merged in without keeps None."""
    return batch.seq_lens_cpu is not None and batch.seq_lens_cpu.shape[0] == len(batch.reqs)


def trim(batch) -> None:
    """Free what a request merged into the non-speculative ``batch`` from a prefill still holds beyond its committed
    length (which is its length before this step's token: a held request commits at preparation, a prefill at its
    own)."""
    reqs = batch.reqs
    for req in reqs:
        if req.kv.kv_allocated_len > committed(req):
            _free_beyond(batch, [committed(r) for r in reqs])
            return


def leave(batch, algorithm, stubs) -> None:
    """``batch`` (non-speculative) speculative again (``algorithm``: the server's) before SGLang's speculative
    preparation; ``stubs``: the marked top-k probabilities / indices and hidden states (or None) of as many rows, the
    draft input's (the relay keeps them and gathers the bonus token)."""
    topk_p, topk_index, hidden = stubs
    # the bonus tokens: -1 a request (fails loudly if ever read), the relay's resolve gathers them
    placeholder = batch.req_pool_indices.new_full(batch.req_pool_indices.shape, -1)
    draft_input = EagleDraftInput(bonus_tokens=placeholder, topk_p=topk_p, topk_index=topk_index,
                                  hidden_states=hidden, future_indices=batch.req_pool_indices)
    setattr(draft_input, relay.LENGTHS_KEPT, True)
    batch.spec_info = draft_input
    batch.spec_algorithm = algorithm


def relayed_tokens(batch, last=None) -> torch.Tensor:
    """The tokens [bs] int64 the last step of each request of ``batch`` stashed (its input now): what SGLang's
    launch gathers for a non-speculative batch on a non-speculative server, with its consume-once check under its CI
    assertions (``SGLANG_IS_IN_CI``: a row read without a stash since fails). ``last``: ``(req_pool_indices,
    tokens)`` of the held step launched just before this one (None after any other step); where ``batch`` holds that
    step's rows (its ``req_pool_indices`` the same tensor: SGLang's filter, merge and retraction make a new one), its
    tokens are what the relay stashed for them, and are returned without the gather (outside SGLang's CI
    assertions, whose consume-once check reads each row back)."""
    if last is not None and last[0] is batch.req_pool_indices and not _CI_ASSERTS:
        return last[1]
    future_map = relay.SERVER_FUTURE_MAP
    tokens = future_map.output_tokens_buf[batch.req_pool_indices]
    if _CI_ASSERTS:
        overlap_utils._assert_nonneg_and_invalidate(tokens, future_map.output_tokens_buf, batch.req_pool_indices)
    return tokens


def publish_unfenced() -> None:
    """The scheduler's next publish (a held step's lengths) left out (``relay.publish_unfenced``)."""
    relay.publish_unfenced(relay.SERVER_FUTURE_MAP)


def problems() -> list[str]:
    """Why this SGLang cannot run the route, empty where it can."""
    found = []
    if versions.release(versions.installed()) not in [versions.release(v) for v in TESTED]:
        found.append(f"SGLang {versions.installed()} (read and run on {', '.join(TESTED)} only)")
    for owner, name, variants in ((ScheduleBatch, "prepare_for_decode", ((),)),
                                  (ScheduleBatch, "new_tokens_required_next_decode", ((),)),
                                  (ScheduleBatch, "_new_tokens_required_next_decode_spec_v2",
                                   (("requests", "page_size"),)),
                                  (SchedulerBatchResultProcessor, "process_batch_result_decode",
                                   (("batch", "result"),))):
        fn = getattr(owner, name, None)
        problem = "missing" if fn is None else signature_problem(fn, variants)
        if problem:
            found.append(f"{owner.__name__}.{name} {problem}")
    return found


def install(route) -> None:
    """``route`` (the worker: ``prepare_decode(prepare, batch)``, ``feed_nonspec_step(processor, batch)``) runs this
    process's decode preparations and sees its non-speculative results first (the module's docstring)."""
    global ROUTE, _reserve
    ROUTE, _reserve = route, None
    if getattr(ScheduleBatch.prepare_for_decode, _MARKER, False):
        return
    ScheduleBatch.prepare_for_decode = _prepare_for_decode(ScheduleBatch.prepare_for_decode)
    ScheduleBatch.new_tokens_required_next_decode = _tokens_required(ScheduleBatch.new_tokens_required_next_decode)
    SchedulerBatchResultProcessor.process_batch_result_decode = _process_decode(
        SchedulerBatchResultProcessor.process_batch_result_decode)


def _prepare_for_decode(prepare):
    @functools.wraps(prepare)
    def prepare_for_decode(batch):
        if ROUTE is None:
            return prepare(batch)
        return ROUTE.prepare_decode(prepare, batch)

    setattr(prepare_for_decode, _MARKER, True)
    return prepare_for_decode


def _tokens_required(required):
    @functools.wraps(required)
    def new_tokens_required_next_decode(batch, selected_indices=None):
        need = required(batch, selected_indices)
        if ROUTE is None or batch.spec_algorithm is not NO_SPEC:
            return need
        # a held batch may turn back at this step's preparation, after SGLang's memory check: room (or SGLang's
        # retraction) for the speculative reservation too, as a speculative batch asks
        reqs = batch.reqs if selected_indices is None else [batch.reqs[i] for i in selected_indices]
        page_size = batch.token_to_kv_pool_allocator.page_size
        if page_size != 1:
            return max(need, batch._new_tokens_required_next_decode_spec_v2(reqs, page_size))
        return max(need, spec_v2_need_page_1(reqs))

    return new_tokens_required_next_decode


def spec_v2_need_page_1(reqs) -> int:
    """SGLang's ``ScheduleBatch._new_tokens_required_next_decode_spec_v2(reqs, 1)`` (the KV slots a speculative
    preparation of ``reqs`` allocates: each request's reservation past its committed length, less what it holds) at
    page size 1, where its page alignment is the identity: the same sum without a call per request."""
    global _reserve
    if _reserve is None:
        _reserve = schedule_batch.get_alloc_reserve_per_decode()
    reserve, need = _reserve, 0
    for req in reqs:
        beyond = committed(req) + reserve - req.kv.kv_allocated_len
        if beyond > 0:
            need += beyond
    return need


def _process_decode(process):
    @functools.wraps(process)
    def process_batch_result_decode(processor, batch, result, *args, **kwargs):
        if ROUTE is not None and batch.spec_algorithm is NO_SPEC:
            ROUTE.feed_nonspec_step(processor, batch)
        return process(processor, batch, result, *args, **kwargs)

    return process_batch_result_decode


def feed_metrics(processor, batch) -> None:
    """A step of one token a request, no draft accepted, counted in SGLang's speculative metrics: the server's (its
    log divides by the speculative steps of an interval) and each running request's (its ``spec_accept_length`` in
    ``meta_info`` is tokens over verifies), as SGLang's spec-v2 result processing counts a plain step."""
    processor.metrics_reporter.update_spec_metrics(len(batch.reqs), 0)
    for req in batch.reqs:  # (``req.finished()`` and ``req.update_spec_correct_drafts_histogram(0)`` as SGLang
        if not (req.is_retracted or req.finished_reason is not None):  # writes them, without two calls a request)
            req.spec_verify_ct += 1
            histogram = req.spec_correct_drafts_histogram
            if histogram:
                histogram[0] += 1
            else:
                histogram.append(1)
