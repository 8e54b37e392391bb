"""The SGLang functions our plugin hooks (SGLang's plugin hook registry wraps them in every process it starts), with
the parameters each of our hooks reads, and their registration.

Each hook is registered by its key in :data:`HOOKS`; the plugin hands the functions (:func:`register`). The start-up
check (:func:`hook_problems`) imports every target and matches its parameters against the variants we handle.
"""

from __future__ import annotations

import importlib
import inspect
import logging
from dataclasses import dataclass

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Hook:
    target: str  # SGLang's function or method, dotted
    kind: str  # "after" (our hook gets the result, then SGLang's arguments) or "around" (the original first)
    variants: tuple  # the parameter lists (``self`` dropped) our hook handles, any further ones defaulted
    why: str


HOOKS = {
    # 0.5.17: the server args; 0.5.18+: none (it reads the published settings): config.req_to_token_headroom takes both
    "req_to_token_headroom": Hook(
        "sglang.srt.mem_cache.allocation_sizing.get_req_to_token_extra_context_len", "after",
        (("server_args",), ()), "req_to_token rows hold the draft reservation at page size 1 (an SGLang leak)"),
    "report_kernels": Hook(
        "sglang.srt.managers.scheduler.Scheduler.get_internal_state", "after", (("recv_req",),),
        "/server_info shows the kernel report"),
    "adaptive_reason": Hook(
        "sglang.srt.speculative.adaptive_spec_params.adaptive_unsupported_reason", "around", (("server_args",),),
        "--speculative-adaptive judged by EAGLE3's rules"),
    "shared_logits_rows": Hook(
        "sglang.srt.model_executor.model_runner.ModelRunner.max_decode_logits_rows", "after", ((),),
        "the shared logits buffer holds the widest adaptive tree"),
    "verify_attention_backend": Hook(
        "sglang.srt.model_executor.model_runner_components.attention_backend_setup._build_resolved_backend", "after",
        (("model_runner", "resolved", "init_new_workspace"),), "the target's verify attends through our kernel"),
}


def resolve(target: str):
    """The function or method a dotted ``target`` names (the longest importable module prefix, then attributes)."""
    parts = target.split(".")
    for i in range(len(parts) - 1, 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:i]))
        except ImportError:
            continue
        for name in parts[i:]:
            obj = getattr(obj, name)
        return obj
    raise ImportError(target)


def parameters(fn) -> list[inspect.Parameter]:
    """``fn``'s parameters (through wrappers), ``self`` dropped, and ``cls`` (a classmethod's own, seen through a
    wrapper of its function: the cycle timing's of ``ForwardBatch.init_new``)."""
    return [p for p in inspect.signature(inspect.unwrap(fn)).parameters.values() if p.name not in ("self", "cls")]


def signature_problem(fn, variants) -> str | None:
    """Why ``fn``'s parameters match none of ``variants`` (each a leading list of names, any further parameters
    defaulted), None if one matches."""
    params = parameters(fn)
    named = [p.name for p in params if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]
    for variant in variants:
        rest = [p for p in params[len(variant):] if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]
        if tuple(named[:len(variant)]) == tuple(variant) and all(p.default is not p.empty for p in rest):
            return None
    return f"takes ({', '.join(named)}), not ({' or '.join(', '.join(v) for v in variants)})"


def hook_problems() -> list[str]:
    """Every hook target that is missing or whose parameters match none of the variants our hook handles."""
    problems = []
    for hook in HOOKS.values():
        try:
            target = resolve(hook.target)
        except (ImportError, AttributeError):
            problems.append(f"{hook.target} (missing: {hook.why})")
            continue
        problem = signature_problem(target, hook.variants)
        if problem:
            problems.append(f"{hook.target} {problem} ({hook.why})")
    return problems


def register(functions: dict) -> bool:
    """Register ``functions`` (keys of :data:`HOOKS` -> our hooks) with SGLang's plugin hook registry; False (logged)
    on an SGLang without one."""
    try:
        from sglang.srt.plugins.hook_registry import HookRegistry, HookType
    except ImportError:
        logger.warning("EAGLE_TRITON: this SGLang has no plugin hook registry; its hooks are not applied")
        return False
    for key, fn in functions.items():
        hook = HOOKS[key]
        HookRegistry.register(hook.target, fn, HookType.AFTER if hook.kind == "after" else HookType.AROUND)
    return True


# Process-wide wrappers (benchmark mode and diagnostics only; each applied once, marked by ``marker``)

def wrap_stock_eagle_sample(wrap, marker: str) -> bool:
    """Every EAGLE server of this process verifies through ``wrap(eagle_sample)`` (SGLang's
    ``eagle_worker_common.eagle_sample``, which ``EAGLEWorkerV2.verify`` looks up at each call); False if already."""
    from sglang.srt.speculative import eagle_worker_common

    if getattr(eagle_worker_common.eagle_sample, marker, False):
        return False
    eagle_worker_common.eagle_sample = wrap(eagle_worker_common.eagle_sample)
    return True


def wrap_eagle_forward(wrap, marker: str) -> bool:
    """Every ``EAGLEWorkerV2`` of this process runs its decode steps through ``wrap(forward_batch_generation)``
    (ours calls the parent's); False if already."""
    from sglang.srt.speculative.eagle_worker_v2 import EAGLEWorkerV2

    if getattr(EAGLEWorkerV2.forward_batch_generation, marker, False):
        return False
    EAGLEWorkerV2.forward_batch_generation = wrap(EAGLEWorkerV2.forward_batch_generation)
    return True


