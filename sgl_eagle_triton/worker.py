"""EAGLE_TRITON's workers: thin subclasses of SGLang's EAGLE V2 workers.

SGLang's decode cycle stays SGLang's (scheduler, overlap, CUDA graphs, draft extend, target verify
forward, whose attention on the triton backend is ours: :class:`sgl_eagle_triton.verify.TreeVerifyAttention`,
swapped in by the plugin's hook). The draft, its tree building and token selection are ours:

- the draft: :meth:`TritonEagleDraftWorker.draft_forward` (the method SGLang's draft CUDA-graph
  runner captures) runs :class:`sgl_eagle_triton.drafter.FusedDrafter` of the tree shape in force, bound to
  the draft model's weights and KV pool when SGLang allocates the pool (under ``--speculative-adaptive``
  SGLang captures one draft graph per candidate shape while that shape is in force, and switches the
  worker's ``speculative_num_steps`` / ``speculative_num_draft_tokens`` between steps: each graph holds the
  drafter of its shape, an eager draft picks the one in force);

- adaptive steps 0 ("off", docs/adaptive.md): the state's target attention verifies its one node per request as
  a decode step (:func:`sgl_eagle_triton.verify.one_node_verify_attention`, when SGLang builds the state), and
  the draft extend is replaced by a fill of the committed tokens' draft KV
  (:meth:`TritonEagleDraftWorker.fill_draft_kv`); the move back to drafting runs one more step at 0 with the full
  extend (:meth:`EagleTritonWorkerV2.activate_step_by_batch`); its verify is a plain decode step
  (:mod:`sgl_eagle_triton.off_step`) wherever that can run (:meth:`EagleTritonWorkerV2.start_plain_off`;
  ``SGLANG_EAGLE_TRITON_PLAIN_OFF``: 1 requires it, 0 keeps SGLang's verify);
- the draft phase around it and the draft extend after a chain's verify: :mod:`sgl_eagle_triton.lean_phases` (our
  CUDA graphs around the fused drafter instead of SGLang's preparation and graph runners) wherever they can run
  (``SGLANG_EAGLE_TRITON_LEAN_DRAFT``, ``SGLANG_EAGLE_TRITON_LEAN_EXTEND``: 1 requires them, 0 keeps SGLang's);
- under ``--tp`` > 1: the fused drafter on SGLang's TP group (:func:`tensor_parallel`);

swapped in only while our workers call into SGLang, so that nothing else in the process changes:

- tree building: ``eagle_worker_common.build_tree_kernel_efficient`` during
  :meth:`TritonEagleDraftWorker.draft` -> :mod:`sgl_eagle_triton.kernels.build_tree`;
- verification, during :meth:`EagleTritonWorkerV2.verify`: ``eagle_worker_common.eagle_sample``
  -> :func:`sgl_eagle_triton.verify.eagle_sample` (sampled batches: Triton target probabilities and
  tree speculative sampling), and ``eagle_utils.verify_tree_greedy_func`` (greedy batches) ->
  :mod:`sgl_eagle_triton.kernels.verify_greedy`.

Every SGLang name above is rebound through :mod:`sgl_eagle_triton.glue` (the one place that touches SGLang's
internals). The glue proves itself twice. At start-up (:func:`sgl_eagle_triton.glue.call_sites.check_glue`) the
installed SGLang must be a served release, every SGLang method we wrap must still reach the name we rebind or the
method we override (read from the methods' bytecode), SGLang's signatures must be ones we handle and our overrides
must take every parameter SGLang passes, else the worker refuses to start. After the first draft and the first
verify of each kind, the kernel that should have run must have run (:data:`sgl_eagle_triton.verify.RAN`), else an
error goes to the log and to ``/server_info`` (``internal_states[0]["eagle_triton"]``,
:meth:`EagleTritonWorkerV2.kernel_report`).
"""

from __future__ import annotations

import contextlib
import logging
import os
import time
from collections import Counter

import sglang
import torch

from sgl_eagle_triton import (
    ALGORITHM_NAME,
    __version__,
    config,
    cycle_timing,
    draft_check,
    off_step,
    simulated_acceptance,
    verify,
)
from sgl_eagle_triton.adaptive import CostAwarePolicy, CycleCost, TreeEvidence, replay_ms
from sgl_eagle_triton.drafter import (
    FusedDrafter,
    TensorParallel,
    draft_weights,
    shard_layout,
    shard_layout_problems,
    vocab_shard,
)
from sgl_eagle_triton.glue import call_sites as glue
from sgl_eagle_triton.glue import nonspec
from sgl_eagle_triton.glue.args import settings
from sgl_eagle_triton.glue.call_sites import EagleDraftWorker, EAGLEWorkerV2
from sgl_eagle_triton.glue.relay import mark_stub
from sgl_eagle_triton.kernels.build_tree import build_tree_kernel_efficient
from sgl_eagle_triton.kernels.device import CUBLAS_MIN_ROWS
from sgl_eagle_triton.lean_phases import (  # noqa: F401 (LEAN_DRAFT, LEAN_EXTEND: RAN keys, here too)
    FUSED_DRAFTER,
    LEAN_DRAFT,
    LEAN_EXTEND,
    LeanDraftWorker,
    LeanStarts,
    _lean_draft,
    _lean_extend,
    captured_row_graphs,
    graph_sizes,
)
from sgl_eagle_triton.lean_phases import fused_draft as _fused_draft
from sgl_eagle_triton.off_route import NONSPEC_STEP, NonspecRoute
from sgl_eagle_triton.off_step import PLAIN_DIRECT, PLAIN_OFF_STEP, GraphEpilogue, PlainOff
from sgl_eagle_triton.row_graphs import RowGraphs
from sgl_eagle_triton.verify import (
    RAN,
    VERIFY_GREEDY,
    VERIFY_SAMPLING,
    TreeVerifyAttention,
    count_ran,
    one_node_verify_attention,
    witnessed,
)
from sgl_eagle_triton.verify_epilogue import VerifyEpilogue, from_graph

logger = logging.getLogger(__name__)

# Row counts steps 0's KV fill is compiled for before serving (TritonEagleDraftWorker.compile_draft_kv): Triton
# compiles an integer argument apart when it is 1 or a multiple of 16, and the linear kernel's tile changes at 16
# and 32 rows and its cuBLAS path starts at CUBLAS_MIN_ROWS (33): one row count of each class
DRAFT_KV_ROWS = (1, 2, 16, 17, 32, CUBLAS_MIN_ROWS, 48)

KERNELS_IN_USE = {
    "draft forward": "triton sgl_eagle_triton.drafter (draft_input, linear, draft_attention, lm_head_topk, "
    f"draft_select, draft_organize); from {CUBLAS_MIN_ROWS} rows per forward (batch x topk) on, the linears' and "
    "the LM head's GEMMs are cuBLAS between Triton rms_norm and Triton epilogue / top-k kernels",
    "build tree": "triton sgl_eagle_triton.kernels.build_tree",
    "verify greedy": "triton sgl_eagle_triton.kernels.verify_greedy",
    "verify sampling": "triton sgl_eagle_triton.kernels.target_probs + tree_sampling",
}
BUILD_TREE = "triton build_tree"
DRAFT_KV_FILL = "draft kv fill (steps 0)"
GRAPH_EPILOGUE = "steps 0 token and draft kv fill in the target graph"

_errors: list[str] = []


def _witness(what: str, before: int, when: str) -> None:
    """Log (and keep for ``/server_info``) an error unless ``RAN[what]`` moved past ``before``."""
    if RAN[what] <= before:
        message = (f"{ALGORITHM_NAME}: {what} did not run in {when} (SGLang {sglang.__version__} took another "
                   "path: stock kernels ran)")
        logger.error(message)
        _errors.append(message)


