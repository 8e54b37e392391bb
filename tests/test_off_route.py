"""Held steps 0 as SGLang's non-speculative decode (sgl_eagle_triton.off_route, glue.nonspec), on the CPU.

The lengths and the KV reservation are checked on SGLang's own decode preparations
(``ScheduleBatch.prepare_for_decode``: its non-speculative one, and spec-v2's ``eagle_prepare_for_decode``) with
SGLang's token allocator, driven through a schedule as the overlap scheduler runs it (the preparation of step i before
the result processing of step i-1); only the Triton kernel that writes the reservation into ``req_to_token`` runs as a
plain-PyTorch twin. After every iteration: no KV slot leaked or held twice, every written position inside what the
request holds, a written position's slot never moved, and a non-speculative batch's lengths equal its commit. The
route's decisions, its launch and its feed are checked on the worker with fakes; the relay's resolve on SGLang's own
``FutureMap``."""

from types import SimpleNamespace

import pytest
import torch
from sglang.srt.managers import schedule_batch
from sglang.srt.managers.schedule_batch import ScheduleBatch
from sglang.srt.mem_cache import allocation
from sglang.srt.mem_cache.allocator.token import TokenToKVPoolAllocator
from sglang.srt.speculative import eagle_utils, spec_utils
from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

from sgl_eagle_triton import config, off_route
from sgl_eagle_triton.glue import nonspec, relay
from sgl_eagle_triton.worker import EagleTritonWorkerV2

pytestmark = pytest.mark.skipif(bool(nonspec.problems()), reason="the route serves SGLang 0.5.17 only")

POOL, CONTEXT, RESERVE, DRAFT = 256, 96, 8, 4  # KV slots, row width, SGLang's reservation (2 x draft tokens), drafts
EAGLE = SpeculativeAlgorithm.EAGLE


def _assign(req_pool_indices, req_to_token, start_offset, end_offset, out_cache_loc, batch_size):
    """SGLang's ``assign_req_to_token_pool`` kernel as plain PyTorch: request i's new slots at [start, end)."""
    at = 0
    for i in range(batch_size):
        start, end = int(start_offset[i]), int(end_offset[i])
        req_to_token[req_pool_indices[i], start:end] = out_cache_loc[at:at + end - start].to(req_to_token.dtype)
        at += end - start


@pytest.fixture
def sglang_preps(monkeypatch):
    monkeypatch.setattr(allocation, "assign_req_to_token_pool_func", _assign)
    monkeypatch.setattr(eagle_utils, "get_alloc_reserve_per_decode", lambda *a: RESERVE)
    args = SimpleNamespace(enable_mamba_extra_buffer=lambda: False, enable_mamba_extra_buffer_lazy=lambda: False)
    monkeypatch.setattr(schedule_batch, "get_server_args", lambda: args)
    monkeypatch.setattr(spec_utils, "get_server_args", lambda: args)


class _Req:
    """What the preparations and the release read of SGLang's request: the pool row, the committed length, the KV
    bookkeeping."""

    def __init__(self, row: int, prompt: int, allocator, rows):
        self.req_pool_idx, self.kv_committed_len, self.decode_batch_idx = row, prompt, 0
        self.kv = SimpleNamespace(kv_allocated_len=prompt)
        rows[row, :prompt] = allocator.alloc(prompt).to(torch.int32)  # the prefill's slots
        self.length = prompt  # tokens whose KV is written (the schedule's truth)
        self.host = prompt + 1  # tokens the host holds (prompt and output; the prefill's token processed)
        self.written = {p: int(rows[row, p]) for p in range(prompt)}