def wrap_scheduler_stages(stages, wrap, marker: str) -> list[str] | None:
    """Every SGLang ``Scheduler`` of this process runs each method named in ``stages`` through
    ``wrap(name, method)`` (diagnostics); returns the names this SGLang lacks (not wrapped), None if already
    wrapped."""
    from sglang.srt.managers.scheduler import Scheduler

    present = [name for name in stages if callable(getattr(Scheduler, name, None))]
    if not present or getattr(getattr(Scheduler, present[0]), marker, False):
        return None
    for name in present:
        setattr(Scheduler, name, wrap(name, getattr(Scheduler, name)))
    return [name for name in stages if name not in present]


RUN_BATCH_PART_TARGETS = {  # cycle_timing.RUN_BATCH_PARTS -> the SGLang functions timed as that part
    "resolve_seq_lens_cpu": ("sglang.srt.managers.overlap_utils:FutureMap.resolve_seq_lens_cpu",),
    "resolve_forward_inputs": ("sglang.srt.managers.scheduler:resolve_forward_inputs",),  # the name run_batch calls
    "forward_batch_generation": ("sglang.srt.managers.tp_worker:TpModelWorker.forward_batch_generation",
                                 "sglang.srt.speculative.eagle_worker_v2:EAGLEWorkerV2.forward_batch_generation"),
    "record_batch_in_overlap": ("sglang.srt.managers.scheduler:Scheduler.record_batch_in_overlap",),
    "_relay_forward_payload": ("sglang.srt.managers.scheduler:Scheduler._relay_forward_payload",),
    "copy_to_cpu": ("sglang.srt.managers.utils:GenerationBatchResult.copy_to_cpu",),
}


SGLANG_PART_TARGETS = {  # cycle_timing.SGLANG_PARTS -> the SGLang functions timed as that part
    "new_tokens_required_next_decode": (
        "sglang.srt.managers.schedule_batch:ScheduleBatch.new_tokens_required_next_decode",),
    "prepare_for_decode": ("sglang.srt.managers.schedule_batch:ScheduleBatch.prepare_for_decode",),
    "init_new": ("sglang.srt.model_executor.forward_batch_info:ForwardBatch.init_new",),  # a classmethod
    "model_forward": ("sglang.srt.model_executor.model_runner:ModelRunner.forward",),
    "sample": ("sglang.srt.model_executor.model_runner:ModelRunner.sample",),
    "process_batch_result_decode": ("sglang.srt.managers.scheduler_components.batch_result_processor:"
                                    "SchedulerBatchResultProcessor.process_batch_result_decode",),
    "stream_output": ("sglang.srt.managers.scheduler_components.output_streamer:"
                      "SchedulerOutputStreamer.stream_output",),
}


def part_target(target: str) -> tuple:
    """``(owner, name, function)`` of a :data:`RUN_BATCH_PART_TARGETS` entry ``"module:Owner.name"`` (or
    ``"module:name"``, a module global): the module or class holding the function under ``name``, and the function
    (a class's own, not an inherited one). ImportError / AttributeError / KeyError where this SGLang lacks it."""
    import importlib

    module_name, _, path = target.partition(":")
    *owner_path, name = path.split(".")
    owner = importlib.import_module(module_name)
    for attribute in owner_path:
        owner = getattr(owner, attribute)
    return owner, name, owner.__dict__[name] if owner_path else getattr(owner, name)


def wrap_parts(parts, wrap, marker: str, targets: dict = RUN_BATCH_PART_TARGETS) -> list[str] | None:
    """Each SGLang function of ``targets`` (:data:`RUN_BATCH_PART_TARGETS`, or :data:`SGLANG_PART_TARGETS`) for the
    names in ``parts`` replaced, process-wide, by ``wrap(part, function)`` (a classmethod's function wrapped, and
    bound again as one; diagnostics); returns the targets this SGLang lacks, None if already wrapped."""
    missing = []
    for part in parts:
        for target in targets[part]:
            try:
                owner, name, function = part_target(target)
            except (ImportError, AttributeError, KeyError):
                missing.append(target)
                continue
            bound_to_class = isinstance(function, classmethod)
            if bound_to_class:
                function = function.__func__
            if getattr(function, marker, False):
                return None
            wrapped = wrap(part, function)
            setattr(owner, name, classmethod(wrapped) if bound_to_class else wrapped)
    return missing


def global_tp_group():
    """SGLang's process-wide tensor-parallel group (``parallel_state._TP``, a ``GroupCoordinator``); None before SGLang
    initialised its groups (a process without them: CPU tests)."""
    from sglang.srt.distributed import parallel_state

    return parallel_state._TP


def tp_rank_of(worker) -> int:
    """The tensor-parallel rank an SGLang worker runs on: its ``ps.tp_rank`` up to 0.5.20; from 0.5.21 workers keep no
    ``ps`` and the rank is SGLang's TP group's (0 outside SGLang's distributed setup)."""
    rank = getattr(getattr(worker, "ps", None), "tp_rank", None)
    if rank is not None:
        return rank
    group = global_tp_group()
    return group.rank_in_group if group is not None else 0
