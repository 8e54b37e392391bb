"""Where our workers enter SGLang's EAGLE worker, and the start-up check that every entry is still there.

Our kernels run inside SGLang's own methods in three ways, each listed here and nowhere else:

- a module global that SGLang's method looks up at call time is rebound while our worker's method runs
  (:func:`swapped_build_tree`, :func:`swapped_verify`, :func:`swapped_draft_worker_class`, ...; the rebinding lasts
  only for that call, so nothing else in the process changes);
- a method that SGLang calls on ``self`` is overridden by our subclass (:data:`CALL_SITES` with ``module`` None);
- an instance attribute is replaced (the target runner's attention factory of steps 0, a draft backend's metadata).

:func:`check_glue` proves at start, before anything is built, that (1) every method we wrap still reaches the name
we rebind or the method we override (read from its bytecode, following SGLang functions it calls up to two deep),
(2) the SGLang functions we call or replace still take the parameters we pass (:data:`SIGNATURES`: one of the
known variants), and (3) every replacement and override of ours accepts every parameter SGLang's original takes
(so a keyword SGLang starts passing, like 0.5.20's ``uno_target_max_top_k``, fails at start, not at the first
request). Imports SGLang's speculative modules (and Triton): imported by the worker only.
"""

from __future__ import annotations

import dataclasses
import dis
import inspect
import operator
import types
from contextlib import contextmanager

import sglang
import torch
from sglang.srt.managers.tp_worker import TpModelWorker
from sglang.srt.managers.utils import GenerationBatchResult
from sglang.srt.model_executor.forward_batch_info import CaptureHiddenMode, ForwardBatch, ForwardMode
from sglang.srt.model_executor.model_runner import ModelRunner
from sglang.srt.model_executor.runner.decode_cuda_graph_runner import DecodeCudaGraphRunner
from sglang.srt.speculative import (
    eagle_draft_cuda_graph_runner,
    eagle_utils,
    eagle_worker_common,
    eagle_worker_v2,
    spec_utils,
)
from sglang.srt.speculative import eagle_draft_extend_cuda_graph_runner as draft_extend_graph_runner
from sglang.srt.speculative.adaptive_runtime_state import AdaptiveController
from sglang.srt.speculative.eagle_info import EagleDraftInput, EagleVerifyInput
from sglang.srt.speculative.eagle_worker_v2 import EagleDraftWorker, EAGLEWorkerV2

from sgl_eagle_triton.glue import versions
from sgl_eagle_triton.glue.hooks import global_tp_group, hook_problems, signature_problem
from sgl_eagle_triton.glue.hooks import parameters as _parameters

# SGLang names our code uses without wrapping a caller (checked to exist).
SGLANG_NAMES = (
    (eagle_worker_v2, "organize_draft_results"),  # draft check mode
    (eagle_utils, "eagle_sample"),  # our eagle_sample's greedy path
    (eagle_utils, "_verify_coins"),  # our eagle_sample's coins
    (eagle_utils, "get_draft_recurrent_hidden_state_spec"),  # steps 0: the stubs of a skipped draft extend
    (AdaptiveController, "_activate"),  # the adaptive cycle test knob and the resume step
)

CALL_SITES = (
    # (owner, method, module, name): SGLang's ``owner.method`` must reach ``module.name`` (a global it looks up, which
    # we rebind while it runs; it must exist) or, with ``module`` None, the method ``name`` (which we override).
    (EAGLEWorkerV2, "__init__", eagle_worker_v2, "EagleDraftWorker"),
    (EAGLEWorkerV2, "alloc_memory_pool", None, "alloc_memory_pool"),
    (EAGLEWorkerV2, "forward_batch_generation", None, "draft"),
    (EAGLEWorkerV2, "forward_batch_generation", None, "verify"),
    (EAGLEWorkerV2, "forward_batch_generation", None, "activate_step_by_batch"),
    (EAGLEWorkerV2, "forward_batch_generation", None, "_draft_extend_for_decode"),
    (EAGLEWorkerV2, "build_adaptive_runtime_state", None, "_get_attention_backend"),
    # the cost-aware adaptive policy stands in for SGLang's params object (sgl_eagle_triton.adaptive)
    (AdaptiveController, "activate_step_by_batch", None, "get_steps_for_batch"),
    (AdaptiveController, "on_verify_complete", None, "on_verify_complete"),
    (AdaptiveController, "init_states", None, "cuda_graph_bs_for_step"),
    (EagleDraftWorker, "draft", None, "draft_forward"),
    (eagle_draft_cuda_graph_runner.EAGLEDraftCudaGraphRunner, "capture_one_shape", None, "draft_forward"),
    (EagleDraftWorker, "draft", eagle_worker_common, "build_tree_kernel_efficient"),
    (EAGLEWorkerV2, "verify", eagle_worker_common, "eagle_sample"),
    (eagle_utils, "eagle_sample", eagle_utils, "verify_tree_greedy_func"),
)

