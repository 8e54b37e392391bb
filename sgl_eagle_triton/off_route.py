"""Adaptive steps 0 held as SGLang's non-speculative decode (the default where it can run; config.OFF_NONSPEC_ENV):
the worker's side, the mixin :class:`NonspecRoute` of
:class:`sgl_eagle_triton.worker.EagleTritonWorkerV2`.

Where the policy holds steps 0, the running batch turns non-speculative for the scheduler (SGLang's own decode
preparation, launch and result processing; the scheduler's side, the lengths and the KV reservation:
:mod:`sgl_eagle_triton.glue.nonspec`) and the worker runs the plain step inside (:meth:`NonspecRoute._nonspec_step`).
The decision moves from the worker's launch to the batch's preparation (:meth:`NonspecRoute.prepare_decode`: the policy
puts the step's state in force there, the launch then keeps it):

- a step the policy drafts or resumes: a non-speculative batch turns speculative again (``nonspec.leave``: the step
  resumes with the full draft extend, as after any plain step);
- a plain step (steps 0, the draft KV filled only, a batch the plain step serves): a speculative batch whose plain
  step is in flight for every one of its requests turns non-speculative (``nonspec.enter``); otherwise the step runs
  as a plain step on the speculative path (the first of a run of them, or after a prefill merged new requests in);
  a non-speculative batch stays so.

The result processing of a non-speculative step feeds the policy and SGLang's speculative metrics a plain step's
zero accepted drafts (:meth:`NonspecRoute.feed_nonspec_step`), as the speculative path does.
"""

from __future__ import annotations

import logging

from sgl_eagle_triton import ALGORITHM_NAME, config, off_step
from sgl_eagle_triton.glue import call_sites as glue
from sgl_eagle_triton.glue import nonspec
from sgl_eagle_triton.verify import note_ran

logger = logging.getLogger(__name__)

NONSPEC_STEP = "plain off step as a non-speculative batch"  # verify.RAN's key (kernel report)
NONSPEC_ENTERED = "batch turned non-speculative"
NONSPEC_LEFT = "batch turned speculative again"


