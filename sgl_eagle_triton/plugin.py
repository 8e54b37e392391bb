"""Registration of ``--speculative-algorithm EAGLE_TRITON`` with SGLang.

SGLang calls :func:`register` through the ``sglang.srt.plugins`` entry point in every process it
starts (launcher, engine, schedulers), so registration is idempotent and light: the worker module
(and with it Triton and the kernels) is imported only when a scheduler builds the worker.

:class:`EagleTritonSpecAlgo` answers SGLang's speculative-algorithm predicates as EAGLE does:
``is_eagle()`` is True everywhere, ``is_eagle3()`` follows the draft checkpoint (see
:func:`sgl_eagle_triton.config.current_draft_kind`), and predicates ``CustomSpecAlgo`` lacks are
taken from the matching builtin member (``EAGLE3`` or ``EAGLE``).

On an SGLang outside the served releases (:mod:`sgl_eagle_triton.glue.versions`) it applies no hook and registers
EAGLE_TRITON only to refuse it at start, naming the range. Otherwise it also registers hooks
(:mod:`sgl_eagle_triton.glue.hooks`: targets and parameters) through SGLang's plugin hook registry (applied by
``load_plugins`` in every process, in a scheduler before its memory pools exist):
:func:`sgl_eagle_triton.config.req_to_token_headroom`, which sizes an EAGLE_TRITON server's ``req_to_token`` rows for
its draft reservation (a stock SGLang leak and row overwrite near the context limit, 0.5.17 ... 0.5.23; other
algorithms are left as they are), :func:`report_kernels`, which adds the worker's kernel report to ``/server_info``,
:func:`sgl_eagle_triton.config.adaptive_reason`, which lets SGLang's ``--speculative-adaptive`` run for EAGLE_TRITON
under EAGLE3's rules, :func:`sgl_eagle_triton.config.shared_logits_rows`, which sizes the target's shared CUDA-graph
logits buffer for the widest adaptive candidate (an SGLang 0.5.17 / 0.5.18 start-up crash, stock EAGLE3's too), and
:func:`verify_attention_backend`, which swaps an EAGLE_TRITON target's Triton backend for ours (the target verify's
attention through our kernel).
"""

from __future__ import annotations

import faulthandler
import logging
import os

from sglang.srt.speculative.spec_info import SpeculativeAlgorithm
from sglang.srt.speculative.spec_registry import CustomSpecAlgo, get_spec

from sgl_eagle_triton import ALGORITHM_NAME, config, simulated_acceptance
from sgl_eagle_triton.cycle_timing import (
    RUN_BATCH_PARTS,
    SCHEDULER_STAGES,
    SGLANG_PARTS,
    timed_forward,
    timed_part,
    timed_stage,
)
from sgl_eagle_triton.glue import hooks, relay, versions
from sgl_eagle_triton.glue.args import settings

logger = logging.getLogger(__name__)


class EagleTritonSpecAlgo(CustomSpecAlgo):
    """EAGLE_TRITON's answers to the scheduler; the rest comes from SGLang's EAGLE/EAGLE3 member."""

    @property
    def base(self) -> SpeculativeAlgorithm:
        """The builtin algorithm whose plumbing (aux hidden capture, d2t, widths) this server uses."""
        eagle3 = config.current_draft_kind() == config.EAGLE3
        return SpeculativeAlgorithm.EAGLE3 if eagle3 else SpeculativeAlgorithm.EAGLE

    def is_eagle(self) -> bool:
        return True

    def is_eagle3(self) -> bool:
        return self.base is SpeculativeAlgorithm.EAGLE3

    def supports_grammar_overlap(self) -> bool:
        return True

    def has_draft_kv(self) -> bool:
        return True

    # The enum's own implementations, run with ``self`` so they see EAGLE_TRITON's predicates.
    def need_topk(self) -> bool:
        return SpeculativeAlgorithm.need_topk(self)

    def carries_draft_hidden_states(self) -> bool:
        return SpeculativeAlgorithm.carries_draft_hidden_states(self)

    def create_future_map(self, *args, **kwargs):
        """SGLang's, relaying the bonus token alone after a step that only filled the draft KV (glue.relay)."""
        return relay.bonus_only_after_fill(SpeculativeAlgorithm.create_future_map(self, *args, **kwargs))

    def handle_server_args(self, server_args) -> None:
        config.handle_server_args(server_args)

    def resolve_max_speculative_num_draft_tokens(self, server_args):
        """SGLang 0.5.19+: the widest per-request draft of any state (KV reservation, buffer rows): the widest adaptive
        tree candidate's (config.adaptive_max_draft_tokens), else what SGLang answers for the base algorithm."""
        widest = config.adaptive_max_draft_tokens(server_args)
        if widest is not None:
            return widest
        return SpeculativeAlgorithm.EAGLE3.resolve_max_speculative_num_draft_tokens(server_args)  # EAGLE's rule too

    def __getattr__(self, name: str):
        # Only reached for names this class and CustomSpecAlgo lack (predicates of newer SGLang).
        if name.startswith("_"):
            raise AttributeError(name)
        return getattr(self.base, name)