# Adaptive steps 0 as a plain decode step (config.PLAIN_OFF_ENV=1, sgl_eagle_triton.off_step): checked at start only
# when it is asked for. SGLang's steps-0 flow must still call the method we override to build the one-node input...
PLAIN_OFF_CALL_SITES = (
    (EAGLEWorkerV2, "forward_batch_generation", None, "_build_trivial_verify_input"),
)  # (the state put in force and the draft extend, which the direct plain step stands for too: CALL_SITES)
# ... and what the plain step calls must take these parameters (ForwardBatch's constructor and SGLang's results are
# called by keyword: their fields are checked to exist)
PLAIN_OFF_SIGNATURES = (
    (EAGLEWorkerV2, "_build_trivial_verify_input", (("batch",),)),
    (ForwardBatch, "init_new", (("batch", "model_runner", "capture_hidden_mode", "return_hidden_states_before_norm"),)),
    (TpModelWorker, "forward_batch_generation", (("batch", "forward_batch", "pp_proxy_tensors", "is_verify"),)),
    (ModelRunner, "sample", (("logits_output", "forward_batch"),)),
)
PLAIN_OFF_FIELDS = (
    (EagleVerifyInput, ("draft_token", "custom_mask", "positions", "retrieve_index", "retrieve_next_token",
                        "retrieve_next_sibling", "retrieve_cum_len", "spec_steps", "topk", "draft_token_num",
                        "capture_hidden_mode", "seq_lens_sum", "seq_lens_cpu")),
    (EagleDraftInput, ("bonus_tokens",)),
    (GenerationBatchResult, ("logits_output", "next_token_ids", "can_run_cuda_graph", "speculative_num_draft_tokens",
                             "next_draft_input", "accept_lens", "new_seq_lens", "routed_experts_output",
                             "indexer_topk_output", "extra_keep_alive_refs")),
)

# The lean draft phase (config.LEAN_DRAFT_ENV=1, TritonEagleDraftWorker.draft): SGLang's draft must still end in
# build_eagle_verify_input, which takes these; its prepare_for_draft must not plan the verify's KV window (0.5.22+
# returns a kv_loc_plan for chains, which the lean phase would not make: declined there)
LEAN_DRAFT_CALL_SITES = (
    (EagleDraftWorker, "draft", eagle_worker_v2, "build_eagle_verify_input"),
)
LEAN_DRAFT_SIGNATURES = (
    (eagle_worker_v2, "build_eagle_verify_input", (("batch", "draft_input", "parent_list", "top_scores_index",
                                                         "draft_tokens", "draft_probs", "target_worker", "topk",
                                                         "num_steps", "num_draft_tokens", "tree_mask_mode",
                                                         "device"),)),
)

# ... and, for its graph epilogue (greedy token and draft KV fill at the end of steps 0's target graphs), SGLang's
# capture must still run the model runner's tail hooks (``capture_tail_hooks``, as its DSpark verify epilogue)
GRAPH_EPILOGUE_CALL_SITES = (
    (DecodeCudaGraphRunner, "capture_one_shape", None, "capture_tail_hooks"),
)

# What we rebind, by the key the worker names it with: (SGLang module, global)
REBOUND = {
    "draft_worker_class": (eagle_worker_v2, "EagleDraftWorker"),
    "build_tree": (eagle_worker_common, "build_tree_kernel_efficient"),
    "eagle_sample": (eagle_worker_common, "eagle_sample"),
    "verify_tree_greedy": (eagle_utils, "verify_tree_greedy_func"),
    "organize_draft_results": (eagle_worker_v2, "organize_draft_results"),
}