class Schedule:
    """One running batch through SGLang's preparations, the step in flight processed after the next preparation."""

    def __init__(self, prompts=(5, 9, 17)):
        self.allocator = TokenToKVPoolAllocator(POOL, torch.bfloat16, "cpu", None, need_sort=False)
        self.rows = torch.zeros(len(prompts) + 1, CONTEXT, dtype=torch.int32)
        rows = self.rows

        class Pool:
            req_to_token = rows

            def write(self, indices, values):
                rows[indices] = values

        self.reqs = [_Req(i + 1, p, self.allocator, rows) for i, p in enumerate(prompts)]
        tree = SimpleNamespace(token_to_kv_pool_allocator=self.allocator, page_size=1, is_chunk_cache=lambda: True)
        lengths = torch.tensor(prompts)
        self.batch = SimpleNamespace(
            reqs=self.reqs, spec_algorithm=EAGLE, forward_mode=None, input_embeds=None, spec_info=None,
            sampling_info=SimpleNamespace(penalizer_orchestrator=SimpleNamespace(is_required=False)),
            model_config=SimpleNamespace(is_encoder_decoder=False), seq_lens=lengths, seq_lens_cpu=None,
            orig_seq_lens=lengths.to(torch.int32), seq_lens_sum=None, hisparse_coordinator=None,
            maybe_evict_swa=lambda: None, token_to_kv_pool_allocator=self.allocator, tree_cache=tree,
            req_to_token_pool=Pool(), req_pool_indices=torch.tensor([r.req_pool_idx for r in self.reqs]),
            device="cpu", batch_size=lambda: len(self.reqs))
        self.in_flight = None  # the step launched last: (kind, tokens committed a request)
        # the slots a held step writes its token's KV to (off_route: the preparation's own, off_step.HeldStep)
        self.held_slots = lambda batch: batch.out_cache_loc

    def step(self, kind: str, accepted: int = 1, enter=None):
        """One scheduler iteration: the preparation (``kind``: "spec", "enter", "nonspec" or "leave"), the step's
        launch (its KV writes), then the result processing of the step before."""
        batch = self.batch
        if kind == "enter":
            (enter or nonspec.enter)(batch)
        elif kind == "leave":
            nonspec.leave(batch, EAGLE, (None, None, None))
        before = (batch.seq_lens, batch.seq_lens_cpu)
        kept = tuple(None if t is None else t.clone() for t in before)
        ScheduleBatch.prepare_for_decode(batch)
        speculative = not batch.spec_algorithm.is_none()
        if not speculative:  # the lengths before the token left as they were, in the tensors the preparation replaced
            assert all(torch.equal(t, k) for t, k in zip(before, kept, strict=True))
            assert torch.equal(before[0] + 1, batch.seq_lens) and torch.equal(before[1] + 1, batch.seq_lens_cpu)
            assert before[0] is not batch.seq_lens and before[1] is not batch.seq_lens_cpu
        for i, req in enumerate(self.reqs):
            if speculative:  # the verify writes its draft rows from the request's length on
                writes = range(req.length, req.length + DRAFT)
            else:  # the input token's row, where SGLang's preparation put its slot (the held step writes there)
                assert int(batch.seq_lens[i]) - 1 == req.length == int(batch.seq_lens_cpu[i]) - 1
                slot = self.held_slots(batch)[i]
                assert slot.dtype == torch.int64 and int(slot) == int(self.rows[req.req_pool_idx, req.length]), kind
                writes = range(req.length, req.length + 1)
            assert writes.stop <= req.kv.kv_allocated_len, (kind, req.length, req.kv.kv_allocated_len)
        if self.in_flight is not None:  # the step before's result processing: its tokens reach the host, and
            for req in self.reqs:  # spec-v2 commits them there (a non-speculative step committed at preparation)
                req.host += self.in_flight[1]
                if self.in_flight[0]:
                    req.kv_committed_len += self.in_flight[1]
        for req in self.reqs:  # the launched step's tokens become the requests' (one a non-speculative step)
            for p in range(req.length, req.length + (accepted if speculative else 1)):
                req.written.setdefault(p, int(self.rows[req.req_pool_idx, p]))
            req.length += accepted if speculative else 1
        self.in_flight = (speculative, accepted if speculative else 1)
        self.check(kind)

    def check(self, where: str):
        held = sum(r.kv.kv_allocated_len for r in self.reqs)
        assert self.allocator.available_size() + held == POOL, f"{where}: KV slots leaked"
        slots = torch.cat([self.rows[r.req_pool_idx, :r.kv.kv_allocated_len] for r in self.reqs])
        assert slots.unique().numel() == slots.numel(), f"{where}: a KV slot held twice"
        for r in self.reqs:
            assert all(int(self.rows[r.req_pool_idx, p]) == s for p, s in r.written.items()), f"{where}: a slot moved"
            # what a release at this point caches and frees is right: the commit never past the host's tokens (the
            # radix cache takes [:committed]), at most the one token of a step in flight behind
            assert r.host - 1 <= r.kv_committed_len <= r.host, (where, r.kv_committed_len, r.host)
        if self.batch.spec_algorithm.is_none():
            assert [r.kv_committed_len for r in self.reqs] == [r.kv.kv_allocated_len for r in self.reqs] \
                == self.batch.seq_lens.tolist()


SCHEDULE = [("spec", 3), ("spec", 1), ("spec", 1), ("enter", 1), ("nonspec", 1), ("nonspec", 1), ("leave", 1),
            ("spec", 1), ("spec", 4), ("spec", 1), ("enter", 1), ("nonspec", 1), ("leave", 1), ("spec", 2)]


# quick turns: back right after the turn, and drafting with full accepts after a held step
QUICK_TURNS = [("spec", 1), ("spec", 1), ("enter", 1), ("leave", 1), ("spec", 1), ("enter", 1), ("nonspec", 1),
               ("leave", 1), ("spec", 4), ("spec", 4), ("spec", 1), ("spec", 1)]


