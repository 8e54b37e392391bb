"""The lean draft phase and the lean draft extend: a drafting step's draft phase and draft extend as CUDA graphs of
ours around the fused drafter, instead of SGLang's phase machinery around its draft model (the mixins
:class:`LeanDraftWorker` of :class:`sgl_eagle_triton.worker.TritonEagleDraftWorker` and :class:`LeanStarts` of
:class:`sgl_eagle_triton.worker.EagleTritonWorkerV2`).

- The lean draft phase (:meth:`LeanDraftWorker.lean_draft`; ``SGLANG_EAGLE_TRITON_LEAN_DRAFT``, the default wherever it
  runs): the fused drafter on the relayed draft input from a CUDA graph of ours per batch size, then SGLang's
  ``build_eagle_verify_input``, without SGLang's ``prepare_for_draft`` and draft graph runner.
- The lean draft extend (:meth:`LeanDraftWorker.lean_extend`; ``SGLANG_EAGLE_TRITON_LEAN_EXTEND``, the default for
  chains on one GPU): after a chain's verify, the draft KV of every verified row and the draft layer, LM head and
  argmax of each request's last accepted row alone (:meth:`sgl_eagle_triton.drafter.FusedDrafter.draft_extend`),
  from a CUDA graph of ours per batch size, without SGLang's ``prepare_for_draft_extend``, its draft-extend graph
  runner over every row and the row select and argmax after it.

:class:`LeanStarts` starts each once SGLang's graphs are captured, or declines it (the reason logged and reported;
under ``=1`` the server is refused). Every SGLang name goes through :mod:`sgl_eagle_triton.glue`.
"""

from __future__ import annotations

import functools
import logging
import time

import sglang
import torch

from sgl_eagle_triton import ALGORITHM_NAME, config
from sgl_eagle_triton.drafter import FusedDrafter
from sgl_eagle_triton.glue import call_sites as glue
from sgl_eagle_triton.glue.args import settings
from sgl_eagle_triton.row_graphs import RowGraphs
from sgl_eagle_triton.verify import witnessed

logger = logging.getLogger(__name__)

FUSED_DRAFTER = "triton fused drafter"
LEAN_DRAFT = "lean draft phase (no prepare_for_draft)"
LEAN_EXTEND = "lean draft extend (the kept row alone)"
fused_draft = witnessed(FusedDrafter.draft, FUSED_DRAFTER)
_lean_draft = witnessed(lambda draft_worker, batch: draft_worker.lean_draft(batch), LEAN_DRAFT)
# the lean extend's padding rows (RowGraphs): token 0 of request 0 at length 1, one accepted, into the padding slot 0
EXTEND_PADS = (0, None, 1, 0, 1, 0)
_lean_extend = witnessed(lambda draft_worker, batch, result: draft_worker.lean_extend(batch, result), LEAN_EXTEND)


def draft_watchers(draft_worker) -> str | None:
    """What in SGLang's draft phase and extend does more than our lean ones replace, None if nothing: the draft seeds
    DSA's top-k from the draft extend, or a KV canary checks the draft's forwards."""
    if getattr(draft_worker, "seed_dsa_topk_from_draft_extend", False):
        return "the draft seeds DSA's top-k from the draft extend"
    if getattr(draft_worker.draft_runner, "canary_manager", None) is not None:
        return "a KV canary checks the draft's forwards"
    return None


def _free_gpu_bytes() -> int:
    """Free memory of the current CUDA device in bytes (0 without one): what a capture took, for its log line."""
    return torch.cuda.mem_get_info()[0] if torch.cuda.is_available() else 0


def graph_sizes(runner) -> list[int]:
    """The batch sizes a CUDA graph runner of SGLang's (``capture_bs``: a draft, decode or verify runner) captured,
    ascending (none without the runner)."""
    return sorted(set(getattr(runner, "capture_bs", None) or ()))


def captured_row_graphs(fn, sizes, pads, example, pool=None, **graph_options) -> RowGraphs:
    """:class:`~sgl_eagle_triton.row_graphs.RowGraphs` of ``fn`` captured at ``sizes`` on ``example``'s rows: inside
    SGLang's ``graph_capture`` (which lets collectives be captured), into ``pool`` (default: a new graph pool), unless
    ``graph_options`` (RowGraphs' ``graph`` / ``capturing``: tests) are given."""
    if graph_options:
        graphs = RowGraphs(fn, sizes, pads, **graph_options)
        graphs.capture(example)
        return graphs
    pool = torch.cuda.graph_pool_handle() if pool is None else pool
    with glue.graph_capture() as context:
        graphs = RowGraphs(fn, sizes, pads, capturing=lambda g: torch.cuda.graph(g, pool=pool, stream=context.stream))
        graphs.capture(example)
    return graphs