_GREEDY_VERIFY = ("predicts", "accept_index", "accept_token_num", "candidates", "retrieve_index",
                  "retrieve_next_token", "retrieve_next_sibling", "target_predict")
SIGNATURES = (
    # (owner, name, variants): SGLang's ``owner.name`` takes one of these parameter lists first (``self`` dropped),
    # any further parameters with defaults. What we call, replace or override with these arguments.
    (eagle_utils, "eagle_sample", (("verify_input", "batch", "logits_output", "grammar_mask"),)),
    (eagle_utils, "verify_tree_greedy_func", (_GREEDY_VERIFY,)),
    (eagle_utils, "_verify_coins", (("sampling_info", "seq_lens", "draft_token_num", "candidates", "device"),)),
    (eagle_utils, "get_draft_recurrent_hidden_state_spec", (("model_runner",),)),
    (eagle_worker_common, "build_tree_kernel_efficient",
     (("bonus_tokens", "parent_list", "top_scores_index", "draft_tokens", "seq_lens", "seq_lens_sum", "topk",
       "spec_steps", "num_verify_tokens"),)),
    (eagle_worker_v2, "organize_draft_results", (("score_list", "token_list", "parents_list", "num_draft_token"),)),
    (EagleDraftWorker, "_draft_extend_for_decode", (("batch", "batch_result"),)),
    (EagleDraftWorker, "draft_forward", (("forward_batch",),)),
    (EAGLEWorkerV2, "build_adaptive_runtime_state",
     (("speculative_num_steps", "speculative_num_draft_tokens", "cuda_graph_bs"),)),
    (EAGLEWorkerV2, "on_verify_complete_cpu", (("num_correct_drafts_per_req", "batch_size"),)),
    (EAGLEWorkerV2, "activate_step_by_batch", (("batch_size",),)),
    (AdaptiveController, "_activate", (("speculative_num_steps",), ("steps",))),
    # 0.5.17 passes the server args; 0.5.18+ reads the per-state settings itself (swapped_draft_extend_width)
    (draft_extend_graph_runner, "resolve_num_tokens_per_req", (("phase", "server_args"), ("phase",))),
)


def accepts_every_parameter(ours, theirs) -> list[str]:
    """The parameters of SGLang's ``theirs`` that our replacement or override ``ours`` cannot be called with. SGLang
    passes most by keyword, so a named parameter must exist by name in ours (or ours takes ``**kwargs``); a
    positional-only one needs a position (or ``*args``)."""
    mine = _parameters(ours)
    names = None if any(p.kind is p.VAR_KEYWORD for p in mine) else {p.name for p in mine}
    positional = sum(p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD) for p in mine)
    varargs = any(p.kind is p.VAR_POSITIONAL for p in mine)
    missing = []
    for i, p in enumerate(_parameters(theirs)):
        if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
            continue
        if p.kind is p.POSITIONAL_ONLY:
            if not (varargs or i < positional):
                missing.append(p.name)
        elif names is not None and p.name not in names:
            missing.append(p.name)
    return missing


def _names(code: types.CodeType):
    """``("global" | "attr", name)`` of every global and attribute lookup in ``code`` and its nested functions."""
    for ins in dis.get_instructions(code):
        if ins.opname == "LOAD_GLOBAL":
            yield "global", ins.argval
        elif ins.opname in ("LOAD_ATTR", "LOAD_METHOD"):
            yield "attr", ins.argval
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            yield from _names(const)


def reaches(caller, module, name: str, hops: int = 2) -> bool:
    """Whether ``caller``, or an SGLang function it calls by global name (up to ``hops`` calls deep), looks up
    ``name``: as a global of ``module`` (so that rebinding ``module.name`` takes effect), or as an attribute
    when ``module`` is None."""
    todo, seen = [(inspect.unwrap(caller), hops)], set()
    while todo:
        fn, left = todo.pop()
        if fn in seen or not inspect.isfunction(fn):
            continue
        seen.add(fn)
        names = set(_names(fn.__code__))
        if module is None and ("attr", name) in names:
            return True
        if module is not None and fn.__globals__ is vars(module) and ("global", name) in names:
            return True
        if left:
            for kind, n in names:
                callee = fn.__globals__.get(n) if kind == "global" else None
                if inspect.isfunction(callee) and callee.__module__.startswith("sglang"):
                    todo.append((inspect.unwrap(callee), left - 1))
    return False