def our_eagle_sample(epilogue: VerifyEpilogue | None = None):
    """What the worker puts in place of SGLang's ``eagle_sample``: :func:`sgl_eagle_triton.verify.eagle_sample`,
    greedy chains first from the target's verify graphs where ``epilogue`` serves them
    (:func:`sgl_eagle_triton.verify_epilogue.from_graph`), wrapped in benchmark mode by the simulated acceptance as
    stock's is (:mod:`sgl_eagle_triton.simulated_acceptance`); decided once, at worker start, not at every verify."""
    sample = verify.eagle_sample if epilogue is None else from_graph(epilogue, verify.eagle_sample)
    return simulated_acceptance.wrap(sample) if simulated_acceptance.active() else sample


def with_tree_evidence(eagle_sample, evidence: TreeEvidence):
    """``eagle_sample`` (ours, maybe under simulated acceptance) followed by ``evidence.add`` of what it accepted
    (the cost policy over tree candidates)."""

    def sample(verify_input, batch, logits_output, grammar_mask=None, *args, **kwargs):
        predict, accept_lens, accept_index = eagle_sample(verify_input, batch, logits_output, grammar_mask, *args,
                                                          **kwargs)
        if not batch.forward_mode.is_idle():
            evidence.add(accept_index, accept_lens, verify_input)
        return predict, accept_lens, accept_index

    return sample


def tensor_parallel(draft_runner) -> TensorParallel | None:
    """The fused drafter's :class:`~sgl_eagle_triton.drafter.TensorParallel` on the draft runner's TP group (SGLang's
    ``GroupCoordinator``: its all-reduce and all-gather, custom all-reduce and CUDA-graph capture included, as the
    draft model's own layers use them), or None on one GPU."""
    group = glue.tp_group(draft_runner)
    if group is None or group.world_size == 1:
        return None
    model = draft_runner.model
    return TensorParallel(
        size=group.world_size, rank=group.rank_in_group,
        all_reduce=group.all_reduce,  # SGLang's: out of place for its custom all-reduce (no copy back)
        all_gather=lambda t: group.all_gather(t.unsqueeze(0).contiguous(), dim=0),
        embed_shard=vocab_shard(model.model.embed_tokens), lm_head_shard=vocab_shard(model.lm_head))


def verify_attention_in_use(backend, model_runner) -> str:
    """Which attention the target's verify runs (for the start-up log and ``/server_info``): ours if the plugin's hook
    swapped the target's backend to :class:`~sgl_eagle_triton.verify.TreeVerifyAttention` when SGLang built it, else
    SGLang's backend and why (the model runner's resolved page size and KV dtype; a Triton backend the hook should
    have swapped is logged as a warning). Under ``VERIFY_ATTENTION_ENV=1`` anything but ours refuses to start
    (RuntimeError): SGLang's verify attention must not run under our name."""
    if isinstance(backend, TreeVerifyAttention):
        return config.VERIFY_ATTENTION_IN_USE
    mode = config.verify_attention_mode()
    unserved = config.verify_attention_unserved(model_runner.page_size, model_runner.kv_cache_dtype)
    if mode == "0":
        why = "turned off"
    elif unserved is not None:
        why = unserved
    elif type(backend) is verify.TritonAttnBackend:
        why = f"the plugin's hook on SGLang {sglang.__version__}'s _build_resolved_backend did not reach it"
        logger.warning("%s: our verify attention did not replace SGLang's: %s", ALGORITHM_NAME, why)
    else:
        why = f"our kernel replaces the triton backend's, not {type(backend).__name__}'s"
    if mode == "1":
        raise RuntimeError(
            f"{ALGORITHM_NAME}: {config.VERIFY_ATTENTION_ENV}=1, but the target's attention backend is "
            f"{type(backend).__name__}, not ours ({why}). Use --attention-backend triton with a 16-bit KV cache of "
            "page size 1, or unset the variable.")
    return f"SGLang's {type(backend).__name__} ({why})"


def rank_zero_decides(group):
    """Under tensor parallelism, the cost policy's ``agree``: every rank adopts rank 0's step count, broadcast over
    SGLang's TP CPU group (``GroupCoordinator.broadcast_object``; every rank reaches each decision at the same verify,
    so the broadcasts pair up); None on one GPU."""
    if group is None or group.world_size == 1:
        return None
    return lambda steps: int(group.broadcast_object(steps, src=0))


_build_tree = witnessed(build_tree_kernel_efficient, BUILD_TREE)
# our functions in place of SGLang's (glue.REBOUND), whose parameters the start-up check matches against SGLang's
REPLACEMENTS = {"build_tree": build_tree_kernel_efficient, "eagle_sample": verify.eagle_sample,
                "verify_tree_greedy": verify.verify_tree_greedy_func}
_fill = witnessed(lambda fill, *rows: fill(*rows), DRAFT_KV_FILL)  # steps 0's fill, graphed or eager
_plain_step = PlainOff.step  # counted by its caller (_run_plain_step: count_ran)
_note_direct = witnessed(lambda: None, PLAIN_DIRECT)  # a plain step entered before SGLang's steps-0 flow


def verify_graph_sizes(state) -> list[int]:
    """The batch sizes an adaptive runtime state's verify CUDA graphs were captured at, ascending (none without
    the state or its graphs)."""
    return graph_sizes(getattr(state, "target_graph_runner", None))


def without_draft_metadata(backend) -> None:
    """Turn off, on SGLang's multi-step draft decode attention ``backend`` (the instance), the metadata it computes
    before every draft (``init_forward_metadata_out_graph`` at a CUDA-graph replay: on the triton backend the KV
    indices of every step and the KV split counts, two Triton launches; ``init_forward_metadata`` before an eager
    draft): the fused drafter reads each request's KV rows itself (``req_to_token``), so nothing reads them. Graph
    capture keeps them (SGLang sets its capture buffers up there)."""
    if backend is None:
        return
    capture = backend.init_forward_metadata_out_graph

    def out_graph(forward_batch, in_capture: bool = False):
        if in_capture:
            return capture(forward_batch, in_capture=True)
        return None

    backend.init_forward_metadata_out_graph = out_graph
    backend.init_forward_metadata = lambda forward_batch: None