@pytest.mark.parametrize("steps", [SCHEDULE, QUICK_TURNS], ids=["schedule", "quick-turns"])
def test_turning_the_batch_keeps_every_slot_and_length_right_on_sglangs_preparations(sglang_preps, steps):
    """Spec steps (full and one-token accepts), the turn while the plain step is in flight, non-speculative steps, the
    turn back, a resume and drafting again, twice; and turns in quick succession."""
    schedule = Schedule()
    for kind, accepted in steps:
        schedule.step(kind, accepted)
    assert schedule.batch.spec_algorithm is EAGLE
    last = steps[-1][1]  # the last step's tokens in flight, uncommitted
    assert [r.length for r in schedule.reqs] == [r.kv_committed_len + last for r in schedule.reqs]


def test_the_turn_frees_the_reservation_beyond_the_plain_steps_token(sglang_preps):
    schedule = Schedule(prompts=(5,))
    schedule.step("spec", 1)
    schedule.step("spec", 1)  # the plain step in flight: length 6 committed, its token goes at 6
    available = schedule.allocator.available_size()
    schedule.step("enter", 1)
    req = schedule.reqs[0]
    # SGLang reserved from the length it knew at the last preparation (5); 7 kept (6 for the step in flight), one slot
    # more for this step's token
    assert req.kv.kv_allocated_len == 8 and schedule.allocator.available_size() == available + (5 + RESERVE - 7) - 1


@pytest.mark.parametrize("off_by", [0, 2])
def test_a_turn_at_the_wrong_length_is_caught(sglang_preps, off_by):
    """The broken variants: lengths of the committed length alone (the plain step's token overwritten) or one too
    many (a slot left unwritten and the commit ahead of the KV)."""

    def broken_enter(batch):
        original = nonspec.committed
        nonspec.committed = lambda req: original(req) + off_by - 1
        try:
            nonspec.enter(batch)
        finally:
            nonspec.committed = original

    schedule = Schedule()
    schedule.step("spec", 1)
    schedule.step("spec", 1)
    with pytest.raises(AssertionError):
        schedule.step("enter", 1, enter=broken_enter)
        schedule.step("nonspec", 1)


def test_a_held_step_in_any_other_slot_is_caught(sglang_preps):
    """The broken variant: the held step's slots read from ``req_to_token`` at the lengths after the token (where
    nothing was allocated) instead of the preparation's ``out_cache_loc``."""
    schedule = Schedule()
    schedule.held_slots = lambda batch: schedule.rows[batch.req_pool_indices, batch.seq_lens].to(torch.int64)
    for kind in ("spec", "spec"):
        schedule.step(kind, 1)
    with pytest.raises(AssertionError):
        schedule.step("enter", 1)


@pytest.fixture
def installed(monkeypatch):
    """The route's wrappers on SGLang's ``ScheduleBatch`` and result processor for one test (a route that decides
    nothing: the schedule turns the batch itself), restored after it."""
    for owner, name in ((ScheduleBatch, "prepare_for_decode"), (ScheduleBatch, "new_tokens_required_next_decode"),
                        (nonspec.SchedulerBatchResultProcessor, "process_batch_result_decode")):
        monkeypatch.setattr(owner, name, getattr(owner, name))
    monkeypatch.setattr(schedule_batch, "get_alloc_reserve_per_decode", lambda *a: RESERVE)
    route = SimpleNamespace(prepare_decode=lambda prepare, batch: prepare(batch))
    nonspec.install(route)
    yield route
    nonspec.ROUTE = None


def test_a_held_batch_is_checked_for_room_to_turn_back_before_its_preparation(sglang_preps, installed):
    """SGLang checks a decode step's memory (``check_decode_mem``, evicting or retracting on a shortfall) before its
    preparation, where the batch may turn back and reserve the speculative KV at once: a held batch asks room for that
    reservation, so that the turn back never allocates past what was checked. Found: a pool left with one slot a
    request passed the non-speculative check, then the turn back raised SGLang's out-of-memory error."""
    schedule = Schedule()
    batch = schedule.batch
    batch.new_tokens_required_next_decode = lambda sel=None: ScheduleBatch.new_tokens_required_next_decode(batch, sel)
    batch._new_tokens_required_next_decode_spec_v2 = (
        lambda reqs, size: ScheduleBatch._new_tokens_required_next_decode_spec_v2(batch, reqs, size))
    for kind, accepted in SCHEDULE[:5]:
        schedule.step(kind, accepted)
    assert batch.spec_algorithm.is_none()
    assert ScheduleBatch.new_tokens_required_next_decode(batch) == RESERVE * len(schedule.reqs)
    assert ScheduleBatch.new_tokens_required_next_decode(batch, [0]) == RESERVE
    schedule.allocator.alloc(schedule.allocator.available_size() - len(schedule.reqs))  # other requests took the rest
    assert not ScheduleBatch.check_decode_mem(batch)  # SGLang retracts now, before the turn back
    nonspec.ROUTE = None  # SGLang's own estimate: one slot a request, which would pass
    assert ScheduleBatch.check_decode_mem(batch)