def _where(owner) -> str:
    return f"{owner.__module__}.{owner.__qualname__}" if isinstance(owner, type) else owner.__name__


def overridden_methods(cls) -> list[str]:
    """The methods ``cls`` defines itself that its SGLang base classes define too (what we override)."""
    return [name for name, attr in vars(cls).items() if inspect.isfunction(attr) and not name.startswith("__")
            and getattr(super(cls, cls), name, None) is not None]


def _reach_and_signature_problems(call_sites, signatures) -> list[str]:
    """What no longer holds of ``call_sites`` (:data:`CALL_SITES`' form) and ``signatures`` (:data:`SIGNATURES`')."""
    problems = []
    for owner, attr, module, name in call_sites:
        if module is not None and not hasattr(module, name):
            problems.append(f"{module.__name__}.{name} (missing)")
        elif not reaches(getattr(owner, attr), module, name):
            target = f"{module.__name__}.{name}" if module is not None else f"the method {name}"
            problems.append(f"{_where(owner)}.{attr} no longer reaches {target}")
    for owner, name, variants in signatures:
        fn = getattr(owner, name, None)
        problem = "missing" if fn is None else signature_problem(fn, variants)
        if problem:
            problems.append(f"{_where(owner)}.{name} {problem}")
    return problems


def plain_off_problems() -> list[str]:
    """What no longer holds of the plain steps-0 path's touchpoints alone (empty when all does): its call site,
    signatures and result fields (:data:`PLAIN_OFF_CALL_SITES`, :data:`PLAIN_OFF_SIGNATURES`,
    :data:`PLAIN_OFF_FIELDS`)."""
    problems = []
    for cls, fields in PLAIN_OFF_FIELDS:
        missing = sorted(set(fields) - {f.name for f in dataclasses.fields(cls)})
        if missing:
            problems.append(f"{_where(cls)} has no field {', '.join(missing)}")
    return problems + _reach_and_signature_problems(PLAIN_OFF_CALL_SITES, PLAIN_OFF_SIGNATURES)


def glue_problems(replacements: dict | None = None, classes=(), plain_off: bool = False) -> list[str]:
    """Everything that no longer holds (empty when all does): names, call sites, signatures, hook targets
    (:func:`~sgl_eagle_triton.glue.hooks.hook_problems`), ``replacements`` (keys of :data:`REBOUND` -> our function
    put in its place) and the overridden methods of ``classes`` (ours, subclassing SGLang's) that could not take
    every parameter SGLang's original takes; with ``plain_off`` the plain steps-0 path's as well
    (:func:`plain_off_problems`)."""
    problems = [f"{_where(owner)}.{name} (missing)" for owner, name in SGLANG_NAMES if not hasattr(owner, name)]
    if plain_off:
        problems += plain_off_problems()
    problems += _reach_and_signature_problems(CALL_SITES, SIGNATURES)
    problems += hook_problems()
    for key, ours in (replacements or {}).items():
        module, name = REBOUND[key]
        theirs = getattr(module, name, None)
        missing = [] if theirs is None else accepts_every_parameter(ours, theirs)  # a missing name: reported above
        if missing:
            problems.append(f"our replacement of {module.__name__}.{name} does not take {', '.join(missing)}")
    for cls in classes:
        for name in overridden_methods(cls):
            missing = accepts_every_parameter(getattr(cls, name), getattr(super(cls, cls), name))
            if missing:
                problems.append(f"our override {cls.__qualname__}.{name} does not take {', '.join(missing)}")
    return problems