class NonspecRoute:
    """The route's methods on the EAGLE V2 worker (needs its ``plain_off``, ``draft_worker``, policy and
    ``_run_plain_step``)."""

    nonspec_on = False  # the route runs (start_nonspec)
    nonspec_declined: str | None = None  # why held steps 0 stays on the speculative path (start_nonspec)
    _decided_at_prep = False  # this decode step's state was put in force at its preparation
    _plain_inflight = None  # the requests (list) of the plain step launched last on the speculative path, if the
    # worker launched nothing since
    _algorithm = None  # the server's speculative algorithm (a non-speculative batch's, back)
    _nonspec_paused = False  # the A/B's arm without the route (config.AB_ARMS["off_nonspec"]): plain steps stay on
    # the speculative path
    _lengths_before = None  # ((seq_lens, seq_lens_cpu) before, seq_lens after) of the last non-speculative preparation
    _held_last = None  # (req_pool_indices, tokens) of the held step launched last, None after any other launch: the
    # next held step of the same rows takes its input from it (nonspec.relayed_tokens)

    def start_nonspec(self) -> None:
        """The route wherever it can run, unless ``config.OFF_NONSPEC_ENV=0``: not where the plain steps 0 does not
        run, nor for the server's arguments (``config.off_nonspec_unserved``: several GPUs, no overlap scheduler, pages
        over 1 token), nor where this SGLang's touchpoints moved (``nonspec.problems``). There, held steps 0 stays on
        the speculative path, the reason logged and kept in :attr:`nonspec_declined` (the kernel report); under
        ``config.OFF_NONSPEC_ENV=1`` the server is refused instead (RuntimeError naming what to change)."""
        mode = config.off_nonspec_mode()
        if mode == "off" or (self.plain_off is None and mode == "auto"):
            return  # "auto" without a plain steps 0 to hold (none a candidate, or declined and reported): nothing to do
        why, expected = None, True
        if self.plain_off is None:
            declined = self.plain_off_declined or "steps 0 is not an adaptive candidate"
            why = f"the plain steps 0 does not run ({declined})"
        elif (unserved := config.off_nonspec_unserved(self.server_args)) is not None:  # (read again here: SGLang may
            why = unserved[0]  # turn the overlap scheduler off after the argument check)
        elif problems := nonspec.problems():
            why, expected = "; ".join(problems), False
        if why is not None:  # (a warning where SGLang's touchpoints moved, else at info: the server's arguments)
            self._decline(config.OFF_NONSPEC_ENV, mode, "nonspec_declined", "held steps 0 runs the plain step on the "
                          "speculative path, not as SGLang's non-speculative decode", why, expected)
            return
        self.nonspec_on = True
        nonspec.install(self)
        logger.info("%s: adaptive steps 0, held, runs as SGLang's non-speculative decode (%s)", ALGORITHM_NAME,
                    f"{config.OFF_NONSPEC_ENV}=1" if mode == "on" else "the default")

    def prepare_decode(self, prepare, batch):
        """SGLang's ``ScheduleBatch.prepare_for_decode`` of ``batch`` (``prepare``), after this step's state is put in
        force and the batch turned (the module's docstring)."""
        self._pre_activated = False
        if self._ab_steps:  # the A/B's arm of this step, with its state (config.AB_STEPS_ENV)
            self._next_ab_arm()
        self.activate_step_by_batch(len(batch.reqs))
        self._decided_at_prep = True
        plain = (self.speculative_num_steps == 0 and self.draft_worker.fill_kv_only and off_step.serves(batch)
                 and not self._nonspec_paused)
        if batch.spec_algorithm is nonspec.NO_SPEC:
            if plain and nonspec.can_stay(batch):
                nonspec.trim(batch)
            else:
                nonspec.leave(batch, self._algorithm, self.draft_worker.stubs_of(batch))
                note_ran(NONSPEC_LEFT)
        elif plain and self._plain_in_flight_for(batch):
            self._algorithm = batch.spec_algorithm
            nonspec.enter(batch)
            note_ran(NONSPEC_ENTERED)
        before = (batch.seq_lens, batch.seq_lens_cpu)
        prepared = prepare(batch)
        # a non-speculative preparation counts the token in new tensors (SGLang 0.5.17: "new-tensor avoids racing"),
        # leaving these as the lengths before it: the step reads them (_nonspec_step) if it launches this batch
        self._lengths_before = (before, batch.seq_lens) if batch.spec_algorithm is nonspec.NO_SPEC else None
        return prepared

    def _plain_in_flight_for(self, batch) -> bool:
        """Whether the last step launched was a plain step on the speculative path of every request of ``batch``
        (launched, its result not yet processed: SGLang's overlap loop processes a step's result after launching the
        next, and prepares the next before that, also where it processes before the launch)."""
        inflight = self._plain_inflight
        if inflight is None:
            return False
        ids = {id(req) for req in inflight}
        return all(id(req) in ids for req in batch.reqs)

    def _nonspec_step(self, batch):
        """A decode step of a non-speculative ``batch`` (its preparation SGLang's: ``seq_lens`` count its input token,
        ``out_cache_loc`` [bs] its slot): the plain step of the relayed tokens (the previous held step's own where the
        batch holds its rows: ``nonspec.relayed_tokens``) at the lengths before the token (the tensors the preparation
        replaced, where it prepared these lengths) in that slot (no gather from ``req_to_token``; a result without
        accept lengths: SGLang's non-speculative processing reads none; no draft input: the scheduler relays the token
        as a no-spec step's), its draft KV fill, the batch as SGLang's launch expects it back (non-speculative lengths,
        decode mode, no draft input), and the scheduler's publish of its lengths left out
        (``nonspec.publish_unfenced``)."""
        after, after_cpu, after_sum = batch.seq_lens, batch.seq_lens_cpu, batch.seq_lens_sum
        held = off_step.HeldStep(batch.out_cache_loc, after)  # the preparation's slot and lengths
        kept, self._lengths_before = self._lengths_before, None
        before, before_cpu = kept[0] if kept is not None and kept[1] is after else (after - 1, after_cpu - 1)
        tokens = nonspec.relayed_tokens(batch, self._held_last)
        self._held_last = None
        before_sum = None if after_sum is None else after_sum - after.shape[0]
        batch.seq_lens, batch.seq_lens_cpu, batch.seq_lens_sum = before, before_cpu, before_sum
        batch.spec_info = self.plain_off.held_input(tokens, before, self.topk)
        try:
            result = self._run_plain_step(batch, held)  # (counted as a plain step and a held one)
            self.draft_worker.fill_after_plain_step(batch, result)
            self._held_last = (batch.req_pool_indices, result.next_token_ids)  # the relay stashes these for them
        finally:
            batch.seq_lens, batch.seq_lens_cpu, batch.seq_lens_sum = after, after_cpu, after_sum
            glue.as_decode(batch)
            batch.spec_info = None
        nonspec.publish_unfenced()  # the scheduler's publish of these lengths next: none resolves them on the host
        return result

    def feed_nonspec_step(self, processor, batch) -> None:
        """Before SGLang's result processing of a non-speculative decode ``batch`` (its ``processor``): the policy and
        the speculative metrics get a plain step's zero accepted drafts a request."""
        bs = len(batch.reqs)
        nonspec.feed_metrics(processor, batch)
        self.on_verify_complete_cpu([0] * bs, batch_size=bs)