@pytest.mark.parametrize("seed", range(3))
def test_the_room_to_turn_back_is_sglangs_speculative_need_at_page_size_1(monkeypatch, seed):
    """nonspec.spec_v2_need_page_1 (the held batch's memory check, one sum without a call a request) equals SGLang's
    ``ScheduleBatch._new_tokens_required_next_decode_spec_v2(reqs, 1)`` on requests holding less, as much as and more
    than their reservation past the commit (batch 1 included); the reservation read once per install."""
    monkeypatch.setattr(schedule_batch, "get_alloc_reserve_per_decode", lambda *a: RESERVE)
    nonspec.install(SimpleNamespace(prepare_decode=None))
    try:
        generator = torch.Generator().manual_seed(seed)
        for bs in (1, 2, 7):
            committed = torch.randint(1, 60, (bs,), generator=generator).tolist()
            held = torch.randint(0, 2 * RESERVE, (bs,), generator=generator).tolist()
            reqs = [SimpleNamespace(kv_committed_len=c, kv=SimpleNamespace(kv_allocated_len=c + h))
                    for c, h in zip(committed, held, strict=True)]
            sglang = ScheduleBatch._new_tokens_required_next_decode_spec_v2(None, reqs, 1)
            assert nonspec.spec_v2_need_page_1(reqs) == sglang
        assert sglang > 0 and any(h > RESERVE for h in held)  # both sides of the reservation were drawn
        monkeypatch.setattr(schedule_batch, "get_alloc_reserve_per_decode", lambda *a: RESERVE + 1)
        assert nonspec.spec_v2_need_page_1(reqs) == sglang  # kept until the next install
    finally:
        nonspec.ROUTE = None


@pytest.mark.parametrize("instrument", [False, True])
def test_a_held_batch_enters_its_step_directly_unless_an_instrument_times_it(monkeypatch, instrument):
    """The worker's ``forward_batch_generation`` of a non-speculative decode batch runs the held step itself (no
    wrapper around it) unless the cycle timing is on in the process, whose ``worker_step`` then times it."""
    from sgl_eagle_triton import cycle_timing

    monkeypatch.setattr(cycle_timing, "ACTIVE", instrument)
    timed = []
    monkeypatch.setattr(cycle_timing, "worker_step", lambda worker, parent, call: timed.append(True) or call())
    w = EagleTritonWorkerV2.__new__(EagleTritonWorkerV2)
    w.nonspec_on, w._decided_at_prep, w.cost_policy = True, True, None
    w._nonspec_step = lambda batch: "held step"
    batch = SimpleNamespace(spec_algorithm=SpeculativeAlgorithm.NONE, is_extend_in_batch=False,
                            forward_mode=schedule_batch.ForwardMode.DECODE)
    w.__dict__["_cycle_timing"] = timing = SimpleNamespace(state="steps0")  # (labelled at the preparation)
    assert w.forward_batch_generation(batch) == "held step"
    assert timed == ([True] if instrument else []) and not w._decided_at_prep and w._plain_inflight is None
    assert timing.state == ("steps0-held" if instrument else "steps0")  # the cycle timing's per-state line


def test_a_held_step_of_the_last_held_steps_rows_takes_its_tokens_without_the_gather(monkeypatch):
    """nonspec.relayed_tokens: the same req_pool_indices tensor as the held step before (nothing filtered, merged or
    retracted since) -> that step's tokens, no read of the relay; another tensor of the same rows, no last step, or
    SGLang's CI assertions (consume-once) -> the gather from the relay's buffer."""
    buf = torch.arange(100, 110)
    monkeypatch.setattr(relay, "SERVER_FUTURE_MAP", SimpleNamespace(output_tokens_buf=buf))
    rows, last_tokens = torch.tensor([2, 5]), torch.tensor([7, 8])
    batch = SimpleNamespace(req_pool_indices=rows)
    assert nonspec.relayed_tokens(batch, (rows, last_tokens)) is last_tokens
    assert nonspec.relayed_tokens(batch, (rows.clone(), last_tokens)).tolist() == [102, 105]
    assert nonspec.relayed_tokens(batch, None).tolist() == [102, 105]
    monkeypatch.setattr(nonspec, "_CI_ASSERTS", True)
    monkeypatch.setattr(nonspec.overlap_utils, "_assert_nonneg_and_invalidate", lambda *a: None)
    assert nonspec.relayed_tokens(batch, (rows, last_tokens)).tolist() == [102, 105]