def check_glue(replacements: dict | None = None, classes=(), plain_off: bool = False) -> None:
    """Refuse to start (RuntimeError naming what moved and this SGLang's version) unless the installed SGLang is a
    served release and every touchpoint holds (:func:`glue_problems`): otherwise stock kernels would run under a
    "triton" banner, or a request would crash mid-decode."""
    versions.check_supported()
    problems = glue_problems(replacements, classes, plain_off)
    if problems:
        raise RuntimeError(
            f"EAGLE_TRITON (sgl-eagle-triton) cannot run on SGLang {sglang.__version__}: " + "; ".join(problems)
            + ". Its Triton kernels enter SGLang's EAGLE worker through these touchpoints (docs/design.md), so stock "
            f"kernels would run instead or a request would fail. Served releases: {versions.SUPPORTED_RANGE[0]} ... "
            f"{versions.SUPPORTED_RANGE[1]} (GPU-tested: {', '.join(versions.GPU_TESTED)}).")


@contextmanager
def swapped(owner, name: str, replacement):
    """Rebind ``owner.name`` (a module's global, or an object's attribute) for the duration of the block; fails
    loudly (AttributeError) if SGLang moved it."""
    original = getattr(owner, name)
    setattr(owner, name, replacement)
    try:
        yield
    finally:
        setattr(owner, name, original)


# The rebindings, one function each (the worker names no SGLang module attribute itself)

def swapped_draft_worker_class(cls):
    """While ``EAGLEWorkerV2.__init__`` runs: it builds ``cls`` as its draft worker."""
    return swapped(*REBOUND["draft_worker_class"], cls)


def swapped_build_tree(build_tree):
    """While ``EagleDraftWorker.draft`` runs: the verify tree is built by ``build_tree``."""
    return swapped(*REBOUND["build_tree"], build_tree)


@contextmanager
def swapped_verify(greedy, sample):
    """While ``EAGLEWorkerV2.verify`` runs: greedy tree verification by ``greedy`` (SGLang's ``eagle_sample`` calls
    ``eagle_utils.verify_tree_greedy_func``) and token selection by ``sample`` (in place of ``eagle_sample``). Both
    rebindings in one frame: this runs at every decode step."""
    (greedy_module, greedy_name), (sample_module, sample_name) = REBOUND["verify_tree_greedy"], REBOUND["eagle_sample"]
    greedy_original, sample_original = getattr(greedy_module, greedy_name), getattr(sample_module, sample_name)
    setattr(greedy_module, greedy_name, greedy)
    setattr(sample_module, sample_name, sample)
    try:
        yield
    finally:
        setattr(greedy_module, greedy_name, greedy_original)
        setattr(sample_module, sample_name, sample_original)


def swapped_organize_draft_results(organize):
    """While SGLang's own ``draft_forward`` runs (draft check mode): its draft results pass through ``organize``."""
    return swapped(*REBOUND["organize_draft_results"], organize)


def organize_draft_results():
    return eagle_worker_v2.organize_draft_results


@contextmanager
def swapped_draft_extend_width(width: int):
    """While an adaptive runtime state is built: its draft-extend CUDA graph is captured ``width`` tokens per request
    wide. SGLang 0.5.17 reads the width from the server args (the initial state's) through
    ``resolve_num_tokens_per_req(phase, server_args)``: rebound; from 0.5.18 it reads the state's own published
    settings (``get_spec()``, overridden per state) and takes no server args: nothing to rebind."""
    resolve = draft_extend_graph_runner.resolve_num_tokens_per_req
    if "server_args" not in inspect.signature(resolve).parameters:
        yield
        return

    def state_width(phase, *args, **kwargs):
        return width if phase == "draft_extend" else resolve(phase, *args, **kwargs)

    with swapped(draft_extend_graph_runner, "resolve_num_tokens_per_req", state_width):
        yield


def sglang_eagle_sample():
    """SGLang's own ``eagle_utils.eagle_sample`` (our greedy path calls it with our greedy kernel rebound)."""
    return eagle_utils.eagle_sample


def verify_coins():
    return eagle_utils._verify_coins


def draft_recurrent_hidden_state_spec(draft_runner):
    """``(hidden size | None, dtype | None)`` of the hidden state a draft carries between steps (SGLang's)."""
    return eagle_utils.get_draft_recurrent_hidden_state_spec(draft_runner)


def tp_group(draft_runner):
    """The tensor-parallel group (SGLang's ``GroupCoordinator``) the draft runs on: the model runner's ``tp_group`` up
    to 0.5.21; from 0.5.22 runners keep none and the group is SGLang's global one (``parallel_state.get_tp_group``);
    None outside SGLang's distributed setup (CPU tests)."""
    group = getattr(draft_runner, "tp_group", None)
    return group if group is not None else global_tp_group()


