"""Adaptive steps 0 ("off") as a plain decode step, wherever it can run (``EagleTritonWorkerV2.start_plain_off``;
``SGLANG_EAGLE_TRITON_PLAIN_OFF``, config.PLAIN_OFF_ENV: 1 requires it, 0 keeps SGLang's verify); lossless end to end
on one GPU while switching in and out of steps 0, greedy and sampled (tests/test_e2e_adaptive.py).

SGLang's steps 0 verifies a one-node tree through its speculative verify (``run_eagle_verify``: the verify input's
retrieve arrays and mask fill, cache locations by a Triton kernel, the graph's buffers loaded in a pre-plan,
``eagle_sample``, accepted-token gathers and the bonus-token kernel). This step does what SGLang's no-spec decode
does instead, inside SGLang's steps-0 flow (``EAGLEWorkerV2.forward_batch_generation`` calls the worker's
``_build_trivial_verify_input`` then ``verify``, both routed here by the worker, then its ``_draft_extend_for_decode``,
whose steps-0 draft KV fill is unchanged):

- :meth:`PlainOff.verify_input`: SGLang's one-node ``EagleVerifyInput`` from cached per-batch-size constants, no
  kernel launches (``positions`` = ``seq_lens`` [bs] int64, ``draft_token`` = the relayed bonus tokens [bs]);
- :meth:`PlainOff.step`: the bonus token's KV slot ``req_to_token[req, seq_lens]`` (the one SGLang reserved for it),
  the target's one-token forward as a decode step runs it (the steps-0 state's CUDA graph, whose attention is already
  SGLang's decode: ``verify.OneNodeVerifyAttention``), SGLang's no-spec sampler, and the result SGLang's spec-v2
  processing reads: accept length 1 (the sampled token is the bonus token), ``new_seq_lens = seq_lens + 1``.

Where the steps-0 state's target CUDA graphs were captured with :class:`GraphEpilogue` (one GPU, the draft not
tensor-parallel), each of them ends with the greedy token and the draft KV fill of that token: a batch whose sampler
would pick the argmax (``glue.argmax_is_sample``) takes its token from the graph and skips both the sampler and the
fill's own graph; any other batch samples and fills as above (the fill then writes over the graph's).

A batch that asks for logprobs, hidden states or a grammar takes SGLang's steps 0 (:func:`serves`): its result
processing expects the speculative verify's shapes there. Every SGLang call goes through :mod:`sgl_eagle_triton.glue`.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from sgl_eagle_triton.glue import call_sites as glue

PLAIN_OFF_STEP = "plain off step"  # verify.RAN's key: plain steps 0 run (kernel report)
PLAIN_DIRECT = "plain off step entered directly"  # ... of them, entered before SGLang's steps-0 flow


def serves(batch) -> bool:
    """Whether a steps-0 decode ``batch`` (SGLang's ``ScheduleBatch``) can take the plain step: not idle, no logprobs
    (the spec result processing reads per-request lists), no hidden states returned, no grammar (the spec verify
    advances the grammar inside verify)."""
    return not (batch.forward_mode.is_idle() or batch.return_logprob or batch.return_hidden_states
                or batch.has_grammar)


def _capturing() -> bool:
    return torch.cuda.is_available() and torch.cuda.is_current_stream_capturing()


class GraphEpilogue:
    """The greedy token and its draft KV fill, captured at the end of every CUDA graph of the steps-0 state's target
    forward (TARGET_VERIFY, one token per request) through SGLang's capture tail hook (:meth:`hook`;
    ``glue.capture_tail_hook``): each graph then writes, at every replay, ``argmax`` of its logits [graph bs] int64
    into a static buffer (:attr:`tokens`, by captured batch size) and the draft KV of that token at its slot
    (``fill_rows(tokens [n] int64, target features [n, F], positions [n] int64, slots [n] int64)``: the draft worker's
    ``_fill_rows``). A padded row writes SGLang's padding slot 0, as the target's own KV write there does.
    ``sanitize_nan``: the argmax is over the logits with NaN / inf replaced as SGLang's sampler does when told to."""

    def __init__(self, fill_rows, sanitize_nan: bool = False, capturing=None):
        self.fill_rows = fill_rows
        self.sanitize_nan = sanitize_nan
        self.capturing = capturing or _capturing  # whether this call is the capture (not a warm-up run)
        self.tokens: dict[int, torch.Tensor] = {}
        self.ambiguous: set[int] = set()  # sizes captured more than once (several graphs of one size): not used
        self._views: dict[int, torch.Tensor | None] = {}  # tokens_of by batch size (made once the capture is done)

    def hook(self, graph_runner, logits_output, forward_batch, num_tokens: int) -> None:
        """SGLang's ``capture_tail_hooks`` entry, called after the target's forward in the capture's warm-up runs and
        in the capture itself; a graph of more than one token per request (a drafting state's) is left as it is."""
        if (not forward_batch.forward_mode.is_target_verify() or forward_batch.batch_size != num_tokens
                or logits_output.next_token_logits is None or logits_output.hidden_states is None):
            return
        logits = logits_output.next_token_logits
        if self.sanitize_nan:
            logits = torch.nan_to_num(logits, nan=-1e30, posinf=1e30, neginf=-1e30)
        tokens = torch.argmax(logits, dim=-1)
        self.fill_rows(tokens, logits_output.hidden_states, forward_batch.positions, forward_batch.out_cache_loc)
        if self.capturing():
            if num_tokens in self.tokens:
                self.ambiguous.add(num_tokens)
            self.tokens[num_tokens] = tokens
            self._views.clear()

    def tokens_of(self, bs: int) -> torch.Tensor | None:
        """The greedy tokens [bs] int64 written by the last replay of a ``bs``-request batch (SGLang pads it to the
        smallest captured size that holds it); None where no graph of such a size was captured once."""
        if bs in self._views:
            return self._views[bs]
        size = min((s for s in self.tokens if s >= bs), default=None)
        view = None if size is None or size in self.ambiguous else self.tokens[size][:bs]
        self._views[bs] = view
        return view