def test_any_launch_but_a_held_step_drops_the_held_steps_tokens(monkeypatch):
    """The worker keeps the last held step's (rows, tokens) for the next held step only: a prefill, a speculative
    step or an idle batch launched in between (which moves or replaces the rows' last tokens) drops them."""
    from sgl_eagle_triton.worker import EAGLEWorkerV2

    monkeypatch.setattr(EAGLEWorkerV2, "forward_batch_generation", lambda self, batch, *a, **k: "sglang's")
    w = EagleTritonWorkerV2.__new__(EagleTritonWorkerV2)
    w.nonspec_on, w._decided_at_prep, w.cost_policy, w._ab_steps, w.plain_off = True, False, None, 0, None
    w._nonspec_step = lambda batch: "held step"
    held = SimpleNamespace(spec_algorithm=SpeculativeAlgorithm.NONE, is_extend_in_batch=False,
                           forward_mode=schedule_batch.ForwardMode.DECODE)
    w._held_last = "last"
    assert w.forward_batch_generation(held) == "held step" and w._held_last == "last"  # (the step's own to replace)
    for other in (SimpleNamespace(spec_algorithm=SpeculativeAlgorithm.NONE, is_extend_in_batch=False,
                                  forward_mode=schedule_batch.ForwardMode.EXTEND),
                  SimpleNamespace(spec_algorithm=SpeculativeAlgorithm.EAGLE, is_extend_in_batch=False,
                                  forward_mode=schedule_batch.ForwardMode.DECODE)):
        w._held_last = "last"
        assert w.forward_batch_generation(other) == "sglang's" and w._held_last is None


@pytest.mark.parametrize("past", [1, 3])
def test_a_held_batch_frees_what_a_merged_prefill_holds_beyond_its_commit(sglang_preps, past):
    schedule = Schedule(prompts=(5, 9))
    batch = schedule.batch
    for kind, accepted in SCHEDULE[:5]:
        schedule.step(kind, accepted)
    merged = schedule.reqs[1]
    merged.kv.kv_allocated_len += past  # a request merged in holding slots past its commit
    schedule.rows[merged.req_pool_idx, merged.kv_committed_len:merged.kv.kv_allocated_len] = \
        schedule.allocator.alloc(past).to(torch.int32)
    available = schedule.allocator.available_size()
    nonspec.trim(batch)
    assert merged.kv.kv_allocated_len == merged.kv_committed_len
    assert schedule.allocator.available_size() == available + past
    nonspec.trim(batch)  # nothing more
    assert schedule.allocator.available_size() == available + past
    assert nonspec.can_stay(batch)
    batch.seq_lens_cpu = None  # a prefill merged in without host lengths: the batch turns back instead
    assert not nonspec.can_stay(batch)


def test_the_relay_keeps_the_lengths_of_a_batch_turned_back(monkeypatch):
    """SGLang's own ``FutureMap``: a draft input marked by ``nonspec.leave`` keeps ``seq_lens``; unmarked, SGLang's
    resolve gathers the published lengths."""
    monkeypatch.setattr(spec_utils, "spec_need_hidden_states", lambda *a, **k: True)
    pool = SimpleNamespace(req_to_token=torch.zeros(8, 16, dtype=torch.int32))
    fm = relay.bonus_only_after_fill(SpeculativeAlgorithm.EAGLE3.create_future_map(torch.device("cpu"), pool))
    assert relay.SERVER_FUTURE_MAP is fm
    rows = torch.tensor([2, 5])
    fm.publish(rows, torch.tensor([40, 50]))
    batch = SimpleNamespace(seq_lens=torch.tensor([7, 9]), req_pool_indices=rows, reqs=[0, 1], spec_algorithm=None)
    nonspec.leave(batch, EAGLE, (None, None, None))
    fm.resolve_seq_lens_cpu(batch)
    assert batch.seq_lens.tolist() == [7, 9] and batch.spec_info.future_indices is rows
    assert batch.spec_info.bonus_tokens.tolist() == [-1, -1]  # a placeholder that fails loudly if ever read
    batch.spec_info = SimpleNamespace(future_indices=rows)
    fm.resolve_seq_lens_cpu(batch)
    assert batch.seq_lens.tolist() == [40, 50]


# The worker's side

class _Batch(SimpleNamespace):
    pass


def _worker(monkeypatch, steps=0, fill_kv_only=True, inflight=None):
    w = EagleTritonWorkerV2.__new__(EagleTritonWorkerV2)
    decided = []
    w.activate_step_by_batch = lambda bs: decided.append(bs)
    w._draft_worker = SimpleNamespace(fill_kv_only=fill_kv_only, stubs_of=lambda batch: ("p", "i", "h"))
    monkeypatch.setattr(EagleTritonWorkerV2, "speculative_num_steps", steps, raising=False)
    w._plain_inflight = inflight
    return w, decided


def _decode_batch(reqs, algorithm=EAGLE, **kw):
    return _Batch(reqs=reqs, spec_algorithm=algorithm, forward_mode=SimpleNamespace(is_idle=lambda: False),
                  return_logprob=False, return_hidden_states=False, has_grammar=False,
                  **{"seq_lens": None, "seq_lens_cpu": None, **kw})