def graph_capture():
    """SGLang's ``parallel_state.graph_capture()`` context (its all-reduces capturable; ``.stream``)."""
    from sglang.srt.distributed.parallel_state import graph_capture as capture

    return capture()


# SGLang's ``BaseSpecWorker.draft_worker`` (0.5.17-0.5.23: a property returning ``self._draft_worker``), which our
# worker reads several times a decode step: the same read as a property whose getter is C code (no Python call a read)
draft_worker_property = property(operator.attrgetter("_draft_worker"),
                                 doc="The draft worker (SGLang's ``BaseSpecWorker.draft_worker``: ``_draft_worker``).")


# Adaptive steps 0 as a plain decode step (sgl_eagle_triton.off_step)

def one_node_verify_input(draft_token, positions, retrieve_index, retrieve_next, topk: int):
    """SGLang's ``EagleVerifyInput`` of one node per request: ``draft_token`` [bs] (the relayed bonus tokens),
    ``positions`` [bs] int64, ``retrieve_index`` [bs, 1] int64 (``arange``), ``retrieve_next`` [bs, 1] int64 (-1, as
    next token and next sibling), no mask (the steps-0 target attention attends as a decode step and reads none)."""
    return EagleVerifyInput(
        draft_token=draft_token, custom_mask=None, positions=positions, retrieve_index=retrieve_index,
        retrieve_next_token=retrieve_next, retrieve_next_sibling=retrieve_next, retrieve_cum_len=None, spec_steps=0,
        topk=topk, draft_token_num=1, capture_hidden_mode=CaptureHiddenMode.FULL, seq_lens_sum=None,
        seq_lens_cpu=None)


def one_token_forward(target_worker, batch):
    """The target's forward of ``batch`` (one token per request, mode TARGET_VERIFY: the steps-0 state's CUDA graphs)
    as SGLang's decode step runs it: ``ForwardBatch.init_new`` with the full hidden states captured (the draft KV fill
    reads them), then ``TpModelWorker.forward_batch_generation`` without sampling. Returns ``(forward_batch,
    GenerationBatchResult)``."""
    batch.forward_mode = ForwardMode.TARGET_VERIFY
    forward_batch = ForwardBatch.init_new(batch, target_worker.model_runner, capture_hidden_mode=CaptureHiddenMode.FULL,
                                          return_hidden_states_before_norm=False)
    return forward_batch, target_worker.forward_batch_generation(None, forward_batch=forward_batch, is_verify=True)


def as_decode(batch) -> None:
    """``batch`` (SGLang's ``ScheduleBatch``) in decode mode again after a plain step ran it as a one-node verify."""
    batch.forward_mode = ForwardMode.DECODE


def sample_as_decode(model_runner, logits_output, forward_batch):
    """SGLang's no-spec sampler (``ModelRunner.sample``) over the one-token forward's logits [bs, vocab], with the
    batch seen as a decode step for the call, so that the sampler gets the positions no-spec gives it (the fed
    token's: its seeded draws are no-spec's). Returns the token ids [bs]."""
    with swapped(forward_batch, "forward_mode", ForwardMode.DECODE):
        return model_runner.sample(logits_output, forward_batch)


def plain_step_result(forward_output, next_token_ids, accept_lens, new_seq_lens, keep_alive):
    """What SGLang's spec-v2 result processing reads from a verify, for one committed token per request:
    ``next_token_ids`` [bs] at stride 1, ``accept_lens`` [bs] int32 ones, ``new_seq_lens`` [bs], the token as the
    next step's bonus (``EagleDraftInput.bonus_tokens`` int32), ``keep_alive`` held two scheduler iterations."""
    return GenerationBatchResult(
        logits_output=forward_output.logits_output, next_token_ids=next_token_ids,
        can_run_cuda_graph=forward_output.can_run_cuda_graph, speculative_num_draft_tokens=1,
        next_draft_input=EagleDraftInput(bonus_tokens=next_token_ids.to(torch.int32)), accept_lens=accept_lens,
        new_seq_lens=new_seq_lens, routed_experts_output=forward_output.routed_experts_output,
        indexer_topk_output=forward_output.indexer_topk_output, extra_keep_alive_refs=list(keep_alive))