class TritonEagleDraftWorker(LeanDraftWorker, EagleDraftWorker):
    """SGLang's EAGLE draft worker with our fused draft forward; the verify tree it hands over is built by our
    Triton kernel; the lean draft phase and draft extend: :class:`~sgl_eagle_triton.lean_phases.LeanDraftWorker`."""

    def init_attention_backend(self):
        """SGLang's (once per adaptive state), less the draft decode metadata nobody reads
        (:func:`without_draft_metadata`); draft check mode, which runs SGLang's draft beside ours, keeps it."""
        super().init_attention_backend()
        if not draft_check.check_file():
            without_draft_metadata(self.draft_attn_backend)

    def alloc_memory_pool(self, *args, **kwargs):
        super().alloc_memory_pool(*args, **kwargs)
        config.check_req_to_token_rows(self.req_to_token_pool.req_to_token.shape[1],
                                       self.target_worker.model_config.context_len, self.server_args)
        weights = draft_weights(self.draft_runner.model, self.hot_token_id)
        pool = self.draft_runner.token_to_kv_pool
        attn = self.draft_runner.model.model.layers[0].self_attn.attn  # the draft layer's RadixAttention
        self._drafter_binding = (
            weights,
            pool.get_key_buffer(attn.layer_id),
            pool.get_value_buffer(attn.layer_id),
            self.req_to_token_pool.req_to_token,
            # an FP8 pool's scales, as SGLang's attention backends read them (none without checkpoint scales)
            getattr(attn, "k_scale_float", None) or 1.0,
            getattr(attn, "v_scale_float", None) or 1.0,
        )
        self._drafters, self._draft_attention, self._stubs = {}, attn, None
        self._tensor_parallel = tensor_parallel(self.draft_runner)
        if self._tensor_parallel is not None:  # every rank: one object all-gather at start
            layout = shard_layout(self._tensor_parallel, self.draft_runner.model, weights)
            layouts = glue.tp_group(self.draft_runner).all_gather_object(layout)
            problems = shard_layout_problems(layouts)
            if problems:
                raise RuntimeError(f"{ALGORITHM_NAME}: the draft's tensor-parallel shards are not laid out as the "
                                   f"fused drafter assumes: {'; '.join(problems)}")

    _tensor_parallel = None

    # Steps 0 ("off", adaptive): the main worker sets fill_kv_only before each decode step; draft_stale says the
    # last decode step only filled the draft KV, so the carried top-k and hidden states are stubs (no draft may
    # start from them until a full draft extend ran).
    fill_kv_only = False
    draft_stale = False
    # set by the plain steps 0 (EagleTritonWorkerV2.verify): called once this step's fill has been launched, so the
    # scheduler's WAR barrier waits for the fill's reads too (the step's last phase that reads shared buffers)
    read_done_after_fill = None
    # set by the plain steps 0 when its target graph's epilogue wrote this step's draft KV (off_step.GraphEpilogue)
    kv_filled_in_graph = False
    _fill_graphs: RowGraphs | None = None  # steps 0's KV fill, one CUDA graph per batch size (capture_draft_kv)

    def _draft_extend_for_decode(self, batch, batch_result, **kwargs):
        if self.fill_kv_only and self.speculative_num_steps == 0 and not batch.forward_mode.is_idle():
            self.fill_after_plain_step(batch, batch_result)
            return None
        if self.lean_extend_on and not kwargs and self.lean_extends(batch, batch_result):
            _lean_extend(self, batch, batch_result)
            self.draft_stale = False
            return None
        result = super()._draft_extend_for_decode(batch, batch_result, **kwargs)
        if not batch.forward_mode.is_idle():  # an idle batch extends nobody: the running requests keep their state
            self.draft_stale = False
        return result

    def fill_after_plain_step(self, batch, batch_result) -> None:
        """After a plain steps-0 step: its draft KV fill (:meth:`fill_draft_kv`), the draft marked stale, then the
        WAR event the step left to record once the fill is launched (``read_done_after_fill``)."""
        self.fill_draft_kv(batch, batch_result)
        self.draft_stale = True
        publish, self.read_done_after_fill = self.read_done_after_fill, None
        if publish is not None:
            publish()

    def fill_draft_kv(self, batch, batch_result):
        """Steps 0 without the draft extend: the draft KV of the one token each request committed (what the extend
        would store: :meth:`_fill_rows`), replayed from its CUDA graph of the batch's size where one was captured
        (:meth:`capture_draft_kv`), and, where the result carries a draft input (a held step's carries none:
        off_route), stub top-k / hidden states of the right shapes for SGLang's overlap bookkeeping (as its
        ``_stub_skipped_draft_extend``)."""
        if self.kv_filled_in_graph:  # the token and its fill came from the target graph (off_step.GraphEpilogue)
            self.kv_filled_in_graph = False
            count_ran(GRAPH_EPILOGUE, DRAFT_KV_FILL)  # counted as both
        else:
            _fill(self._fill_graphs or self._fill_rows, batch_result.next_token_ids,
                  batch_result.logits_output.hidden_states, batch.seq_lens, batch.out_cache_loc)
        draft_input = batch_result.next_draft_input
        if draft_input is None:
            return
        topk_p, topk_index, hidden = self.stubs_of(batch)
        draft_input.topk_p, draft_input.topk_index = topk_p, topk_index
        if hidden is not None:
            draft_input.hidden_states = hidden

    def stubs_of(self, batch) -> tuple:
        """The stub top-k probabilities [bs, topk] float32, indices [bs, topk] int64 and hidden states [bs, hidden]
        (None where the draft carries none) of a fill-only step of ``batch``: zeros nobody writes to (SGLang indexes,
        concatenates or copies them into its future map), one set as many rows as the largest batch so far, viewed per
        batch, marked (the scheduler's relay then carries the bonus token alone: glue.relay.bonus_only_after_fill)."""
        bs = batch.seq_lens.shape[0]
        if self._stubs is None or self._stubs[0].shape[0] < bs:
            hidden_size, hidden_dtype = glue.draft_recurrent_hidden_state_spec(self.draft_runner)
            device = batch.seq_lens.device
            self._stubs = (
                torch.zeros(bs, self.topk, dtype=torch.float32, device=device),
                torch.zeros(bs, self.topk, dtype=torch.int64, device=device),
                None if hidden_size is None else torch.zeros(bs, hidden_size, dtype=hidden_dtype, device=device))
        topk_p, topk_index, hidden = self._stubs
        return mark_stub(topk_p[:bs]), mark_stub(topk_index[:bs]), None if hidden is None else mark_stub(hidden[:bs])

    def _fill_rows(self, next_token_ids, target_hidden, seq_lens, out_cache_loc):
        """Into the draft KV pool at ``out_cache_loc`` [bs] (the verify's slots): :meth:`FusedDrafter.draft_kv` of
        ``next_token_ids`` [bs] (the verified tokens' successors) at positions ``seq_lens`` [bs] with the hidden
        states carried from the target's features ``target_hidden`` [bs, features] (:meth:`_carried_hidden`), stored
        through SGLang's pool with the draft layer's scales. Integer inputs of any integer dtype."""
        k, v = self.fused_drafter.draft_kv(next_token_ids.to(torch.int64), self._carried_hidden(target_hidden),
                                           seq_lens.to(torch.int64))
        attn = self._draft_attention
        self.draft_runner.token_to_kv_pool.set_kv_buffer(attn, out_cache_loc, k, v, attn.k_scale, attn.v_scale)

    def capture_draft_kv(self, sizes, **graph_options) -> None:
        """:meth:`_fill_rows` captured as one CUDA graph per batch size of ``sizes`` (the steps-0 state's verify
        graphs' sizes; :class:`~sgl_eagle_triton.row_graphs.RowGraphs`: a batch in between runs padded, its extra
        rows writing SGLang's padding KV slot 0; a larger one eager). Where the host sets the cycle the eager fill's
        launches cost more than its GPU work. Captured inside SGLang's ``graph_capture`` (which lets its all-reduces,
        the drafter's under tensor parallelism, be captured) unless ``graph_options`` (RowGraphs' ``graph`` /
        ``capturing``: tests) are given."""
        w = self.fused_drafter.w
        device = w.embed.device
        example = (torch.zeros(1, dtype=torch.int64, device=device),
                   torch.zeros(1, self._target_hidden_width(), dtype=w.dtype, device=device),
                   torch.zeros(1, dtype=torch.int64, device=device), torch.zeros(1, dtype=torch.int64, device=device))
        pads = (0, None, 0, 0)  # token 0 at position 0 into the padding slot 0; stale hidden rows are harmless
        self._fill_graphs = captured_row_graphs(self._fill_rows, sizes, pads, example, **graph_options)

    def _target_hidden_width(self) -> int:
        """The width of the hidden states the target hands a steps-0 fill: EAGLE-3 with the target's auxiliary
        layers captured (SGLang's ``eagle_use_aux_hidden_state``), the draft's ``fc`` input; else (EAGLE-1, EAGLE-3
        without them) the hidden size, which :meth:`_carried_hidden` passes through."""
        runner = getattr(self.target_worker, "model_runner", None)
        aux = getattr(getattr(runner, "spec_aux_config", None), "eagle_use_aux_hidden_state", False)
        fc = getattr(self.draft_runner.model.model, "fc", None)
        return fc.in_features if aux and fc is not None else self.fused_drafter.w.hidden_size

    def compile_draft_kv(self) -> None:
        """Steps 0's KV fill (:meth:`fill_draft_kv`, outside CUDA graphs, at the batch's own size) run once per row
        count in :data:`DRAFT_KV_ROWS`, so that Triton compiles it before serving (under tensor parallelism every rank
        runs it, its embedding all-reduce included, at the same point of start-up)."""
        w = self.fused_drafter.w
        for rows in DRAFT_KV_ROWS:
            ids = torch.zeros(rows, dtype=torch.int64, device=w.embed.device)
            self.fused_drafter.draft_kv(ids, torch.zeros(rows, w.hidden_size, dtype=w.dtype, device=ids.device), ids)

    def _carried_hidden(self, target_hidden):
        """The hidden state a draft extend's layer starts from, by the draft model's own modules (as its forward):
        EAGLE-3's ``fc`` (after its optional input / per-feature norms) of the target's features; EAGLE-1 takes the
        target's hidden state itself."""
        model = self.draft_runner.model.model
        if target_hidden.shape[-1] == self._drafter_binding[0].hidden_size:
            return target_hidden
        if getattr(model, "input_norm", None) is not None:
            target_hidden = model.input_norm(target_hidden)
        if getattr(model, "fc_norm", None) is not None:
            chunks = target_hidden.chunk(model.num_aux_hidden_states, dim=-1)
            target_hidden = torch.cat([norm(c) for norm, c in zip(model.fc_norm, chunks, strict=True)], dim=-1)
        return model.fc(target_hidden)

    @property
    def fused_drafter(self) -> FusedDrafter:
        """The drafter of the tree shape in force (:meth:`drafter_shape`): one drafter per shape, made at first use;
        a drafter holds no buffers of its own."""
        return self.drafter_for(self.drafter_shape())

    def drafter_shape(self, steps: int | None = None) -> tuple[int, int, int]:
        """(topk, steps, draft tokens) of the shape in force as SGLang has set it on this worker now, or of the
        adaptive candidate of ``steps`` (its own topk and draft tokens: at most the server's topk, in whose layout
        the drafter returns its tree: :func:`sgl_eagle_triton.drafter.in_tree_layout`)."""
        adaptive = settings(self.server_args).speculative_adaptive
        if steps is not None:
            topk, n = config.adaptive_tree(self.server_args, steps) if adaptive else (self.topk,
                                                                                      self.speculative_num_draft_tokens)
            return topk, steps, n
        steps = self.speculative_num_steps
        topk = config.adaptive_tree(self.server_args, steps)[0] if adaptive else self.topk
        return topk, steps, self.speculative_num_draft_tokens

    def drafter_for(self, shape: tuple[int, int, int]) -> FusedDrafter:
        drafter = self._drafters.get(shape)
        if drafter is None:
            weights, k_cache, v_cache, req_to_token, k_scale, v_scale = self._drafter_binding
            # a narrower state's scores in the server's layout serve only the draft check, refused with it
            drafter = self._drafters[shape] = FusedDrafter(weights, *shape, k_cache, v_cache, req_to_token,
                                                           k_scale, v_scale, tp=self._tensor_parallel,
                                                           layout_topk=self.topk, keep_scores=shape[0] == self.topk)
        return drafter

    def draft_forward(self, forward_batch):
        """SGLang's contract: ``(parent_list, top_scores_index, draft_tokens, draft_probs=None)``, positions
        advanced by ``num_steps - 1`` in place."""
        spec_info = forward_batch.spec_info
        check_file = draft_check.check_file()
        start_positions = forward_batch.positions.clone() if check_file else None
        tree = _fused_draft(
            self.fused_drafter,
            spec_info.topk_p,
            spec_info.topk_index,
            spec_info.hidden_states,
            forward_batch.positions,
            forward_batch.seq_lens,
            forward_batch.req_pool_indices,
        )
        if check_file:
            forward_batch.positions.copy_(start_positions)
            self._check_against_sglang(check_file, forward_batch, tree)
        return (*tree[:3], None)

    def _check_against_sglang(self, check_file, forward_batch, tree):
        """Draft check mode (:mod:`sgl_eagle_triton.draft_check`): SGLang's own draft of the same batch."""
        captured = []
        organize = glue.organize_draft_results()

        def capturing(score_list, *args):
            captured.append(torch.cat(score_list, dim=1).flatten(1))
            return organize(score_list, *args)

        with glue.swapped_organize_draft_results(capturing):
            stock = super().draft_forward(forward_batch)
        draft_check.record(check_file, tree, stock, captured[0] if captured else None, self.topk)

    _first_draft_checked = False

    def draft(self, batch, *args, **kwargs):
        check = not self._first_draft_checked and not batch.forward_mode.is_idle()
        before = RAN[BUILD_TREE]
        lean = self.lean and not args and not kwargs and not batch.forward_mode.is_idle()
        with glue.swapped_build_tree(_build_tree):
            result = _lean_draft(self, batch) if lean else super().draft(batch, *args, **kwargs)
        if check:  # our draft forward ran eagerly or was captured in the draft graph being replayed
            self._first_draft_checked = True
            _witness(FUSED_DRAFTER, 0, "the first draft (neither captured nor called)")
            _witness(BUILD_TREE, before, "the first draft")
        return result