def _worker_factory(server_args):
    from sgl_eagle_triton.worker import EagleTritonWorkerV2

    return EagleTritonWorkerV2


def report_kernels(result, scheduler, *args, **kwargs):
    """After-hook on the scheduler's ``get_internal_state``, whose ``GetInternalStateReqOutput.internal_state``
    becomes ``/server_info``'s ``internal_states[i]``: adds ``"eagle_triton"``, the EAGLE_TRITON worker's
    :meth:`~sgl_eagle_triton.worker.EagleTritonWorkerV2.kernel_report` (other servers' states stay as they are)."""
    report = getattr(getattr(scheduler, "draft_worker", None), "kernel_report", None)
    state = getattr(result, "internal_state", None)
    if callable(report) and isinstance(state, dict):
        state["eagle_triton"] = report()
    return result


def verify_attention_backend(backend, *args, model_runner=None, **kwargs):
    """After-hook on SGLang's ``attention_backend_setup._build_resolved_backend`` (keyword ``model_runner``): an
    EAGLE_TRITON target's Triton backend attends its verify through our kernel (before any CUDA graph is captured;
    :func:`sgl_eagle_triton.verify.tree_verify_attention`) unless the server turned it off or its pool is one the
    kernel does not read (config.verify_attention_wanted, on the model runner's resolved page size and KV dtype);
    drafts, other backends and other algorithms keep SGLang's.
    The worker reports which one attends (and refuses to start under ``VERIFY_ATTENTION_ENV=1`` if not ours)."""
    if (model_runner is not None and not getattr(model_runner, "is_draft_worker", False)
            and config.is_ours(settings(model_runner.server_args))
            and config.verify_attention_wanted(model_runner.page_size, model_runner.kv_cache_dtype)):
        from sgl_eagle_triton.verify import tree_verify_attention

        backend = tree_verify_attention(backend)
    return backend


def _register_hooks() -> None:
    hooks.register({
        "req_to_token_headroom": config.req_to_token_headroom,
        "report_kernels": report_kernels,
        "adaptive_reason": config.adaptive_reason,
        "shared_logits_rows": config.shared_logits_rows,
        # every attention backend SGLang builds (the model runner's at start-up, each adaptive state's) comes from it
        "verify_attention_backend": verify_attention_backend,
    })


def _simulate_stock_acceptance() -> None:
    """Benchmark mode (:mod:`sgl_eagle_triton.simulated_acceptance`): stock EAGLE / EAGLE3 verify under the same
    simulated acceptance as EAGLE_TRITON (SGLang's ``eagle_sample`` wrapped process-wide)."""
    if hooks.wrap_stock_eagle_sample(simulated_acceptance.wrap, "sgl_eagle_triton_simulated"):
        logger.warning("%s: simulated acceptance %r for every EAGLE server of this process (benchmark mode)",
                       ALGORITHM_NAME, simulated_acceptance.profile_name())


def _time_eagle_workers(every: int, profile_top: int) -> None:
    """Diagnostics (:data:`config.CYCLE_TIMING_ENV`): every ``EAGLEWorkerV2`` of this process, stock EAGLE / EAGLE3
    and ours (whose ``forward_batch_generation`` calls the parent's), logs its decode steps' timing
    (:func:`sgl_eagle_triton.cycle_timing.timed_forward`); subclasses that override the method without calling it
    (SGLang's MTP variants) are not timed; ``profile_top`` > 0 profiles their launches too. Imports SGLang's EAGLE
    worker module, only with the variable set."""
    if hooks.wrap_eagle_forward(lambda forward: timed_forward(forward, every, profile_top=profile_top),
                                "sgl_eagle_triton_timed"):
        logger.warning("%s: %s=%d: every EAGLE server of this process logs its decode cycle timing (diagnostics)%s",
                       ALGORITHM_NAME, config.CYCLE_TIMING_ENV, every,
                       f", with the {profile_top} most costly functions of its launches" if profile_top else "")