def token_step_result(forward_output, next_token_ids, new_seq_lens, keep_alive):
    """What SGLang's non-speculative result processing and the overlap relay read from a held step (off_route): the
    target forward's own result (``forward_output``, ``TpModelWorker.forward_batch_generation``'s, as a no-spec step
    hands it over: its metrics too) with the token ``next_token_ids`` [bs] (also the next step's input: with no draft
    input the scheduler relays it as it relays a no-spec step's), ``new_seq_lens`` [bs], no accept lengths (nothing
    more to copy to the host), ``keep_alive`` held two scheduler iterations. Returns ``forward_output``."""
    forward_output.next_token_ids, forward_output.new_seq_lens = next_token_ids, new_seq_lens
    forward_output.extra_keep_alive_refs = list(keep_alive)
    return forward_output


def publish_read_done(worker) -> None:
    """Record, on the current stream, the event the scheduler's WAR barrier waits on after a step (its fast path, as
    SGLang's decode graph and draft-extend graph publish it), on the runner the scheduler reads it from: 0.5.17
    ``war_fastpath_runner.war_fastpath_read_done_event``; 0.5.18+ ``last_shared_read_runner.shared_read_done_event``."""
    if hasattr(type(worker), "war_fastpath_runner"):
        runner, name = worker.war_fastpath_runner, "war_fastpath_read_done_event"
    else:
        runner, name = worker.last_shared_read_runner, "shared_read_done_event"
    # one event a worker, recorded again each step: the barrier waits on it right after the launch that published it
    # (and clears it); a wait that came later would wait for later work, never for less. The current stream asked of
    # the worker's device by index (torch's lookup of the current device, which a bare record() makes, costs more)
    made = worker.__dict__.get("_sgl_eagle_triton_read_done")
    if made is None:
        module = torch.get_device_module(worker.device)
        made = worker._sgl_eagle_triton_read_done = (module.Event(), module.current_stream, module.current_device())
    event, current_stream, index = made
    event.record(current_stream(index))
    setattr(runner, name, event)


def lean_draft_problems() -> list[str]:
    """What keeps the lean draft phase out (empty when nothing does): its call site and signature
    (:data:`LEAN_DRAFT_CALL_SITES`, :data:`LEAN_DRAFT_SIGNATURES`), or a ``prepare_for_draft`` that plans the
    verify's KV window (``target_translator``: SGLang 0.5.22+)."""
    problems = _reach_and_signature_problems(LEAN_DRAFT_CALL_SITES, LEAN_DRAFT_SIGNATURES)
    prepare = getattr(eagle_worker_common, "prepare_for_draft", None)
    if prepare is None or "target_translator" in inspect.signature(prepare).parameters:
        problems.append(f"{eagle_worker_common.__name__}.prepare_for_draft plans the verify's KV window (or is "
                        "missing): the draft phase cannot skip it")
    return problems


def build_verify_input(draft_worker, batch, parent_list, top_scores_index, draft_tokens):
    """SGLang's ``build_eagle_verify_input`` of ``batch`` (its ``spec_info``: the relayed draft input) for the tree
    ``parent_list`` / ``top_scores_index`` / ``draft_tokens`` [bs, ...] int64 (the fused drafter's), in
    ``draft_worker``'s shape and tree-mask mode, as SGLang's draft phase ends. First the batch's ``seq_lens_sum``
    from its CPU lengths where it has none (after a request joined or left), as SGLang's draft preparation leaves
    it (``ForwardBatch.init_new`` backfills it, 0.5.17-0.5.23): without it a tree mask that is not preallocated
    would be sized for every request at the full context length."""
    if getattr(batch, "seq_lens_sum", 0) is None and getattr(batch, "seq_lens_cpu", None) is not None:
        batch.seq_lens_sum = int(batch.seq_lens_cpu.sum())
    return eagle_worker_v2.build_eagle_verify_input(
        batch, batch.spec_info, parent_list, top_scores_index, draft_tokens, None,
        target_worker=draft_worker.target_worker, topk=draft_worker.topk,
        num_steps=draft_worker.speculative_num_steps, num_draft_tokens=draft_worker.speculative_num_draft_tokens,
        tree_mask_mode=draft_worker.tree_mask_mode, device=draft_worker.device)