class HeldStep(NamedTuple):
    """What SGLang's non-speculative preparation of a held batch already made for its step (off_route): ``slots``
    [bs] int64 (its ``out_cache_loc``: ``req_to_token`` at the lengths before the token, written there) and
    ``seq_lens_after`` [bs] (its ``seq_lens``: the token counted)."""

    slots: torch.Tensor
    seq_lens_after: torch.Tensor


class PlainOff:
    """The plain steps-0 step of one worker on ``device``; keeps constant per-batch-size tensors (the verify input's
    retrieve arrays [bs, 1] int64, the accept lengths [bs] int32 ones), made at a size's first step and never
    written."""

    def __init__(self, device, epilogue: GraphEpilogue | None = None):
        self.device = device
        self.epilogue = epilogue if epilogue is not None and epilogue.tokens else None
        self.filled = False  # the last step's token and draft KV fill came from the graph epilogue
        self._constants: dict[int, tuple] = {}
        self._held_inputs: dict[int, object] = {}  # held_input's verify input by batch size

    def _for(self, bs: int) -> tuple:
        constants = self._constants.get(bs)
        if constants is None:
            constants = self._constants[bs] = (
                torch.arange(bs, dtype=torch.int64, device=self.device).unsqueeze(1),
                torch.full((bs, 1), -1, dtype=torch.int64, device=self.device),
                torch.ones(bs, dtype=torch.int32, device=self.device))
        return constants

    def verify_input(self, batch, topk: int):
        """SGLang's one-node verify input of ``batch`` (its ``spec_info``: the relayed draft input), as its
        ``_build_trivial_verify_input`` builds it less the mask (none is read) and the launches."""
        return self.verify_input_of(batch.spec_info.bonus_tokens, batch.seq_lens, topk)

    def verify_input_of(self, tokens: torch.Tensor, seq_lens: torch.Tensor, topk: int):
        """The one-node verify input of ``tokens`` [bs] (any integer dtype) at positions ``seq_lens`` [bs]."""
        retrieve_index, retrieve_next, _ = self._for(seq_lens.shape[0])
        positions = seq_lens.to(torch.int64)  # the tensor itself when already int64
        return glue.one_node_verify_input(tokens, positions, retrieve_index, retrieve_next, topk)

    def held_input(self, tokens: torch.Tensor, seq_lens: torch.Tensor, topk: int):
        """:meth:`verify_input_of` for a held step (off_route), one object per batch size whose ``draft_token`` and
        ``positions`` each held step sets: a held step's verify input is read at its launch only (the forward batch
        and the graph's input copies), and the batch drops it after (its result carries no draft input)."""
        made = self._held_inputs.get(seq_lens.shape[0])
        if made is None or made.topk != topk:
            made = self._held_inputs[seq_lens.shape[0]] = self.verify_input_of(tokens, seq_lens, topk)
            return made
        made.draft_token, made.positions = tokens, seq_lens.to(torch.int64)
        return made

    def step(self, batch, target_worker, req_to_token: torch.Tensor, held: HeldStep | None = None):
        """One plain decode step of ``batch`` (its ``spec_info`` from :meth:`verify_input`) on ``target_worker``
        (SGLang's ``TpModelWorker``), ``req_to_token`` [requests, context] int32 SGLang's. Rebinds the batch's
        ``input_ids``, ``out_cache_loc`` [bs] int64 and ``forward_mode`` (as SGLang's verify does; the scheduler
        restores them). Returns SGLang's ``GenerationBatchResult``: ``next_token_ids`` [bs] (the sampler's dtype),
        ``accept_lens`` [bs] int32 ones, ``new_seq_lens`` [bs], ``next_draft_input.bonus_tokens`` [bs] int32, the
        target's ``logits_output`` (its ``hidden_states`` [bs, features] feed the draft KV fill). :attr:`filled` says
        whether the token and the fill came from the graph epilogue (the draft worker then skips its fill).

        ``held``: the step of a batch SGLang's non-speculative preparation made (off_route): its slots and lengths
        after the token are the preparation's, SGLang's non-speculative result processing reads no accept lengths
        (``accept_lens`` None: nothing to copy to the host), and the result carries no draft input (the scheduler
        relays the token itself as the next input, as after a no-spec step: glue.relay)."""
        verify_input = batch.spec_info
        batch.input_ids = verify_input.draft_token
        if held is None:
            batch.out_cache_loc = req_to_token[batch.req_pool_indices, batch.seq_lens].to(torch.int64)
        else:
            batch.out_cache_loc = held.slots
        forward_batch, output = glue.one_token_forward(target_worker, batch)
        bs = batch.seq_lens.shape[0]
        tokens = None
        if self.epilogue is not None and output.can_run_cuda_graph and glue.argmax_is_sample(batch.sampling_info):
            tokens = self.epilogue.tokens_of(bs)
        self.filled = tokens is not None
        if self.filled:  # the graph's buffer is written again at the next replay
            tokens = tokens.clone()
        else:
            tokens = glue.sample_as_decode(target_worker.model_runner, output.logits_output, forward_batch)
        if held is not None:  # the token is the next input, relayed as a no-spec step's: no draft input, no cast
            return glue.token_step_result(output, tokens, held.seq_lens_after, keep_alive=(forward_batch,))
        accept_lens = self._for(bs)[2]
        return glue.plain_step_result(output, tokens, accept_lens, batch.seq_lens + 1, keep_alive=(forward_batch,))