def _route(monkeypatch):
    turned = []
    monkeypatch.setattr(nonspec, "enter", lambda batch: turned.append("enter"))
    monkeypatch.setattr(nonspec, "leave", lambda batch, algorithm, stubs: turned.append(("leave", algorithm, stubs)))
    monkeypatch.setattr(nonspec, "trim", lambda batch: turned.append("trim"))
    return turned


def test_a_plain_step_turns_the_batch_once_its_plain_step_is_in_flight_for_every_request(monkeypatch):
    turned = _route(monkeypatch)
    a, b = object(), object()
    w, decided = _worker(monkeypatch, inflight=[a, b])
    prepared = []
    batch = _decode_batch([a])
    w.prepare_decode(prepared.append, batch)
    assert turned == ["enter"] and prepared == [batch] and decided == [1] and w._decided_at_prep
    assert w._algorithm is EAGLE
    turned.clear()
    w._plain_inflight = [a]  # a request joined since the plain step launched: one more plain step on the spec path
    w.prepare_decode(prepared.append, _decode_batch([a, b]))
    assert turned == []


@pytest.mark.parametrize("why", ["drafts", "resumes", "logprobs", "no plain step in flight"])
def test_other_steps_keep_the_batch_speculative(monkeypatch, why):
    turned = _route(monkeypatch)
    a = object()
    w, _ = _worker(monkeypatch, steps=3 if why == "drafts" else 0, fill_kv_only=why != "resumes",
                   inflight=None if why == "no plain step in flight" else [a])
    batch = _decode_batch([a])
    batch.return_logprob = why == "logprobs"
    w.prepare_decode(lambda batch: None, batch)
    assert turned == []


@pytest.mark.parametrize("why", ["drafts", "resumes", "logprobs", "no host lengths"])
def test_a_non_speculative_batch_turns_back_when_the_step_is_not_a_plain_one(monkeypatch, why):
    turned = _route(monkeypatch)
    monkeypatch.setattr(nonspec, "can_stay", lambda batch: why != "no host lengths")
    w, _ = _worker(monkeypatch, steps=3 if why == "drafts" else 0, fill_kv_only=why != "resumes")
    w._algorithm = EAGLE
    batch = _decode_batch([object()], algorithm=SpeculativeAlgorithm.NONE)
    batch.return_logprob = why == "logprobs"
    w.prepare_decode(lambda batch: None, batch)
    assert turned == [("leave", EAGLE, ("p", "i", "h"))]


def test_a_held_plain_step_keeps_the_batch_non_speculative(monkeypatch):
    turned = _route(monkeypatch)
    monkeypatch.setattr(nonspec, "can_stay", lambda batch: True)
    w, _ = _worker(monkeypatch)
    w.prepare_decode(lambda batch: None, _decode_batch([object()], algorithm=SpeculativeAlgorithm.NONE))
    assert turned == ["trim"]


def test_the_non_speculative_step_is_the_plain_step_before_its_token_and_hands_the_batch_back(monkeypatch):
    relayed = []
    monkeypatch.setattr(nonspec, "relayed_tokens", lambda batch, last: relayed.append(last) or torch.tensor([7, 8]))
    unfenced = []
    monkeypatch.setattr(nonspec, "publish_unfenced", lambda: unfenced.append(True))
    w = EagleTritonWorkerV2.__new__(EagleTritonWorkerV2)
    from sgl_eagle_triton.off_step import PlainOff

    w.plain_off, w.topk = PlainOff("cpu"), 1
    seen, filled = {}, []

    def run(batch, held):
        seen.update(seq_lens=batch.seq_lens.tolist(), seq_lens_cpu=batch.seq_lens_cpu.tolist(),
                    seq_lens_sum=batch.seq_lens_sum, tokens=batch.spec_info.draft_token.tolist(),
                    positions=batch.spec_info.positions.tolist(), held=held)
        return "result"

    result = SimpleNamespace(next_token_ids=torch.tensor([9, 10]))
    w._run_plain_step = lambda batch, held: run(batch, held) and result
    w._draft_worker = SimpleNamespace(fill_after_plain_step=lambda batch, result: filled.append(
        (batch.seq_lens.tolist(), result, list(unfenced))))
    after, slots, rows = torch.tensor([11, 21]), torch.tensor([40, 41]), torch.tensor([3, 5])
    batch = SimpleNamespace(seq_lens=after, seq_lens_cpu=after.clone(), seq_lens_sum=32, spec_info=None,
                            forward_mode="verify", out_cache_loc=slots, req_pool_indices=rows)
    assert w._nonspec_step(batch) is result and relayed == [None]
    # the next held step's input: this step's tokens for these rows (nonspec.relayed_tokens decides)
    assert w._held_last[0] is rows and w._held_last[1] is result.next_token_ids
    held = seen.pop("held")  # the preparation's slots and lengths after the token (off_step.HeldStep)
    assert held.slots is slots and held.seq_lens_after is after
    assert seen == {"seq_lens": [10, 20], "seq_lens_cpu": [10, 20], "seq_lens_sum": 30, "tokens": [7, 8],
                    "positions": [10, 20]}
    assert filled == [([10, 20], result, [])]  # the fill, then the publish announced unfenced
    assert unfenced == [True]
    assert batch.seq_lens is after and batch.seq_lens_cpu.tolist() == [11, 21] and batch.spec_info is None
    assert batch.seq_lens_sum == 32 and batch.forward_mode.is_decode()
    # where the preparation of this batch's lengths kept the ones before the token, the step reads those tensors
    before, before_cpu = torch.tensor([10, 20]), torch.tensor([10, 20])
    lengths = {}
    w._run_plain_step = lambda batch, held: lengths.update(seq_lens=batch.seq_lens, cpu=batch.seq_lens_cpu) or result
    w._lengths_before = ((before, before_cpu), after)
    w._nonspec_step(batch)
    assert relayed[-1] == (rows, result.next_token_ids)
    assert lengths["seq_lens"] is before and lengths["cpu"] is before_cpu and w._lengths_before is None
    w._lengths_before = ((torch.tensor([0, 0]), torch.tensor([0, 0])), torch.tensor([11, 21]))  # another batch's
    w._nonspec_step(batch)
    assert lengths["seq_lens"].tolist() == [10, 20] and lengths["cpu"].tolist() == [10, 20]