def target_graph_runner(model_runner):
    """``model_runner``'s decode CUDA-graph runner (a speculative server's target: its verify graphs; what SGLang
    registers as the initial adaptive state's ``target_graph_runner``), None without one (0.5.17-0.5.23:
    ``decode_cuda_graph_runner``)."""
    return getattr(model_runner, "decode_cuda_graph_runner", None)


def graph_epilogue_problems(model_runner) -> list[str]:
    """What keeps steps 0's graph epilogue out of ``model_runner``'s (the target's) CUDA graphs (empty when nothing
    does): SGLang's capture no longer runs ``capture_tail_hooks``, or the runner keeps no such list."""
    problems = _reach_and_signature_problems(GRAPH_EPILOGUE_CALL_SITES, ())
    if not isinstance(getattr(model_runner, "capture_tail_hooks", None), list):
        problems.append(f"{_where(type(model_runner))} keeps no capture_tail_hooks list")
    return problems


def replays_whole_graphs(graph_runner) -> bool:
    """Whether ``graph_runner`` (a decode-graph runner: a state's ``target_graph_runner``) replays each captured graph
    whole (SGLang's full CUDA-graph backend), not in pieces with eager breaks between them (its breakable backend,
    ``--debug-cuda-graph``), where a tail hook's buffers need not be the replay's."""
    from sglang.srt.model_executor.runner_backend.full_cuda_graph_backend import FullCudaGraphBackend

    return isinstance(getattr(graph_runner, "backend", None), FullCudaGraphBackend)


@contextmanager
def capture_tail_hook(model_runner, hook):
    """While the block runs (an adaptive state's CUDA graphs being captured), SGLang's decode-graph capture calls
    ``hook(graph_runner, logits_output, forward_batch, num_tokens)`` after ``model_runner``'s forward, inside the graph
    (``ModelRunner.capture_tail_hooks``); ``hook`` None: nothing."""
    if hook is None:
        yield
        return
    hooks = model_runner.capture_tail_hooks
    hooks.append(hook)
    try:
        yield
    finally:
        hooks.remove(hook)


def add_capture_tail_hook(model_runner, hook) -> None:
    """From now on SGLang's decode-graph captures of ``model_runner`` (the target's: every adaptive state's verify
    graphs, the initial state's captured by the scheduler before the speculative worker's ``init_cuda_graphs``) call
    ``hook(graph_runner, logits_output, forward_batch, num_tokens)`` after the forward, inside the graph."""
    model_runner.capture_tail_hooks.append(hook)


def sglang_simulates_acceptance() -> bool:
    """SGLang's benchmark-only simulated acceptance is on (``SGLANG_SIMULATE_ACC_LEN`` > 0: its ``eagle_sample``
    replaces what was accepted; our sampled verify applies it as stock does)."""
    return spec_utils.SIMULATE_ACC_LEN > 0


def argmax_is_sample(sampling_info) -> bool:
    """Whether SGLang's sampler (``ModelRunner.sample``) picks the argmax of the raw logits for every request of a
    batch with this ``SamplingBatchInfo``: all greedy, and nothing that changes the logits before it (custom logit
    processors, penalties, a grammar mask, logit bias) nor asks it for more (sampling masks); on CUDA (ROCm's greedy
    sampler is aiter's)."""
    s = sampling_info
    penalizer = getattr(s, "penalizer_orchestrator", None)
    return (s.is_all_greedy and torch.version.hip is None and not getattr(s, "has_custom_logit_processor", False)
            and getattr(s, "acc_additive_penalties", None) is None and getattr(s, "acc_scaling_penalties", None) is None
            and not (penalizer is not None and penalizer.is_required) and getattr(s, "grammar_mask", None) is None
            and getattr(s, "logit_bias", None) is None and not any(getattr(s, "return_sampling_masks", None) or []))


def sanitizes_nan_logits() -> bool:
    """SGLang's sampler replaces NaN / inf logits before sampling (``SGLANG_SANITIZE_NAN_LOGITS``, off by default)."""
    from sglang.srt.environ import envs

    return bool(envs.SGLANG_SANITIZE_NAN_LOGITS.get())