def _time_scheduler_stages(every: int, profile_top: int) -> bool:
    """Diagnostics (:data:`config.CYCLE_TIMING_ENV`): every SGLang scheduler of this process, speculative or not, logs
    the host time of its stages per decode iteration (:func:`sgl_eagle_triton.cycle_timing.timed_stage`). Imports
    SGLang's scheduler module, only with the variable set. ``profile_top`` > 0 profiles every stage, ``run_batch``
    (and in it the worker's launch) included. True where this SGLang's scheduler has a ``run_batch`` to time."""
    missing = hooks.wrap_scheduler_stages(
        SCHEDULER_STAGES, lambda stage, method: timed_stage(stage, method, every, profile_top=profile_top),
        "sgl_eagle_triton_timed")
    if missing is not None:
        logger.warning("%s: %s=%d: every scheduler of this process logs its stages' host time (diagnostics)%s",
                       ALGORITHM_NAME, config.CYCLE_TIMING_ENV, every,
                       f"; this SGLang has no {', '.join(missing)} (counted in rest)" if missing else "")
        parts_missing = hooks.wrap_parts(RUN_BATCH_PARTS, timed_part, "sgl_eagle_triton_part")
        parts_missing = (parts_missing or []) + (hooks.wrap_parts(
            SGLANG_PARTS, timed_part, "sgl_eagle_triton_part", hooks.SGLANG_PART_TARGETS) or [])
        if parts_missing:
            logger.warning("%s: parts without %s (untimed; a run_batch part counts in its other)", ALGORITHM_NAME,
                           ", ".join(parts_missing))
    return missing is None or "run_batch" not in missing


def _refuse_this_sglang(server_args) -> None:
    """The validate hook on an SGLang outside the served releases: refuses the server at start, naming the range."""
    versions.check_supported()


def register() -> None:
    """Entry point of group ``sglang.srt.plugins``; safe to call any number of times."""
    if os.environ.get(config.STACK_DUMP_ENV):  # diagnostics of a hang (docs/gpu.md)
        faulthandler.dump_traceback_later(float(os.environ[config.STACK_DUMP_ENV]), repeat=True)
    if simulated_acceptance.active():
        _simulate_stock_acceptance()
    every = config.cycle_timing_every()
    if every:
        profile_top = config.cycle_profile_top() or 0  # a bad value: EAGLE_TRITON refuses it at start
        # one profiler at a time (Python >= 3.12): the scheduler's run_batch listing holds the workers' launches
        scheduler_profiled = _time_scheduler_stages(every, profile_top)
        if config.cycle_timing_scope() == "scheduler":
            logger.warning("%s: %s=scheduler: the EAGLE workers' decode steps are not timed (every server carries the "
                           "same instrument)", ALGORITHM_NAME, config.CYCLE_TIMING_SCOPE_ENV)
        else:  # all (a bad value: EAGLE_TRITON refuses it at start; other servers time as under all)
            _time_eagle_workers(every, 0 if scheduler_profiled else profile_top)
    elif every is None:  # EAGLE_TRITON refuses it at start; other servers say they run untimed
        logger.warning("%s: %s=%r is not a whole number of decode steps > 0: no cycle timing", ALGORITHM_NAME,
                       config.CYCLE_TIMING_ENV, os.environ.get(config.CYCLE_TIMING_ENV))
    if get_spec(ALGORITHM_NAME) is not None:
        return
    unserved = versions.unsupported_reason()
    served = unserved is None
    if served:  # outside the served releases no hook is applied: the algorithm is registered only to refuse
        _register_hooks()
    else:
        logger.warning("%s: %s; a server asking for it is refused at start", ALGORITHM_NAME, unserved)
    SpeculativeAlgorithm.register(
        ALGORITHM_NAME,
        supports_overlap=True,
        validate_server_args=config.validate_before_defaults if served else _refuse_this_sglang,
        spec_class=EagleTritonSpecAlgo,
    )(_worker_factory)