class EagleTritonWorkerV2(LeanStarts, NonspecRoute, EAGLEWorkerV2):
    """SGLang's EAGLE V2 worker with our draft worker and our tree verification (greedy and sampled); the start of
    the lean draft phase and draft extend: :class:`~sgl_eagle_triton.lean_phases.LeanStarts`; adaptive steps 0 held as
    SGLang's non-speculative decode: :class:`~sgl_eagle_triton.off_route.NonspecRoute`."""

    draft_worker = glue.draft_worker_property  # SGLang's property, without a Python call a read
    plain_off: PlainOff | None = None  # steps 0 as a plain decode step (start_plain_off, from init_cuda_graphs)
    plain_off_declined: str | None = None  # why steps 0 keeps SGLang's verify although the plain step was not refused
    verify_epilogue: VerifyEpilogue | None = None  # greedy chains verified in the target's graphs (mark_chain_graphs)
    verify_in_graph_declined: str | None = None  # why greedy verifies run outside the target's graphs
    _ab_steps = _ab_count = 0  # an A/B inside this server (config.AB_STEPS_ENV): steps per arm, decode steps so far
    _ab_feature = "verify_in_graph"  # what its arms alternate (config.AB_FEATURE_ENV)
    _plain_now = False  # this step's one-node input is the plain step's: its verify is too
    _pre_activated = False  # this decode step's state is already in force (forward_batch_generation put it)
    _direct_paused = False  # the A/B's arm without the direct plain step (config.AB_ARMS["plain_direct"])

    def __init__(self, *args, **kwargs):
        glue.check_glue(REPLACEMENTS, (TritonEagleDraftWorker, EagleTritonWorkerV2), plain_off=config.plain_off())
        self._verify_checks_left = {VERIFY_GREEDY, VERIFY_SAMPLING}
        self.steps_in_force: Counter = Counter()  # adaptive: decode steps run at each step count
        self._cycle_position = 0
        self.cost_policy, self._policy_checked = None, False
        self.verify_epilogue = VerifyEpilogue() if config.verify_in_graph_mode() != "off" else None
        self._ab_steps, self._ab_feature = config.ab_steps() or 0, config.ab_feature()
        self._eagle_sample = our_eagle_sample(self.verify_epilogue)
        with glue.swapped_draft_worker_class(TritonEagleDraftWorker):
            super().__init__(*args, **kwargs)
        logger.info(
            "%s (%s draft, steps=%d topk=%d draft_tokens=%d): %s",
            ALGORITHM_NAME,
            config.current_draft_kind(),
            self.speculative_num_steps,
            self.topk,
            self.speculative_num_draft_tokens,
            "; ".join(f"{stage}: {impl}" for stage, impl in KERNELS_IN_USE.items()),
        )
        self._cycle_knob = self.adaptive_controller is not None and bool(os.environ.get(config.ADAPTIVE_CYCLE_ENV))
        if self._cycle_knob:
            logger.warning("%s: %s is set (a test knob): the tree shape changes at every decode step",
                           ALGORITHM_NAME, config.ADAPTIVE_CYCLE_ENV)
        self.resumes = 0  # adaptive: decode steps run at 0 with the full draft extend before drafting again
        if self.adaptive_controller is not None and not self._cycle_knob:
            self._states_to_warm = tuple(self.adaptive_controller.candidate_steps)
        if self.adaptive_controller is not None and config.adaptive_policy(self.server_args) == "cost":
            self.cost_policy = self.adaptive_controller.params = self._make_cost_policy()

    def _make_cost_policy(self) -> CostAwarePolicy:
        """The cost-aware policy over SGLang's candidate step counts; over tree candidates (topk > 1) it learns
        acceptance per depth and sibling rank from device counts that every verify adds to (``eagle_sample``
        wrapped by :func:`with_tree_evidence`)."""
        candidates = self.adaptive_controller.params.candidate_steps
        trees = evidence = None
        if self.topk > 1:
            trees = {s: config.adaptive_tree(self.server_args, s) for s in candidates if s}
            evidence = TreeEvidence(max(candidates), self.topk, self.device)
            self._eagle_sample = with_tree_evidence(self._eagle_sample, evidence)
        runner = getattr(getattr(self, "draft_worker", None), "draft_runner", None)
        return CostAwarePolicy(candidates, self.speculative_num_steps, trees=trees, evidence=evidence,
                               agree=rank_zero_decides(None if runner is None else glue.tp_group(runner)))

    def build_adaptive_runtime_state(self, speculative_num_steps, speculative_num_draft_tokens, cuda_graph_bs=None):
        """SGLang's runtime state of one adaptive candidate; steps 0's target attention verifies its one node per
        request as a plain decode step (:class:`sgl_eagle_triton.verify.OneNodeVerifyAttention`, Triton backend).
        With topk > 1 (tree candidates) SGLang asks for steps + 1 draft tokens; the state gets the candidate's own
        (:func:`sgl_eagle_triton.config.adaptive_tree`). Its draft-extend CUDA graph is captured at the
        state's width: SGLang 0.5.17 takes the server args' (the initial state's) draft tokens, so a wider state's
        capture ran its query layout over narrower buffers and its extend then never replayed (eager)."""
        n = config.adaptive_tree(self.server_args, speculative_num_steps)[1]
        runner = self._target_worker.model_runner
        make_backend = runner._get_attention_backend
        with glue.swapped_draft_extend_width(n):
            if speculative_num_steps != 0:
                with self._chain_capture(speculative_num_steps, n):
                    state = super().build_adaptive_runtime_state(speculative_num_steps, n, cuda_graph_bs)
            else:
                epilogue = self._steps_0_graph_epilogue(runner)
                with glue.swapped(runner, "_get_attention_backend",
                                  lambda *args, **kwargs: one_node_verify_attention(make_backend(*args, **kwargs))), \
                        glue.capture_tail_hook(runner, None if epilogue is None else epilogue.hook):
                    state = super().build_adaptive_runtime_state(speculative_num_steps, n, cuda_graph_bs)
                self._graph_epilogue = epilogue
        width = getattr(getattr(state, "cuda_graph_runner_for_draft_extend", None), "captured_req_width", n)
        if width != n:
            raise RuntimeError(f"{ALGORITHM_NAME}: the adaptive state of {speculative_num_steps} steps captured its "
                               f"draft-extend graph {width} tokens wide, not its {n} draft tokens (SGLang "
                               f"{sglang.__version__} no longer reads the width through resolve_num_tokens_per_req)")
        return state

    _graph_epilogue: GraphEpilogue | None = None  # captured in steps 0's target graphs (start_plain_off uses it)

    def _steps_0_graph_epilogue(self, target_runner) -> GraphEpilogue | None:
        """The epilogue that steps 0's target CUDA graphs are captured with (:class:`off_step.GraphEpilogue`: the
        greedy token and its draft KV fill), where the plain step may run and those graphs are captured on one GPU;
        else None (the reason logged)."""
        why = None
        if config.plain_off_mode() == "off" or settings(self.server_args).disable_cuda_graph:
            return None
        if self.draft_worker._tensor_parallel is not None:
            why = "the draft runs under tensor parallelism"
        elif problems := glue.graph_epilogue_problems(target_runner):
            why = f"its SGLang {sglang.__version__} touchpoints moved: {'; '.join(problems)}"
        if why is not None:
            logger.info("%s: steps 0's target graphs are captured without the greedy token and draft KV fill: %s",
                        ALGORITHM_NAME, why)
            return None
        return GraphEpilogue(self.draft_worker._fill_rows, sanitize_nan=glue.sanitizes_nan_logits())

    def _usable_graph_epilogue(self, state) -> GraphEpilogue | None:
        """The steps-0 state's graph epilogue, if it went into every one of the state's target graphs, once per
        batch size (so that a batch padded to a captured size reads that graph's tokens), and those graphs replay
        whole (SGLang's full CUDA-graph backend); else None (logged)."""
        epilogue = self._graph_epilogue
        if epilogue is None:
            return None
        if not glue.replays_whole_graphs(getattr(state, "target_graph_runner", None)):
            logger.warning("%s: steps 0's target graphs do not replay whole (not SGLang's full CUDA-graph backend): "
                           "the plain step samples and fills outside the graph", ALGORITHM_NAME)
            return None
        sizes = verify_graph_sizes(state)
        if not sizes or sorted(epilogue.tokens) != sizes or epilogue.ambiguous:
            logger.warning("%s: steps 0's graph epilogue went into graphs of sizes %s (ambiguous %s), not once into "
                           "each of %s: the plain step samples and fills outside the graph", ALGORITHM_NAME,
                           sorted(epilogue.tokens), sorted(epilogue.ambiguous), sizes)
            return None
        return epilogue

    def init_attention_backends(self):
        """SGLang's; then which attention the target's verify runs (SGLang builds the target's backends after every
        worker's constructor, just before this call): logged, reported, refused under ``VERIFY_ATTENTION_ENV=1``
        unless ours."""
        super().init_attention_backends()
        runner = self.target_worker.model_runner
        self.verify_attention = verify_attention_in_use(runner.attn_backend, runner)
        logger.info("%s: verify attention: %s", ALGORITHM_NAME, self.verify_attention)
        self.mark_chain_graphs()

    # -- greedy chains verified inside the target's verify graphs (sgl_eagle_triton.verify_epilogue) ---------------

    def mark_chain_graphs(self) -> None:
        """Before the scheduler captures the target's verify graphs (the initial state's): where the greedy verify of
        chains may run inside them (:func:`config.verify_in_graph_unserved`, SGLang's NaN sanitising off, its capture
        tail hooks in place), :attr:`verify_epilogue`'s hook goes into the target's captures, the initial state
        marked as a chain; else it is declined (:meth:`_decline_verify_in_graph`)."""
        epilogue, runner = self.verify_epilogue, self.target_worker.model_runner
        if epilogue is None:
            return
        why, expected = None, False
        if (unserved := config.verify_in_graph_unserved(self.server_args)) is not None:
            why, expected = unserved[0], True
        elif glue.sanitizes_nan_logits():
            why, expected = "SGLANG_SANITIZE_NAN_LOGITS is set (SGLang's sampler rewrites the logits first)", True
        elif problems := glue.graph_epilogue_problems(runner):
            why = f"its SGLang {sglang.__version__} touchpoints moved: {'; '.join(problems)}"
        if why is not None:
            self._decline_verify_in_graph(why, expected)
            return
        glue.add_capture_tail_hook(runner, epilogue.hook)
        epilogue.chain = self._chain(self.speculative_num_steps, self.speculative_num_draft_tokens)

    @staticmethod
    def _chain(steps: int, n: int) -> tuple[int, int] | None:
        return (n, steps + 1) if steps >= 1 and n >= 2 else None

    @contextlib.contextmanager
    def _chain_capture(self, steps: int, n: int):
        """While an adaptive state of ``steps`` / ``n`` draft tokens is built: its target graphs get the verify
        epilogue (chains only: the server's topk is 1 wherever the epilogue was not declined)."""
        epilogue = self.verify_epilogue
        if epilogue is None or self.verify_in_graph_declined is not None:
            yield
            return
        epilogue.chain = self._chain(steps, n)
        try:
            yield
        finally:
            epilogue.chain = None

    def start_verify_in_graph(self) -> None:
        """After every state's graphs are captured: each chain state whose target verify graphs replay whole
        (SGLang's full CUDA-graph backend, not its ragged verify buckets) and each took the epilogue once has its
        greedy verifies served from them; none: declined."""
        epilogue = self.verify_epilogue
        if epilogue is None or self.verify_in_graph_declined is not None:
            return
        controller = self.adaptive_controller
        if controller is None:
            states = {self.speculative_num_steps: (self.speculative_num_draft_tokens,
                                                   glue.target_graph_runner(self.target_worker.model_runner))}
        else:
            states = {s: (state.speculative_num_draft_tokens, getattr(state, "target_graph_runner", None))
                      for s, state in controller._states.items() if s}
        left = []
        for steps, (n, runner) in sorted(states.items()):
            sizes = graph_sizes(runner)
            if (sizes and glue.replays_whole_graphs(runner) and not getattr(runner, "ragged_verify_mode", False)
                    and epilogue.sizes(n) == sizes):
                epilogue.enable(n)
            else:
                left.append(f"{steps} steps (graphs of {sizes}, epilogue in {epilogue.sizes(n)})")
        if not epilogue.enabled:
            self._decline_verify_in_graph(f"no chain state's verify graphs took it: {'; '.join(left)}")
            return
        logger.info("%s: greedy chains of %s draft tokens are verified inside the target's graphs%s", ALGORITHM_NAME,
                    sorted(epilogue.enabled), f" (not: {'; '.join(left)})" if left else "")

    def _decline_verify_in_graph(self, why: str, expected: bool = False) -> None:
        """Greedy verifies outside the target's graphs (SGLang's ``eagle_sample`` on our kernel), for ``why``: logged
        (a warning unless ``expected``) and reported; under ``config.VERIFY_IN_GRAPH_ENV=1`` a RuntimeError
        (:meth:`_decline`)."""
        self._decline(config.VERIFY_IN_GRAPH_ENV, config.verify_in_graph_mode(), "verify_in_graph_declined",
                      "greedy verifies run outside the target's graphs", why, expected)
        if self.verify_epilogue is not None:
            self.verify_epilogue.chain = None
            self.verify_epilogue.enabled.clear()

    def init_cuda_graphs(self):
        """SGLang's (one runtime state per adaptive candidate), then the kernels each decode step runs outside CUDA
        graphs compiled for every state (:meth:`compile_eager_kernels`), then the cost-aware policy's start-up costs:
        each state's draft, verify and draft-extend graphs replayed at every captured batch size."""
        if self.verify_epilogue is not None:  # the initial state's target graphs were captured before this call
            self.verify_epilogue.chain = None
        super().init_cuda_graphs()
        self.start_verify_in_graph()
        self.start_plain_off()
        self.start_nonspec()
        self.compile_eager_kernels()
        self.capture_draft_kv()
        self.start_lean_draft()
        self.start_lean_extend()
        if self.cost_policy is None:
            return
        states = self.adaptive_controller._states
        replay = {}
        for steps, state in sorted(states.items()):
            runners = (state.cuda_graph_runner, state.target_graph_runner, state.cuda_graph_runner_for_draft_extend)
            if steps > 0 and self.lean_draft_on:  # the lean draft phase replays our drafter's
                # graphs (start_lean_draft, before this), not SGLang's draft graphs
                lean = self.draft_worker._lean_graphs or {}
                runners = (lean.get(self.draft_worker.drafter_shape(steps)), *runners[1:])
            if steps > 0 and self.lean_extend_on:  # ours (start_lean_extend), not SGLang's draft-extend graphs
                runners = (*runners[:2], (self.draft_worker._extend_graphs or {}).get(
                    state.speculative_num_draft_tokens))
            if steps == 0:  # steps 0 fills the draft KV instead of the draft extend (TritonEagleDraftWorker), in
                # its target graphs where they end with the fill (off_step.GraphEpilogue)
                in_graph = self.plain_off is not None and self.plain_off.epilogue is not None
                runners = (state.target_graph_runner, *(() if in_graph else (self.draft_worker._fill_graphs,)))
            # SGLang hands the controller its decode batch sizes only when --cuda-graph-bs-decode is given; else the
            # sizes the state's verify graphs were captured at
            sizes = self.cost_policy.cuda_graph_bs or verify_graph_sizes(state)
            for bs, ms in replay_ms(runners, sizes, state.speculative_num_draft_tokens).items():
                replay[steps, bs] = ms
        missing = sorted(set(states) - {s for s, _ in replay})
        if missing:
            raise RuntimeError(f"{ALGORITHM_NAME}: the cost-aware adaptive policy found no CUDA graph to time for "
                               f"steps {missing} (SGLang {sglang.__version__}); use the sglang policy")
        self.cost_policy.set_costs(CycleCost(replay))
        logger.info("%s: adaptive candidates' graph replay ms (steps, batch): %s", ALGORITHM_NAME,
                    {f"{s},{bs}": round(ms, 3) for (s, bs), ms in sorted(replay.items())})

    def start_plain_off(self) -> None:
        """Steps 0 as a plain decode step (:mod:`sgl_eagle_triton.off_step`) once SGLang has built the states, unless
        ``config.PLAIN_OFF_ENV=0``: not without a steps-0 state, nor where its target attention is not ours
        (:class:`~sgl_eagle_triton.verify.OneNodeVerifyAttention`: the plain step's one-token forward runs its decode
        kernels and reads no mask), the draft runs under tensor parallelism, or the plain step's SGLang touchpoints
        moved. There, SGLang's steps-0 verify runs, the reason logged and kept in :attr:`plain_off_declined` (the
        kernel report); under ``config.PLAIN_OFF_ENV=1`` the server is refused instead (RuntimeError naming what to
        change)."""
        mode = config.plain_off_mode()
        controller = self.adaptive_controller
        state = None if controller is None else controller._states.get(0)
        if mode == "off" or (state is None and mode == "auto"):  # "auto" without steps 0: nothing to decline
            return
        backend = getattr(state, "target_attn_backend", None)
        why = None
        if state is None:
            why = "steps 0 is not an adaptive candidate"
        elif not isinstance(backend, verify.OneNodeVerifyAttention):
            why = (f"steps 0's target attention is {type(backend).__name__}, not ours (--attention-backend triton with "
                   "a 16-bit KV cache of page size 1)")
        elif self.draft_worker._tensor_parallel is not None:
            why = "the draft runs under tensor parallelism"
        elif problems := glue.plain_off_problems():  # checked last: the only reason that reads SGLang (the rest
            # of the glue held at __init__)
            why = f"its SGLang {sglang.__version__} touchpoints moved: {'; '.join(problems)}"
        if why is not None:
            self._decline(config.PLAIN_OFF_ENV, mode, "plain_off_declined", "adaptive steps 0 runs SGLang's one-node "
                          "verify, not a plain decode step", why)
            return
        self.plain_off = PlainOff(self.device, self._usable_graph_epilogue(state))
        logger.info("%s: adaptive steps 0 runs as a plain decode step (%s)%s", ALGORITHM_NAME,
                    f"{config.PLAIN_OFF_ENV}=1" if mode == "on" else "the default",
                    "; greedy batches take the token and the draft KV fill from its target graph"
                    if self.plain_off.epilogue is not None else "")

    def capture_draft_kv(self) -> None:
        """Steps 0's KV fill as CUDA graphs at the batch sizes of the steps-0 state's verify graphs
        (:meth:`TritonEagleDraftWorker.capture_draft_kv`), when steps 0 is a candidate and CUDA graphs are on, on one
        GPU: under tensor parallelism the fill stays eager (its graphs, whose embedding all-reduce would be captured,
        are not yet proven lossless end to end there; ``--tp`` servers are GPU-bound, where the graphs save little)."""
        controller = self.adaptive_controller
        sizes = verify_graph_sizes(None if controller is None else controller._states.get(0))
        if not sizes or settings(self.server_args).disable_cuda_graph:
            return
        if self.draft_worker._tensor_parallel is not None:
            logger.info("%s: steps 0's draft KV fill runs eagerly under tensor parallelism", ALGORITHM_NAME)
            return
        tic = time.perf_counter()
        self.draft_worker.capture_draft_kv(sizes)
        logger.info("%s: steps 0's draft KV fill captured at %d batch sizes (up to %d) in %.1f s", ALGORITHM_NAME,
                    len(sizes), sizes[-1], time.perf_counter() - tic)


    def _decline(self, env: str, mode: str, attribute: str, what: str, why: str, expected: bool = False) -> None:
        """SGLang's path instead of ours (``what`` happens), for ``why``: logged (a warning unless ``expected``, a
        server argument that rules ours out) and kept in ``attribute`` for the kernel report; under ``env=1``
        (``mode`` ``"on"``) a RuntimeError naming what to change instead."""
        if mode == "on":
            raise RuntimeError(f"{ALGORITHM_NAME}: {env}=1, but {why}. Change that, or unset {env}.")
        setattr(self, attribute, why)
        logger.log(logging.INFO if expected else logging.WARNING, "%s: %s: %s", ALGORITHM_NAME, what, why)

    def compile_eager_kernels(self) -> None:
        """Before serving, Triton compiles what each decode step runs outside CUDA graphs for every tree shape the
        server verifies (each adaptive candidate's): greedy and sampled verification
        (:func:`sgl_eagle_triton.verify.compile_verify_kernels`), the benchmark's simulated walk, the cost policy's
        tree counts and steps 0's KV fill (the rest, our build_tree and SGLang's per-state kernels, at the first
        decode steps: :attr:`_states_to_warm`). Otherwise the first verify of a shape waits for the compiler:
        in the H200 sweep of 2026-11-27 the round of 64 in which the cost policy first tried the 1-step chain ran at
        half the rate its server logged for it, most likely that stall (0.1-1 s a kernel while other processes
        compiled)."""
        tic = time.perf_counter()
        controller = self.adaptive_controller
        if controller is None:
            shapes = [(self.speculative_num_draft_tokens, self.speculative_num_steps)]
        else:
            shapes = [(config.adaptive_tree(self.server_args, s)[1], s) for s in controller.candidate_steps]
        vocab_size = self.target_worker.model_runner.model_config.vocab_size
        verify.compile_verify_kernels(shapes, vocab_size, self.device)
        simulated_acceptance.compile_walk(shapes, self.device)
        evidence = getattr(self.cost_policy, "evidence", None)
        if evidence is not None:
            evidence.compile(shapes)
        if controller is not None and 0 in controller.candidate_steps:
            self.draft_worker.compile_draft_kv()
        logger.info("%s: compiled the kernels run outside CUDA graphs for %d tree shape(s) in %.1f s",
                    ALGORITHM_NAME, len(set(shapes)), time.perf_counter() - tic)

    def forward_batch_generation(self, batch, *args, **kwargs):
        """SGLang's (under :data:`config.CYCLE_TIMING_ENV` timed as stock's: the plugin wraps the parent's). A prefill
        (or a gap before one: a new request) falls between two decode steps and belongs to neither's cycle: the cost
        policy does not time the decode step after it."""
        extend = batch.forward_mode.is_extend() or batch.is_extend_in_batch
        self._pre_activated = False
        self._plain_inflight = None
        if self.nonspec_on and batch.spec_algorithm is nonspec.NO_SPEC and not extend:
            # off_route's held step: its state (and the A/B's arm) put in force at the batch's preparation
            if self._ab_steps and not self._decided_at_prep and not batch.forward_mode.is_idle():
                self._next_ab_arm()
            self._decided_at_prep = False
            if not cycle_timing.ACTIVE:  # (no instrument in this process: no wrapper around the step)
                return self._nonspec_step(batch)
            self._label_cycle("steps0-held")
            return cycle_timing.worker_step(self, EAGLEWorkerV2.forward_batch_generation,
                                            lambda: self._nonspec_step(batch))
        self._held_last = None  # (off_route) the next held step gathers its input from the relay
        if self.cost_policy is not None and extend:
            self.cost_policy.forget_last_step()
        if self._ab_steps and not extend and not batch.forward_mode.is_idle() and not self._decided_at_prep:
            self._next_ab_arm()  # (under off_route at the batch's preparation, with its state)
        if self.plain_off is not None and not extend and not args and not batch.forward_mode.is_idle():
            # timed (diagnostics) over the same span as SGLang's method: the state put in force included
            if not cycle_timing.ACTIVE:
                return self._decode_step(batch, **kwargs)
            return cycle_timing.worker_step(self, EAGLEWorkerV2.forward_batch_generation,
                                            lambda: self._decode_step(batch, **kwargs))
        return super().forward_batch_generation(batch, *args, **kwargs)

    def _decode_step(self, batch, **kwargs):
        """A decode step where the plain steps 0 runs: the state put in force here, then a plain steps-0 step entered
        directly (:meth:`_direct_plain_step`; not in the A/B's other arm) or SGLang's flow, whose own call to put the
        state in force is then a no-op (:attr:`_pre_activated`). Under the non-speculative route the batch's
        preparation put it in force (off_route.NonspecRoute.prepare_decode)."""
        if self._decided_at_prep:
            self._decided_at_prep = False
        else:
            self.activate_step_by_batch(batch.seq_lens.shape[0])
        if (not self._direct_paused and self.speculative_num_steps == 0 and self.draft_worker.fill_kv_only
                and batch.spec_info is not None and off_step.serves(batch)):
            return self._direct_plain_step(batch, **kwargs)
        self._pre_activated = True
        return super().forward_batch_generation(batch, **kwargs)

    def _direct_plain_step(self, batch, on_publish=None, **_):
        """SGLang's steps-0 flow for a plain step (``EAGLEWorkerV2.forward_batch_generation``'s decode branch once the
        state is in force: the one-node input, the verify, the publish of the new lengths, the draft extend, here the
        fill), entered directly: without its shell, context managers (one GPU, no draft MoE) and dispatch through
        ``_build_trivial_verify_input`` / ``verify``. No ``grammar_barrier``: a grammar batch is not a plain one."""
        _note_direct()
        batch.spec_info = self.plain_off.verify_input(batch, self.topk)
        result = self._run_plain_step(batch)
        if on_publish is not None:  # before the fill, as SGLang's flow publishes before its draft extend
            on_publish(result.new_seq_lens)
        self.draft_worker._draft_extend_for_decode(batch, result)
        return result

    def _run_plain_step(self, batch, held=None):
        """The plain step of ``batch`` (its ``spec_info`` the one-node input; ``held``: off_step.HeldStep, a
        non-speculative batch's), and what the draft KV fill after it reads: whether the graph epilogue already
        filled, and the WAR event to record once the fill has been launched (the scheduler's barrier then takes its
        fast path, as after a decode step)."""
        result = _plain_step(self.plain_off, batch, self.target_worker, self.req_to_token_pool.req_to_token, held)
        if held is None:
            count_ran(PLAIN_OFF_STEP)
        else:  # (off_route's held step)
            count_ran(PLAIN_OFF_STEP, NONSPEC_STEP)
        if self.nonspec_on:  # (off_route: a batch whose plain step is in flight can turn non-speculative)
            self._plain_inflight = batch.reqs
        draft_worker = self.draft_worker
        draft_worker.kv_filled_in_graph = self.plain_off.filled
        draft_worker.read_done_after_fill = self._publish_read_done
        return result

    def _label_cycle(self, state: str) -> None:
        """The state of the decode step about to launch, for the cycle timing's per-state line (its
        ``CycleTiming.states_summary``; the worker's timing exists from its first timed decode step)."""
        timing = self.__dict__.get("_cycle_timing")
        if timing is not None:
            timing.state = state

    def _next_ab_arm(self) -> None:
        """An A/B inside this server (config.AB_STEPS_ENV): the decode step about to run has its feature
        (config.AB_FEATURE_ENV) on or off, alternating every ``_ab_steps`` steps: the greedy verify inside the target's
        graphs or after them, the lean draft phase or SGLang's, the lean draft extend or SGLang's; the cycle timing,
        which times this step, is told its arm (config.AB_ARMS). Nothing where the feature did not start (declined:
        logged then)."""
        off = (self._ab_count // self._ab_steps) % 2 == 1
        self._ab_count += 1
        if self._ab_feature == "lean_draft":
            if not self.lean_draft_on:
                return
            self.draft_worker.lean = not off
        elif self._ab_feature == "plain_direct":
            if self.plain_off is None:
                return
            self._direct_paused = off
        elif self._ab_feature == "off_nonspec":
            if not self.nonspec_on:
                return
            self._nonspec_paused = off
        elif self._ab_feature == "lean_extend":
            if not self.lean_extend_on:
                return
            self.draft_worker.lean_extend_on = not off
        else:
            if self.verify_epilogue is None or not self.verify_epilogue.enabled:
                return
            self.verify_epilogue.paused = off
        timing = self.__dict__.get("_cycle_timing")  # cycle_timing.timed_forward's, made at the first decode step
        if timing is not None:
            timing.arm = config.AB_ARMS[self._ab_feature][off]

    def _build_trivial_verify_input(self, batch, *args, **kwargs):
        """SGLang's one-node verify input of a steps-0 step; the plain step's (:meth:`PlainOff.verify_input`, and then
        :meth:`verify` runs the plain step) when it is on, the step only fills the draft KV (not a resume step) and
        the batch is one it serves (:func:`sgl_eagle_triton.off_step.serves`)."""
        self._plain_now = (self.plain_off is not None and self.draft_worker.fill_kv_only
                           and off_step.serves(batch))
        if self._plain_now:
            return self.plain_off.verify_input(batch, self.topk)
        return super()._build_trivial_verify_input(batch, *args, **kwargs)

    def _publish_read_done(self) -> None:
        glue.publish_read_done(self)

    def verify(self, batch, *args, **kwargs):
        if self._plain_now:  # SGLang's steps-0 flow: the input just built was the plain step's
            self._plain_now = False
            return self._run_plain_step(batch)  # SGLang's flow then runs the draft KV fill
        expected = None
        if self._verify_checks_left and not batch.forward_mode.is_idle():
            expected = VERIFY_GREEDY if batch.sampling_info.is_all_greedy else VERIFY_SAMPLING
        before = RAN[expected] if expected in self._verify_checks_left else None
        with glue.swapped_verify(verify.verify_tree_greedy_func, self._eagle_sample):
            result = super().verify(batch, *args, **kwargs)
        if before is not None:
            self._verify_checks_left.discard(expected)
            _witness(expected, before, f"the first {'greedy' if expected == VERIFY_GREEDY else 'sampled'} verify")
        return result

    # Adaptive: the candidates still to put in force once each, in turn, at the server's first decode steps (SGLang's
    # warm-up request), so that every state's kernels outside CUDA graphs, SGLang's and ours (build_tree, the verify
    # kernels, steps 0's KV fill), are compiled before traffic; the policies are fed none of those steps' verifies
    _states_to_warm: tuple = ()
    _unattributed_verifies = 0

    def activate_step_by_batch(self, batch_size: int) -> None:
        """SGLang's adaptive switch before every decode step (a no-op without ``--speculative-adaptive``). The
        server's first decode steps put each candidate in force once instead (:attr:`_states_to_warm`). With
        ``config.ADAPTIVE_CYCLE_ENV`` set at start (tests) it puts the next candidate step count in force at every
        step, so that the shape changes mid-request (batch sizes without that state's CUDA graphs run eagerly)."""
        if self._pre_activated:  # forward_batch_generation put this step's state in force before SGLang's flow
            self._pre_activated = False
            return
        controller = self.adaptive_controller
        warming = bool(self._states_to_warm) and batch_size > 0
        if self._cycle_knob:
            candidates = controller.candidate_steps
            position = (self._cycle_position + 1) % len(candidates)
            controller._activate(candidates[position])
        elif warming:
            controller._activate(self._states_to_warm[0])
        else:
            super().activate_step_by_batch(batch_size)
        if controller is None:
            return
        draft_worker = self.draft_worker
        resume = self.speculative_num_steps > 0 and draft_worker.draft_stale
        if resume:  # the last step only filled the draft KV: one more step at 0, with the full draft extend
            controller._activate(0)
            self.resumes += 1
            if self.cost_policy is not None:  # this cycle is not one of the policy's state: do not time it
                self.cost_policy.forget_last_step()
        elif self._cycle_knob:
            self._cycle_position = position
        elif warming:
            self._states_to_warm = self._states_to_warm[1:]
            if not self._states_to_warm:
                logger.info("%s adaptive: every candidate ran once (its kernels compiled); the policy decides from "
                            "the next decode step", ALGORITHM_NAME)
        if warming:
            self._unattributed_verifies += 1
        draft_worker.fill_kv_only = not resume
        self.steps_in_force[self.speculative_num_steps] += 1
        if cycle_timing.ACTIVE:  # (diagnostics) the cycle timing's per-state line: this step's state
            self._label_cycle(f"steps{self.speculative_num_steps}{'-resume' if resume else ''}")
        if self.cost_policy is not None and self.cost_policy.costs is None and not self._policy_checked:
            self._policy_checked = True
            message = (f"{ALGORITHM_NAME}: the cost-aware adaptive policy has no costs at the first decode step "
                       f"(SGLang {sglang.__version__} did not call init_cuda_graphs): it keeps its initial steps")
            logger.error(message)
            _errors.append(message)

    def on_verify_complete_cpu(self, num_correct_drafts_per_req: list[int], batch_size: int = 0) -> None:
        """SGLang's feed of each decode step's accepted drafts to the adaptive policy, one call per decode step in
        order; those of the steps that put each candidate in force at start are not the policy's and are dropped."""
        if self._unattributed_verifies:
            self._unattributed_verifies -= 1
            return
        super().on_verify_complete_cpu(num_correct_drafts_per_req, batch_size)

    def kernel_report(self) -> dict:
        """What ``/server_info`` shows under ``internal_states[0]["eagle_triton"]``: the kernel paths, how often
        each of our entry points ran in this scheduler, the first-step check's errors (empty when all ran) and,
        under ``--speculative-adaptive``, the decode steps run at each step count."""
        kernels = {**KERNELS_IN_USE, "verify attention": getattr(self, "verify_attention", "not yet built")}
        if self.plain_off is not None:
            kernels["steps 0"] = ("plain decode step: the target's one-token forward, SGLang's sampler, the draft KV "
                                  "fill")
        elif self.plain_off_declined is not None:
            kernels["steps 0"] = (f"SGLang's one-node verify, the draft KV fill (plain step declined: "
                                  f"{self.plain_off_declined})")
        if self.nonspec_on:
            kernels["steps 0 held"] = "SGLang's non-speculative decode around the plain step (the batch turned)"
        elif self.nonspec_declined is not None:
            kernels["steps 0 held"] = (f"the plain step on the speculative path (route declined: "
                                       f"{self.nonspec_declined})")
        if self.verify_epilogue is not None and self.verify_epilogue.enabled:
            kernels["greedy verify"] = (f"inside the target's verify graphs for chains of "
                                        f"{sorted(self.verify_epilogue.enabled)} draft tokens")
        elif self.verify_in_graph_declined is not None:
            kernels["greedy verify"] = f"after the target's graphs (in-graph declined: {self.verify_in_graph_declined})"
        if self.lean_draft_on:
            kernels["draft phase"] = "lean: the fused drafter on the relayed draft input, then SGLang's verify input"
        elif self.lean_draft_declined is not None:
            kernels["draft phase"] = (f"SGLang's prepare_for_draft and draft graphs (lean declined: "
                                      f"{self.lean_draft_declined})")
        if self.lean_extend_on:
            kernels["draft extend"] = ("lean: the draft KV of every verified row, the layer and LM head of each "
                                       "request's last accepted row alone")
        elif self.lean_extend_declined is not None:
            kernels["draft extend"] = f"SGLang's (lean declined: {self.lean_extend_declined})"
        report = {"version": __version__, "sglang_version": sglang.__version__, "kernels": kernels,
                  "ran": dict(RAN), "errors": list(_errors)}
        if self.adaptive_controller is not None:
            report["adaptive_trees"] = {  # each candidate's (steps, topk, draft tokens)
                str(s): [s, *config.adaptive_tree(self.server_args, s)]
                for s in self.adaptive_controller.candidate_steps}
            report["adaptive_steps_in_force"] = {str(k): v for k, v in sorted(self.steps_in_force.items())}
            report["adaptive_resumes"] = self.resumes
        if self.cost_policy is not None:
            report["adaptive_policy"] = self.cost_policy.report()
        return report