def test_the_preparation_keeps_the_lengths_before_a_non_speculative_step(monkeypatch):
    """The lengths a non-speculative preparation replaced are kept for the step (with the lengths it made, to know
    the batch); after a speculative one nothing is."""
    _route(monkeypatch)
    monkeypatch.setattr(nonspec, "can_stay", lambda batch: True)
    w, _ = _worker(monkeypatch)
    batch = _decode_batch([object()], algorithm=SpeculativeAlgorithm.NONE)
    before = (torch.tensor([4]), torch.tensor([4]))
    batch.seq_lens, batch.seq_lens_cpu = before

    def prepare(batch):
        batch.seq_lens, batch.seq_lens_cpu = batch.seq_lens + 1, batch.seq_lens_cpu + 1

    w.prepare_decode(prepare, batch)
    assert w._lengths_before[0] == before and w._lengths_before[1] is batch.seq_lens
    w.prepare_decode(lambda batch: None, _decode_batch([object()]))  # (SGLang's speculative preparation)
    assert w._lengths_before is None


class _Running:
    """What the feed reads and counts on a request (SGLang's ``Req`` fields)."""

    def __init__(self, finished=False, histogram=()):
        self.spec_verify_ct, self.is_retracted = 4, False
        self.finished_reason = "length" if finished else None
        self.spec_correct_drafts_histogram = list(histogram)


def test_a_non_speculative_result_feeds_the_policy_and_the_metrics_a_plain_step(monkeypatch):
    """As SGLang's spec-v2 processing of a plain step: the policy gets zero drafts a request, the server's metrics a
    step of one token a request, each running request one more verify of nothing accepted (a finished one nothing):
    the counts SGLang's own ``Req.finished`` / ``Req.update_spec_correct_drafts_histogram(0)`` make on a twin."""
    w = EagleTritonWorkerV2.__new__(EagleTritonWorkerV2)
    fed, counted = [], []
    w.on_verify_complete_cpu = lambda correct, batch_size=0: fed.append((correct, batch_size))
    processor = SimpleNamespace(metrics_reporter=SimpleNamespace(update_spec_metrics=lambda bs, n: counted.append(
        (bs, n))))
    cases = [{}, {"finished": True, "histogram": [3]}, {"histogram": [2, 5]}]
    reqs, twins = [_Running(**case) for case in cases], [_Running(**case) for case in cases]
    w.feed_nonspec_step(processor, SimpleNamespace(reqs=reqs))
    assert fed == [([0, 0, 0], 3)] and counted == [(3, 0)]
    for twin in twins:
        if not schedule_batch.Req.finished(twin):
            twin.spec_verify_ct += 1
            schedule_batch.Req.update_spec_correct_drafts_histogram(twin, 0)
    assert [r.spec_verify_ct for r in reqs] == [t.spec_verify_ct for t in twins] == [5, 4, 5]
    assert [r.spec_correct_drafts_histogram for r in reqs] == [t.spec_correct_drafts_histogram for t in twins] \
        == [[1], [3], [3, 5]]