class LeanDraftWorker:
    """The draft worker's lean draft phase and lean draft extend (mixed into
    :class:`sgl_eagle_triton.worker.TritonEagleDraftWorker`, whose drafters, draft pool and SGLang state they use)."""

    lean = False  # the draft phase is :meth:`lean_draft` (LeanStarts.start_lean_draft)
    lean_extend_on = False  # the draft extend is :meth:`lean_extend` (LeanStarts.start_lean_extend)
    _extend_graphs: dict | None = None  # draft tokens n -> RowGraphs of extend_rows (capture_lean_extend)
    publish_read_done = None  # records the scheduler's WAR event after a lean extend (set with lean_extend_on)
    _lean_graphs: dict | None = None  # drafter shape -> RowGraphs of its tree (capture_lean_draft)

    # -- the lean draft phase (config.LEAN_DRAFT_ENV) ------------------------------------------------------------------

    def lean_draft(self, batch):
        """SGLang's draft phase less its preparation: the fused drafter on the relayed draft input of ``batch``
        (its ``spec_info``: ``topk_p`` [bs, K] fp32, ``topk_index`` [bs, K] int64, ``hidden_states`` [bs, H]; each
        request's K rows at position ``seq_lens``), replayed from :meth:`capture_lean_draft`'s graph of the batch's
        size where there is one, then SGLang's ``build_eagle_verify_input``. Skips ``prepare_for_draft`` (the draft
        KV slots, which our drafter does not write: it keeps each step's K / V in buffers of its own; positions;
        ``ForwardBatch.init_new``) and the draft graph runner's input copies and padding."""
        draft_input, seq_lens = batch.spec_info, batch.seq_lens
        rows = (draft_input.topk_p, draft_input.topk_index, draft_input.hidden_states,
                seq_lens.unsqueeze(1).expand(seq_lens.shape[0], self.topk), seq_lens, batch.req_pool_indices)
        shape = self.drafter_shape()
        graphs = None if self._lean_graphs is None else self._lean_graphs.get(shape)
        tree = graphs(*rows) if graphs is not None else self.lean_tree(self.drafter_for(shape), *rows)
        return glue.build_verify_input(self, batch, *tree)

    def lean_tree(self, drafter, topk_p, topk_index, hidden, positions, seq_lens, req_pool_indices):
        """``(parent_list, top_scores_index, draft_tokens)`` of ``drafter`` for rows given batch first: positions
        [bs, K] int64, copied before the drafter advances its copy in place (a broadcast of ``seq_lens`` is a view of
        the batch's own sequence lengths at K = 1, and its kernels read positions as contiguous)."""
        tree = fused_draft(drafter, topk_p, topk_index, hidden, positions.reshape(-1).clone(), seq_lens,
                            req_pool_indices)
        return tuple(tree[:3])

    def capture_lean_draft(self, shapes: dict, **graph_options) -> None:
        """:meth:`lean_tree` of each drafter shape of ``shapes`` ({shape: batch sizes}) as one CUDA graph per size
        (:class:`~sgl_eagle_triton.row_graphs.RowGraphs`: a batch in between runs padded, its extra rows a request
        of length 1 in SGLang's padding row 0 of the request pool, zero inputs; a larger one eager). Captured inside
        SGLang's ``graph_capture`` unless ``graph_options`` (RowGraphs' ``graph`` / ``capturing``: tests) are
        given."""
        w = self.fused_drafter.w
        device, k = w.embed.device, self.topk
        example = (torch.zeros(1, k, dtype=torch.float32, device=device),
                   torch.zeros(1, k, dtype=torch.int64, device=device),
                   torch.zeros(1, w.hidden_size, dtype=w.dtype, device=device),
                   torch.ones(1, k, dtype=torch.int64, device=device), torch.ones(1, dtype=torch.int64, device=device),
                   torch.zeros(1, dtype=torch.int64, device=device))
        pads = (0.0, 0, 0.0, 1, 1, 0)  # padding rows: request 0 (never a real request's) of length 1
        pool = None if graph_options else torch.cuda.graph_pool_handle()  # all shapes': one replays at a time
        self._lean_graphs = {shape: captured_row_graphs(functools.partial(self.lean_tree, self.drafter_for(shape)),
                                                        sizes, pads, example, pool, **graph_options)
                             for shape, sizes in shapes.items()}

    # -- the lean draft extend (config.LEAN_EXTEND_ENV) ----------------------------------------------------------------

    def lean_extends(self, batch, batch_result) -> bool:
        """Whether the draft extend of this decode step can be :meth:`lean_extend`'s: a batch that is not idle whose
        verify handed over ``n`` next tokens and target hidden states per request (``n`` = the state's draft tokens:
        a chain's whole verify)."""
        if batch.forward_mode.is_idle():
            return False
        rows = batch.seq_lens.shape[0] * self.speculative_num_draft_tokens
        hidden = batch_result.logits_output.hidden_states
        return hidden is not None and batch_result.next_token_ids.shape[0] == rows == hidden.shape[0]

    def lean_extend(self, batch, batch_result) -> None:
        """SGLang's ``_draft_extend_for_decode`` after a chain's verify, less what nobody reads: the draft KV of every
        verified row and the next draft's input (top-k, carried hidden state) from each request's last accepted row
        alone (:meth:`extend_rows`), replayed from :meth:`capture_lean_extend`'s graph of the batch's size where
        there is one; without ``prepare_for_draft_extend`` (``ForwardBatch.init_new``), SGLang's draft-extend graph
        runner (input copies, padding, attention metadata) and the row select and argmax after it. The outputs go
        where SGLang's go (``next_draft_input``; graph buffers the scheduler's relay copies in this step), and the
        scheduler's WAR event is recorded after the replay, whose attention read ``req_to_token``."""
        bs, n = batch.seq_lens.shape[0], self.speculative_num_draft_tokens
        target_hidden = batch_result.logits_output.hidden_states
        rows = (batch_result.next_token_ids.reshape(bs, n), target_hidden.reshape(bs, n, target_hidden.shape[-1]),
                batch.seq_lens, batch.out_cache_loc.reshape(bs, n), batch_result.accept_lens, batch.req_pool_indices)
        graphs = None if self._extend_graphs is None else self._extend_graphs.get(n)
        topk_p, topk_index, hidden = graphs(*rows) if graphs is not None else self.extend_rows(*rows)
        if self.publish_read_done is not None:
            self.publish_read_done()
        draft_input = batch_result.next_draft_input
        draft_input.topk_p, draft_input.topk_index, draft_input.hidden_states = topk_p, topk_index, hidden

    def extend_rows(self, next_token_ids, target_hidden, seq_lens, out_cache_loc, accept_lens, req_pool_indices):
        """:meth:`FusedDrafter.draft_extend` for a batch given request first: next_token_ids [bs, n], target_hidden
        [bs, n, features] (the verify's), out_cache_loc [bs, n] (its KV slots: the draft KV goes to the same slots
        through SGLang's pool, with the draft layer's scales), seq_lens / accept_lens / req_pool_indices [bs], integer
        inputs of any integer dtype. Returns ``(topk_p [bs, topk] fp32, topk_index [bs, topk] int64, hidden [bs,
        H])``."""
        bs, n = next_token_ids.shape
        carried = self._carried_hidden(target_hidden.reshape(bs * n, target_hidden.shape[-1])).view(bs, n, -1)
        attn, pool, slots = self._draft_attention, self.draft_runner.token_to_kv_pool, out_cache_loc.reshape(-1)

        def store_kv(k, v):
            pool.set_kv_buffer(attn, slots, k, v, attn.k_scale, attn.v_scale)

        return self.fused_drafter.draft_extend(next_token_ids.to(torch.int64), carried, seq_lens.to(torch.int64),
                                               accept_lens, req_pool_indices.to(torch.int64), store_kv, self.topk)

    def capture_lean_extend(self, sizes: dict, **graph_options) -> None:
        """:meth:`extend_rows` for each draft-token count of ``sizes`` ({n: batch sizes}) as one CUDA graph per size
        (:class:`~sgl_eagle_triton.row_graphs.RowGraphs`: padding rows a request of length 1 in SGLang's padding
        row 0 of the request pool, writing the padding KV slot 0). Captured inside SGLang's ``graph_capture`` unless
        ``graph_options`` (RowGraphs' ``graph`` / ``capturing``: tests) are given."""
        pool = None if graph_options else torch.cuda.graph_pool_handle()  # one replays at a time
        self._extend_graphs = {n: captured_row_graphs(self.extend_rows, batch_sizes, EXTEND_PADS,
                                                      self._extend_example(n), pool, **graph_options)
                               for n, batch_sizes in sizes.items()}

    def compile_lean_extend(self, draft_tokens) -> None:
        """:meth:`extend_rows` run once eagerly for one padding request (writing SGLang's padding KV slot 0) per count
        of ``draft_tokens``, so that Triton compiles it before serving where no graph will (CUDA graphs off)."""
        for n in draft_tokens:
            self.extend_rows(*self._extend_example(n))

    def _extend_example(self, n: int) -> tuple:
        """:meth:`extend_rows`' inputs for one padding request of ``n`` rows (:data:`EXTEND_PADS`)."""
        w = self.fused_drafter.w
        device = w.embed.device
        ones = torch.ones(1, dtype=torch.int64, device=device)
        return (torch.zeros(1, n, dtype=torch.int64, device=device),
                torch.zeros(1, n, self._target_hidden_width(), dtype=w.dtype, device=device), ones,
                torch.zeros(1, n, dtype=torch.int64, device=device), ones, torch.zeros_like(ones))