def test_the_ab_arm_without_the_route_keeps_plain_steps_on_the_speculative_path(monkeypatch):
    """config.AB_FEATURE_ENV=off_nonspec: the arm is chosen at the batch's preparation, before the state; its off arm
    turns a non-speculative batch back and turns none."""
    turned = _route(monkeypatch)
    monkeypatch.setattr(nonspec, "can_stay", lambda batch: True)
    a = object()
    w, _ = _worker(monkeypatch, inflight=[a])
    arms = []
    w._ab_steps = 1
    w._next_ab_arm = lambda: arms.append(w._nonspec_paused)
    w._nonspec_paused = True
    w.prepare_decode(lambda batch: None, _decode_batch([a]))
    w._algorithm = EAGLE
    w.prepare_decode(lambda batch: None, _decode_batch([a], algorithm=SpeculativeAlgorithm.NONE))
    assert turned == [("leave", EAGLE, ("p", "i", "h"))] and arms == [True, True]


def test_the_route_is_refused_under_1_and_declined_unset_where_it_cannot_run(monkeypatch):
    """Unset, the route runs wherever it can: without a plain steps 0 nothing happens (that is reported already), and
    where SGLang's touchpoints moved or the server's arguments leave it out it is declined (kept for the kernel report;
    tree candidates and EAGLE-1 drafts are served); under OFF_NONSPEC=1 those refuse the server, naming the variable;
    under 0 nothing runs."""
    installed = []
    monkeypatch.setattr(nonspec, "install", installed.append)
    monkeypatch.setenv(config.OFF_NONSPEC_ENV, "1")
    w = EagleTritonWorkerV2.__new__(EagleTritonWorkerV2)
    w.server_args = SimpleNamespace(tp_size=1, dp_size=1, page_size=1, disable_overlap_schedule=False,
                                    speculative_adaptive=True)
    w.plain_off, w.plain_off_declined, w.topk = None, "steps 0 is not an adaptive candidate", 1
    monkeypatch.setattr(config, "current_draft_kind", lambda: config.EAGLE3)
    with pytest.raises(RuntimeError, match=config.OFF_NONSPEC_ENV):
        w.start_nonspec()
    monkeypatch.delenv(config.OFF_NONSPEC_ENV)
    w.start_nonspec()
    assert not w.nonspec_on and w.nonspec_declined is None
    w.plain_off = object()
    monkeypatch.setattr(nonspec, "problems", lambda: ["SGLang 0.5.23 (read and run on 0.5.17 only)"])
    w.start_nonspec()
    assert not w.nonspec_on and "0.5.23" in w.nonspec_declined and not installed
    monkeypatch.setenv(config.OFF_NONSPEC_ENV, "1")
    with pytest.raises(RuntimeError, match="0.5.23"):
        w.start_nonspec()
    monkeypatch.setattr(nonspec, "problems", lambda: [])
    # the server's arguments as the worker reads them (SGLang may turn the overlap scheduler off after the check)
    w.server_args.disable_overlap_schedule = True
    with pytest.raises(RuntimeError, match="--disable-overlap-schedule"):
        w.start_nonspec()
    monkeypatch.delenv(config.OFF_NONSPEC_ENV)
    w.nonspec_declined = None
    w.start_nonspec()
    assert not w.nonspec_on and "--disable-overlap-schedule" in w.nonspec_declined and not installed
    w.server_args.disable_overlap_schedule, w.nonspec_declined = False, None
    monkeypatch.setenv(config.OFF_NONSPEC_ENV, "0")
    w.start_nonspec()
    assert not w.nonspec_on and not installed
    # unset, over tree candidates and an EAGLE-1 draft too (GPU-run end to end)
    monkeypatch.delenv(config.OFF_NONSPEC_ENV)
    for topk, kind in ((4, config.EAGLE3), (1, config.EAGLE)):
        w.topk, w.nonspec_declined = topk, None
        monkeypatch.setattr(config, "current_draft_kind", lambda kind=kind: kind)
        w.start_nonspec()
        assert w.nonspec_on and installed == [w] and w.nonspec_declined is None, w.nonspec_declined
        w.nonspec_on = False
        installed.clear()
    monkeypatch.setenv(config.OFF_NONSPEC_ENV, "1")  # required there too
    w.topk = 4
    w.start_nonspec()
    assert w.nonspec_on and installed == [w] and w.nonspec_declined is None


def test_the_ab_arms_alternate_the_route(monkeypatch):
    """config.AB_FEATURE_ENV=off_nonspec alternates the route every AB_STEPS decode steps (its off arm: paused)."""
    w = EagleTritonWorkerV2.__new__(EagleTritonWorkerV2)
    w.nonspec_on, w._ab_steps, w._ab_feature, w._ab_count = True, 2, "off_nonspec", 0
    paused = []
    for _ in range(6):
        w._next_ab_arm()
        paused.append(w._nonspec_paused)
    assert paused == [False, False, True, True, False, False]
    assert off_route.NONSPEC_STEP and config.AB_ARMS["off_nonspec"] == ("nonspec", "spec-path")