class LeanStarts:
    """The main worker's start of the lean draft phase and the lean draft extend (mixed into
    :class:`sgl_eagle_triton.worker.EagleTritonWorkerV2`: called from its ``init_cuda_graphs``)."""

    lean_draft_on = False  # the draft phase is the lean one (start_lean_draft)
    lean_draft_declined: str | None = None  # why the draft phase keeps SGLang's preparation (start_lean_draft)
    lean_extend_on = False  # the draft extend is the lean one (start_lean_extend)
    lean_extend_declined: str | None = None  # why the draft extend stays SGLang's (start_lean_extend)

    def start_lean_draft(self) -> None:
        """Every drafting state's draft phase as :meth:`LeanDraftWorker.lean_draft`, its drafter captured at
        the batch sizes of the state's draft graphs, or of its verify graphs where SGLang captured no draft graph
        (1 step; none with CUDA graphs off: eager), unless ``config.LEAN_DRAFT_ENV=0``. Not where the server args
        rule it out (:func:`config.lean_draft_unserved`), SGLang's draft phase does more than our drafter replaces
        (its preparation plans the verify's KV window: SGLang 0.5.22+; it seeds DSA's top-k; a KV canary checks its
        forwards), or the capture runs out of GPU memory. There SGLang's draft phase runs (its graphs captured), the
        reason logged and kept in :attr:`lean_draft_declined` (the kernel report); under ``config.LEAN_DRAFT_ENV=1``
        the server is refused instead (RuntimeError naming what to change)."""
        mode = config.lean_draft_mode()
        if mode == "off":
            return
        dw = self.draft_worker
        why, expected = None, False  # expected: a server argument rules it out (logged as information)
        if (unserved := config.lean_draft_unserved(self.server_args)) is not None:
            why, expected = unserved[0], True
        elif problems := glue.lean_draft_problems():
            why = f"its SGLang {sglang.__version__} touchpoints moved: {'; '.join(problems)}"
        else:
            why = draft_watchers(dw)
        if why is not None:
            self._decline_lean_draft(mode, why, expected)
            return
        controller = self.adaptive_controller
        if controller is None:  # the one state: SGLang's draft graphs, its target's decode (verify) graphs
            runners = {None: (dw.cuda_graph_runner, glue.target_graph_runner(self.target_worker.model_runner))}
        else:
            runners = {s: (state.cuda_graph_runner, getattr(state, "target_graph_runner", None))
                       for s, state in controller._states.items() if s}
        # a state without draft graphs (SGLang captures none at 1 step) at its verify graphs' sizes
        shapes = {dw.drafter_shape(s): graph_sizes(draft) or graph_sizes(target)
                  for s, (draft, target) in runners.items()}
        captured = {shape: sizes for shape, sizes in shapes.items() if sizes}
        tic = time.perf_counter()
        if (captured and not settings(self.server_args).disable_cuda_graph
                and not self._captured(lambda: dw.capture_lean_draft(captured), "_lean_graphs", "its drafter graphs",
                                       self._decline_lean_draft, mode)):
            return
        dw.lean = self.lean_draft_on = True
        logger.info("%s: the draft phase runs without SGLang's prepare_for_draft (%s): drafter graphs of %d "
                    "shape(s) captured in %.1f s", ALGORITHM_NAME,
                    f"{config.LEAN_DRAFT_ENV}=1" if mode == "on" else "the default", len(dw._lean_graphs or {}),
                    time.perf_counter() - tic)

    def start_lean_extend(self) -> None:
        """Every decode step's draft extend after a chain's verify as :meth:`LeanDraftWorker.lean_extend`, its
        rows captured at the batch sizes of each state's verify graphs (none with CUDA graphs off: eager), unless
        ``config.LEAN_EXTEND_ENV=0``. Not where the server args rule it out (:func:`config.lean_extend_unserved`),
        SGLang's draft extend does more than it replaces (it seeds DSA's top-k; a KV canary checks the draft's
        forwards) or the capture runs out of GPU memory: there SGLang's draft extend runs, the reason logged and kept
        in :attr:`lean_extend_declined` (the kernel report); under ``config.LEAN_EXTEND_ENV=1`` the server is refused
        instead (RuntimeError naming what to change)."""
        mode = config.lean_extend_mode()
        if mode == "off":
            return
        dw = self.draft_worker
        why = (unserved := config.lean_extend_unserved(self.server_args)) and unserved[0]
        if why:
            self._decline_lean_extend(mode, why, expected=True)
            return
        if (why := draft_watchers(dw)) is not None:
            self._decline_lean_extend(mode, why)
            return
        controller = self.adaptive_controller
        states = ({self.speculative_num_draft_tokens: glue.target_graph_runner(self.target_worker.model_runner)}
                  if controller is None else
                  {state.speculative_num_draft_tokens: getattr(state, "target_graph_runner", None)
                   for state in controller._states.values()})
        sizes = {n: found for n, runner in states.items() if (found := graph_sizes(runner))}
        tic, free = time.perf_counter(), _free_gpu_bytes()
        if not sizes or settings(self.server_args).disable_cuda_graph:
            sizes = {}
        elif not self._captured(lambda: dw.capture_lean_extend(sizes), "_extend_graphs", "its graphs",
                                self._decline_lean_extend, mode):
            return
        dw.compile_lean_extend(sorted(set(states) - set(sizes)))  # the counts run eagerly: compiled first
        dw.publish_read_done = self._publish_read_done
        dw.lean_extend_on = self.lean_extend_on = True
        logger.info("%s: the draft extend keeps each request's last accepted row alone (%s): graphs of %s draft "
                    "tokens captured in %.1f s, %.0f MiB of GPU memory", ALGORITHM_NAME,
                    f"{config.LEAN_EXTEND_ENV}=1" if mode == "on" else "the default", sorted(sizes),
                    time.perf_counter() - tic, (free - _free_gpu_bytes()) / 2**20)

    def _captured(self, capture, graphs: str, what: str, decline, mode: str) -> bool:
        """``capture()`` (a lean phase's graphs); out of GPU memory, the draft worker's ``graphs`` attribute cleared
        and ``decline(mode, why)`` (by default SGLang's phase runs, its graphs captured; under ``=1`` refused):
        False."""
        try:
            capture()
        except torch.cuda.OutOfMemoryError as error:
            setattr(self.draft_worker, graphs, None)
            decline(mode, f"capturing {what} ran out of GPU memory ({error})")
            return False
        return True

    def _decline_lean_draft(self, mode: str, why: str, expected: bool = False) -> None:
        """SGLang's draft phase instead of the lean one, for ``why`` (:meth:`_decline`)."""
        self._decline(config.LEAN_DRAFT_ENV, mode, "lean_draft_declined", "the draft phase runs SGLang's "
                      "prepare_for_draft and draft graphs, not the lean draft phase", why, expected)

    def _decline_lean_extend(self, mode: str, why: str, expected: bool = False) -> None:
        """SGLang's draft extend instead of the lean one, for ``why`` (:meth:`_decline`)."""
        self._decline(config.LEAN_EXTEND_ENV, mode, "lean_extend_declined", "the draft extend runs SGLang's, not the "
                      "lean one", why, expected)
