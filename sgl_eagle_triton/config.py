"""Server-arg validation and defaults for ``--speculative-algorithm EAGLE_TRITON``.

Everything here runs at server start, in the launcher process, before any model loads: what
EAGLE_TRITON cannot serve yet is refused here with a message that says what to change, never
discovered mid-request. (Two exceptions run in the scheduler: :func:`req_to_token_headroom`, a hook on
SGLang's pool sizing, and :func:`check_req_to_token_rows`, the worker's start-up check of its effect.) The
draft kind (EAGLE-3 or EAGLE-1/2) is decided here once, from the draft checkpoint's ``architectures[0]``, and
exported through ``DRAFT_KIND_ENV`` so that every spawned SGLang process answers ``is_eagle3()`` identically.

Plain attribute reads and writes of ``ServerArgs`` fields only: from SGLang 0.5.19 the hooks get a stand-in that
reads the resolved settings and records writes to fields (:mod:`sgl_eagle_triton.glue.args`); what is not a field
(the adaptive tree candidates) travels in the environment, as the draft kind does. Code that runs after start-up
reads server args through :func:`sgl_eagle_triton.glue.args.settings`.
"""

from __future__ import annotations

import functools
import json
import logging
import os

from sgl_eagle_triton import ALGORITHM_NAME, simulated_acceptance
from sgl_eagle_triton.glue import args as glue_args
from sgl_eagle_triton.glue import versions

logger = logging.getLogger(__name__)

DRAFT_KIND_ENV = "SGLANG_EAGLE_TRITON_DRAFT_KIND"
# the adaptive tree candidates as read at start ({steps: [topk, draft tokens]}, JSON), inherited by every process of
# the server so that none reads the config file again (not a ServerArgs field: SGLang 0.5.19+ keeps only fields)
ADAPTIVE_TREES_ENV = "SGLANG_EAGLE_TRITON_ADAPTIVE_TREES"
DRAFT_CHECK_ENV = "SGLANG_EAGLE_TRITON_DRAFT_CHECK"  # read by sgl_eagle_triton.draft_check
# Tests: under --speculative-adaptive, switch to the next candidate step count before every decode step (worker.py)
ADAPTIVE_CYCLE_ENV = "SGLANG_EAGLE_TRITON_ADAPTIVE_CYCLE"
# Tensor parallelism (drafter.TensorParallel) beyond what has run end to end on GPUs (TESTED_TP_SIZES, EAGLE-1 drafts
# at TESTED_EAGLE1_TP_SIZES, the cost-aware adaptive policy at TESTED_COST_POLICY_TP_SIZES): refused unless this is 1
# (GPU tests, trials)
EXPERIMENTAL_TP_ENV = "SGLANG_EAGLE_TRITON_EXPERIMENTAL_TP"
TESTED_TP_SIZES = (1, 2, 4)
TESTED_EAGLE1_TP_SIZES = (1, 2, 4)
TESTED_COST_POLICY_TP_SIZES = (1, 2)
# The target verify's attention (verify.TreeVerifyAttention): "auto" (unset): our grouped Triton kernel wherever it
# serves (SGLang's triton backend, a 16-bit KV pool of page size 1), SGLang's elsewhere; "1": ours, else refuse to
# start; "0": SGLang's everywhere
VERIFY_ATTENTION_ENV = "SGLANG_EAGLE_TRITON_VERIFY_ATTENTION"
VERIFY_ATTENTION_MODES = ("auto", "1", "0")
# what /server_info's kernels -> "verify attention" says where ours runs (worker.verify_attention_in_use; read by the
# benchmarks' rows and the e2e tests)
VERIFY_ATTENTION_IN_USE = "triton sgl_eagle_triton.kernels.verify_attention (the target verify's attention)"
# the trial's variable before our kernel became the default (SGLang turns an SGL_ name into its SGLANG_ one)
RETIRED_VERIFY_ATTENTION_ENVS = ("SGLANG_EAGLE_TRITON_EXPERIMENTAL_VERIFY_ATTENTION",
                                 "SGL_EAGLE_TRITON_EXPERIMENTAL_VERIFY_ATTENTION")
# Diagnostics: every process that loads the plugin prints all its threads' Python stacks to stderr every this many
# seconds (faulthandler), so that a hung server's log shows where each rank waits
STACK_DUMP_ENV = "SGLANG_EAGLE_TRITON_STACK_DUMP_S"
# Diagnostics: every rank logs its decode cycle's host period, launch time and GPU step / idle time every this many
# decode steps, without a profiler (sgl_eagle_triton.cycle_timing)
CYCLE_TIMING_ENV = "SGLANG_EAGLE_TRITON_CYCLE_TIMING"
# Diagnostics, with CYCLE_TIMING_ENV: what it times, "all" (unset: every scheduler's stages and every EAGLE worker's
# decode steps) or "scheduler" (the schedulers' stages only): every server then carries the same instrument, so that a
# speculative server's scheduler period compares with a no-spec server's without the worker timing's own share (its
# CUDA events and their reads, which only EAGLE workers carry)
CYCLE_TIMING_SCOPE_ENV = "SGLANG_EAGLE_TRITON_CYCLE_TIMING_SCOPE"
CYCLE_TIMING_SCOPES = ("all", "scheduler")
# Diagnostics, with CYCLE_TIMING_ENV: each cycle timing summary is followed by a cProfile listing of this many functions
# of the host time inside forward_batch_generation over the same steps
CYCLE_PROFILE_ENV = "SGLANG_EAGLE_TRITON_CYCLE_PROFILE"
# Diagnostics, with CYCLE_PROFILE_ENV: a folder where every listed profile is also written whole (pstats' binary
# format, one file per listing), for tallies across servers (python -m bench.profile_diff)
CYCLE_PROFILE_DIR_ENV = "SGLANG_EAGLE_TRITON_CYCLE_PROFILE_DIR"
# Diagnostics, with CYCLE_TIMING_ENV: an A/B inside one server, a feature (AB_FEATURE_ENV) on and off alternating every
# this many decode steps, each arm's host time logged beside the cycle timing's summaries (bench.stage_split --arms):
# both arms share the server's host, batch and hour, so host-work differences far below the run-to-run spread of two
# servers resolve. Features and their arms (on, off): the greedy verify inside the target's graphs (needs
# VERIFY_IN_GRAPH_ENV=1), the lean draft phase (where it runs; off: SGLang's draft phase, whose graphs are captured),
# the lean draft extend (needs LEAN_EXTEND_ENV=1; off: SGLang's draft extend), the plain steps 0 entered before SGLang's
# steps-0 flow (needs PLAIN_OFF_ENV=1; off: through SGLang's flow), held steps 0 as SGLang's non-speculative decode
# (needs OFF_NONSPEC_ENV=1; off: the plain step on the speculative path)
AB_STEPS_ENV = "SGLANG_EAGLE_TRITON_AB_STEPS"
AB_FEATURE_ENV = "SGLANG_EAGLE_TRITON_AB_FEATURE"  # unset: verify_in_graph
AB_ARMS = {"verify_in_graph": ("in-graph", "after"), "lean_draft": ("lean", "sglang-draft"),
           "lean_extend": ("lean-extend", "sglang-extend"), "plain_direct": ("direct", "sglang-flow"),
           "off_nonspec": ("nonspec", "spec-path")}
# Adaptive steps 0 as a plain decode step (sgl_eagle_triton.off_step): the target's one-token forward and SGLang's
# sampler instead of SGLang's speculative verify of a one-node tree. Unset: wherever it can run (else SGLang's verify,
# the reason logged and reported); "1": required (refused at start where it cannot run); "0": SGLang's verify
PLAIN_OFF_ENV = "SGLANG_EAGLE_TRITON_PLAIN_OFF"
PLAIN_OFF_MODES = {None: "auto", "1": "on", "0": "off"}  # the variable's value (None: unset) -> plain_off_mode()
# Adaptive steps 0, held, as SGLang's non-speculative decode (sgl_eagle_triton.off_route): while the policy holds
# steps 0 the running batch is a non-speculative batch for the scheduler (its preparation, launch and result
# processing), the plain step inside. Unset: wherever it can run (else the plain step on the speculative path, the
# reason logged and reported); "1": required (refused at start where it cannot run); "0": off
OFF_NONSPEC_ENV = "SGLANG_EAGLE_TRITON_OFF_NONSPEC"
OFF_NONSPEC_MODES = {None: "auto", "1": "on", "0": "off"}  # the variable's value (None: unset) -> off_nonspec_mode()
# The lean draft phase: the drafting states' draft phase as our fused drafter on the relayed draft input, without
# SGLang's prepare_for_draft and draft graph runner (worker.TritonEagleDraftWorker.lean_draft). Unset: wherever it can
# run (else SGLang's draft phase, the reason logged and reported); "1": required (refused at start where it cannot
# run); "0": SGLang's draft phase
LEAN_DRAFT_ENV = "SGLANG_EAGLE_TRITON_LEAN_DRAFT"
LEAN_DRAFT_MODES = {None: "auto", "1": "on", "0": "off"}  # the variable's value (None: unset) -> lean_draft_mode()
# The greedy verify of chains inside the target's verify CUDA graphs (sgl_eagle_triton.verify_epilogue). Unset:
# wherever it can run (else after the graph, the reason logged and reported); "1": required (refused at start where it
# cannot run); "0": after the graph (SGLang's eagle_sample on our kernel)
VERIFY_IN_GRAPH_ENV = "SGLANG_EAGLE_TRITON_VERIFY_IN_GRAPH"
VERIFY_IN_GRAPH_MODES = {None: "auto", "1": "on", "0": "off"}  # the value (None: unset) -> verify_in_graph_mode()
# The lean draft extend (TritonEagleDraftWorker.lean_extend): after a chain's verify, the draft KV of every verified
# row and the draft layer and LM head of each request's last accepted row alone, replayed from a CUDA graph of ours per
# batch size, instead of SGLang's draft extend (prepare_for_draft_extend, its graph runner over every row, the row
# select and argmax after it). Unset: wherever it can run (else SGLang's, the reason logged and reported); "1":
# required (refused at start where it cannot run); "0": SGLang's draft extend
LEAN_EXTEND_ENV = "SGLANG_EAGLE_TRITON_LEAN_EXTEND"
LEAN_EXTEND_MODES = {None: "auto", "1": "on", "0": "off"}  # the value (None: unset) -> lean_extend_mode()
# SGLang's: steps 0 without the draft extend (stubs only); refused, since it would skip our steps-0 KV fill too
SKIP_ZERO_STEP_EXTEND_ENV = "SGLANG_SPEC_SKIP_ZERO_STEP_DRAFT_EXTEND"
EAGLE3, EAGLE = "eagle3", "eagle"
SUPPORTED_DRAFT_ARCHS = {"LlamaForCausalLMEagle3": EAGLE3, "LlamaForCausalLMEagle": EAGLE}
SUPPORTED_DEVICES = ("cuda",)
MAX_DRAFT_TOKENS = 128  # the build-tree kernel's widest tree (one program holds a whole tree)
MAX_TOPK = 16  # the fused LM head keeps at most 16 candidates per vocabulary tile
KV_CACHE_DTYPES = ("auto", "bf16", "bfloat16", "fp8_e4m3", "fp8_e5m2")  # SGLang's names, all the draft attention reads
# SGLang runs topk > 1 with page size > 1 only on these attention backends (its two-pass paged draft decode,
# arg_groups/speculative_hook.py); EAGLE_TRITON follows the same rule, since SGLang's draft extend and the target's
# verify run on them.
PAGED_TREE_BACKENDS = ("flashinfer", "fa3", "triton")
# On ROCm (torch.version.hip): the attention backends served there, SGLang's triton (our verify attention replaces its
# verify where the kernel applies) and aiter (SGLang's verify; its default on ROCm); the KV pools the draft attention
# reads there (16-bit: an MI300X's FP8 pool is e4m3fnuz, which it does not read). Never run on an AMD GPU.
ROCM_ATTENTION_BACKENDS = ("triton", "aiter")
ROCM_KV_CACHE_DTYPES = ("auto", "bf16", "bfloat16")


def is_ours(server_args) -> bool:
    """Whether ``server_args`` (any object with ``speculative_algorithm``) ask for EAGLE_TRITON, in any letter case
    (SGLang matches algorithm names case-insensitively; from 0.5.19 a record keeps the name as typed)."""
    return str(getattr(server_args, "speculative_algorithm", None) or "").upper() == ALGORITHM_NAME


class EagleTritonConfigError(ValueError):
    """A server-arg combination EAGLE_TRITON refuses at start-up."""


def _refuse(what: str, change: str) -> None:
    raise EagleTritonConfigError(f"EAGLE_TRITON does not support {what}. {change}")


def _hf_config(model_path: str, trust_remote_code: bool):
    from sglang.srt.utils.hf_transformers_utils import get_config

    return get_config(model_path, trust_remote_code=trust_remote_code)


def _architecture(model_path: str, trust_remote_code: bool) -> str:
    """``architectures[0]`` of a checkpoint's config (``"<none>"`` when it names none)."""
    archs = getattr(_hf_config(model_path, trust_remote_code), "architectures", None)
    return (archs or ["<none>"])[0]


def _model_dtype(hf_config, dtype: str) -> str:
    """The dtype SGLang runs a model of ``hf_config`` in under ``--dtype dtype`` (its own rule: ``auto`` takes
    the checkpoint's, float32 checkpoints as float16), e.g. ``"bfloat16"``."""
    from sglang.srt.configs.model_config import _get_and_verify_dtype

    return str(_get_and_verify_dtype(hf_config, dtype)).removeprefix("torch.")


def _check_tensor_parallel_trial(sa, kind: str) -> None:
    """A TP size outside TESTED_TP_SIZES, or an EAGLE-1 draft at one outside TESTED_EAGLE1_TP_SIZES, starts only
    with EXPERIMENTAL_TP_ENV=1."""
    untried = [f"--tp {sa.tp_size}"] if sa.tp_size not in TESTED_TP_SIZES else []
    if kind == EAGLE and sa.tp_size not in TESTED_EAGLE1_TP_SIZES:
        untried.append(f"EAGLE-1/2 drafts (LlamaForCausalLMEagle) with --tp {sa.tp_size}")
    if not untried:
        return
    if os.environ.get(EXPERIMENTAL_TP_ENV) != "1":
        tested = " or ".join(str(tp) for tp in TESTED_TP_SIZES if tp > 1)
        eagle1 = " or ".join(str(tp) for tp in TESTED_EAGLE1_TP_SIZES if tp > 1)
        _refuse(f"{' or '.join(untried)} yet: built, not yet run end to end on GPUs",
                f"Use --tp 1, an EAGLE-3 draft at --tp {tested} (EAGLE-1 at --tp {eagle1}), or set "
                f"{EXPERIMENTAL_TP_ENV}=1 to try it.")
    logger.warning("%s: %s under %s=1: not yet run end to end on GPUs", ALGORITHM_NAME, " or ".join(untried),
                   EXPERIMENTAL_TP_ENV)


def _check_fused_drafter(sa) -> None:
    """Refuse drafts the fused drafter (one Llama layer, SiLU MLP, full neox RoPE, bf16 or fp16) cannot run."""
    cfg = _hf_config(sa.speculative_draft_model_path, sa.trust_remote_code)
    path = sa.speculative_draft_model_path
    if cfg.num_hidden_layers != 1:
        _refuse(f"a draft with {cfg.num_hidden_layers} decoder layers ({path})", "Use a one-layer EAGLE draft.")
    if getattr(cfg, "hidden_act", "silu") != "silu":
        _refuse(f"the draft activation {cfg.hidden_act!r} ({path})", "Use a SiLU (Llama) draft.")
    if getattr(cfg, "mlp_bias", False):
        _refuse(f"a draft MLP with biases ({path})", "Use a Llama draft without mlp_bias.")
    if getattr(cfg, "partial_rotary_factor", 1.0) != 1.0:
        _refuse(f"partial rotary embeddings ({path})", "Use a draft with RoPE over the whole head.")
    rope = getattr(cfg, "rope_scaling", None) or {}
    if "mrope_section" in rope:
        _refuse(f"multimodal RoPE (mrope) drafts ({path})", "Use a text-only Llama draft.")
    if getattr(cfg, "norm_output", None):
        _refuse(f"drafts with norm_output ({path})", "Use a standard Llama EAGLE draft.")
    if getattr(cfg, "final_logit_softcapping", None):
        _refuse(f"drafts with final_logit_softcapping ({path})", "Use a standard Llama EAGLE draft.")
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    if head_dim not in (64, 128, 256, 512):
        _refuse(f"draft head_dim {head_dim} ({path})", "Use a draft with head_dim 64, 128, 256 or 512 (SGLang's "
                "fused RoPE path, whose fp32 cos/sin table the fused drafter reads).")
    if not getattr(cfg, "rope_is_neox_style", True):
        _refuse(f"non-neox RoPE drafts ({path})", "Use a Llama draft with neox-style RoPE.")
    if sa.tp_size > 1:
        _check_tensor_parallel_draft(cfg, sa.tp_size, path)
    target_cfg = _hf_config(sa.model_path, sa.trust_remote_code)
    draft_dtype, target_dtype = _model_dtype(cfg, sa.dtype), _model_dtype(target_cfg, sa.dtype)
    if draft_dtype not in ("bfloat16", "float16"):
        _refuse(f"--dtype {sa.dtype} with a {draft_dtype} draft ({path})",
                "The Triton kernels run bf16 or fp16; pass --dtype bfloat16 or --dtype float16.")
    if draft_dtype != target_dtype:
        _refuse(f"--dtype {sa.dtype} serving a {target_dtype} target with a {draft_dtype} draft",
                "Pass --dtype bfloat16 or --dtype float16 so that both run in one dtype.")
    if sa.kv_cache_dtype in ("bf16", "bfloat16") and draft_dtype != "bfloat16":
        _refuse(f"--kv-cache-dtype {sa.kv_cache_dtype} with a {draft_dtype} model (the draft attention reads a pool "
                "in the model's dtype or FP8)", "Use --kv-cache-dtype auto, fp8_e4m3 or fp8_e5m2.")


def _check_tensor_parallel_draft(cfg, tp: int, path: str) -> None:
    """Refuse a draft SGLang cannot shard over ``tp`` ranks as the fused drafter reads it: query heads and MLP columns
    split evenly; KV heads split evenly, or replicated when fewer than the ranks (a whole number of ranks per head)."""
    heads, kv_heads = cfg.num_attention_heads, getattr(cfg, "num_key_value_heads", None) or cfg.num_attention_heads
    if heads % tp:
        _refuse(f"--tp {tp} with a draft of {heads} attention heads ({path})",
                "Use a --tp that divides the draft's attention heads.")
    if (kv_heads % tp) if kv_heads >= tp else (tp % kv_heads):
        _refuse(f"--tp {tp} with a draft of {kv_heads} KV heads ({path})",
                "Use a --tp that divides the draft's KV heads, or a multiple of them.")
    if cfg.intermediate_size % tp:
        _refuse(f"--tp {tp} with a draft MLP of {cfg.intermediate_size} columns ({path})",
                "Use a --tp that divides the draft's intermediate size.")


def resolve_draft_kind(draft_model_path: str, trust_remote_code: bool = False) -> str:
    """``"eagle3"`` or ``"eagle"`` from the draft checkpoint's ``architectures[0]``."""
    arch = _architecture(draft_model_path, trust_remote_code)
    if arch not in SUPPORTED_DRAFT_ARCHS:
        _refuse(
            f"the draft architecture {arch!r} (from {draft_model_path})",
            f"Supported draft architectures: {', '.join(SUPPORTED_DRAFT_ARCHS)}; "
            "use --speculative-algorithm EAGLE/EAGLE3 for other drafts.",
        )
    return SUPPORTED_DRAFT_ARCHS[arch]


def current_draft_kind() -> str:
    """The draft kind of this server, identical in every process of it.

    Set by :func:`handle_server_args` in the launcher and inherited by spawned processes; a
    process started some other way resolves it from the published speculative config.
    """
    kind = os.environ.get(DRAFT_KIND_ENV)
    if kind is None:
        from sglang.srt.runtime_context import get_spec

        spec = get_spec()
        kind = resolve_draft_kind(spec.speculative_draft_model_path)
        os.environ[DRAFT_KIND_ENV] = kind
    return kind


_adaptive_requested = False  # whether this process's server asked for --speculative-adaptive


def validate_before_defaults(sa) -> None:
    """SGLang's ``validate_server_args`` hook: runs before SGLang resolves speculative defaults and its adaptive
    parameters (which would switch an ``--speculative-adaptive`` it cannot run off with only a warning)."""
    global _adaptive_requested
    versions.check_supported()
    sa = glue_args.resolving(sa)
    _adaptive_requested = bool(sa.speculative_adaptive)
    if sa.speculative_adaptive:
        _check_adaptive(sa)


def _check_adaptive(sa) -> None:
    """``--speculative-adaptive`` as stock EAGLE3 serves it: candidate chains (topk 1) and steps 0 (no draft), one
    runtime state per candidate step count, switched by SGLang's controller; refused wherever SGLang would refuse
    it for EAGLE3 (its own rules, :func:`stock_adaptive_reason`) rather than letting SGLang switch it off. Beyond
    stock, with ``--speculative-eagle-topk`` K > 1: tree candidates, (steps, k <= K, draft tokens) each, the draft
    tokens (and a narrower k) per step count from the config file (:func:`adaptive_tree`)."""
    from sglang.srt.speculative.adaptive_spec_params import resolve_candidate_steps_from_config

    topk = sa.speculative_eagle_topk or 1
    reason = stock_adaptive_reason(sa)
    if reason is not None:
        _refuse(f"--speculative-adaptive with {reason}", "Drop --speculative-adaptive or the setting it names.")
    candidates = resolve_candidate_steps_from_config(sa.speculative_adaptive_config)  # SGLang's checks of the file
    if topk == 1 and max(candidates) + 1 > MAX_DRAFT_TOKENS:
        _refuse(f"--speculative-adaptive candidate steps {max(candidates)}",
                f"Use candidate_steps of at most {MAX_DRAFT_TOKENS - 1} (a chain of steps + 1 draft tokens).")
    if topk > 1:
        _check_adaptive_trees(sa, topk, candidates)
    policy = adaptive_policy(sa)
    if policy not in ADAPTIVE_POLICIES:
        _refuse(f"--speculative-adaptive-config {ADAPTIVE_POLICY_KEY} {policy!r}",
                f"Use one of {', '.join(ADAPTIVE_POLICIES)}.")
    if (policy == "cost" and sa.tp_size not in TESTED_COST_POLICY_TP_SIZES
            and os.environ.get(EXPERIMENTAL_TP_ENV) != "1"):
        tested = " or ".join(str(tp) for tp in TESTED_COST_POLICY_TP_SIZES)
        _refuse(f"--speculative-adaptive-config {ADAPTIVE_POLICY_KEY} 'cost' with --tp {sa.tp_size} without "
                f"{EXPERIMENTAL_TP_ENV}=1 (every rank adopts rank 0's choice at each decision; run on GPUs at --tp "
                f"{tested} only)", f"Use the sglang policy (the same accept counts on every rank), --tp {tested}, or "
                f"set {EXPERIMENTAL_TP_ENV}=1 for the trial.")
    if policy == "cost" and sa.disable_cuda_graph:
        _refuse(f"--speculative-adaptive-config {ADAPTIVE_POLICY_KEY} 'cost' with --disable-cuda-graph (it prices "
                "each candidate by replaying its CUDA graphs)", "Drop --disable-cuda-graph or use the sglang policy.")


def _check_adaptive_trees(sa, topk: int, candidates: list[int]) -> None:
    """Tree candidates (adaptive with topk > 1): every candidate step count's draft tokens given and buildable;
    page size 1."""
    if (sa.page_size or 1) > 1:
        _refuse(f"--speculative-adaptive with --speculative-eagle-topk {topk} and --page-size {sa.page_size} yet",
                "Use --page-size 1.")
    if topk > MAX_TOPK:
        _refuse(f"--speculative-adaptive with --speculative-eagle-topk {topk}", f"Use a topk of at most {MAX_TOPK}.")
    _check_topk_backend(sa, topk)
    given = _adaptive_config(sa).get(ADAPTIVE_DRAFT_TOKENS_KEY, {})
    if not isinstance(given, dict):
        _refuse(f'"{ADAPTIVE_DRAFT_TOKENS_KEY}": {given!r} in --speculative-adaptive-config',
                'Give an object: {"<steps>": <draft tokens> or [<topk>, <draft tokens>], ...}.')
    missing = [s for s in candidates if s > 0 and str(s) not in given]
    if missing:
        _refuse(f"--speculative-adaptive with --speculative-eagle-topk {topk} without the draft tokens of candidate "
                f"steps {missing}", f'Add "{ADAPTIVE_DRAFT_TOKENS_KEY}": {{"<steps>": <draft tokens>, ...}} for '
                "every candidate step count > 0 to --speculative-adaptive-config.")
    narrower = []
    for steps in candidates:
        if steps > 0:
            source = f" ({ADAPTIVE_DRAFT_TOKENS_KEY} of candidate {steps})"
            k, n = _tree_entry(given[str(steps)], topk, source)
            _check_tree(steps, k, n, source)
            if k < topk:
                narrower.append(steps)
    # candidates narrower than the server's topk (chains among trees; drafter.in_tree_layout): GPU-tested, e2e and
    # load/fault (tests/GPU.md, 2026-11-27)
    if narrower and os.environ.get(DRAFT_CHECK_ENV):
        _refuse(f"{DRAFT_CHECK_ENV} with adaptive candidates narrower than the server's topk (SGLang's own draft is "
                "the server's topk)", f"Unset {DRAFT_CHECK_ENV}.")


def _tree_entry(entry, topk: int, source: str) -> tuple[int, int]:
    """An ``"eagle_triton_draft_tokens"`` value: ``n`` (the server's topk) or ``[k, n]`` with 1 <= k <= topk."""
    def integer(x):
        return isinstance(x, int) and not isinstance(x, bool)

    if isinstance(entry, list) and len(entry) == 2 and all(integer(x) for x in entry):
        k, n = entry
    elif integer(entry):
        k, n = topk, entry
    else:
        k, n = 0, 0
    if not 1 <= k <= topk:
        _refuse(f"the tree entry {entry!r}{source}", f"Give draft tokens n, or [topk, n] with 1 <= topk <= {topk} "
                "(--speculative-eagle-topk: the server's, the widest).")
    return k, n


ADAPTIVE_POLICIES = ("sglang", "cost")
ADAPTIVE_POLICY_KEY = "eagle_triton_policy"  # top-level key of --speculative-adaptive-config (SGLang ignores it)
# top-level key of --speculative-adaptive-config with topk > 1: {"<candidate steps>": draft tokens, or [topk, draft
# tokens] for a candidate narrower than the server's topk} (SGLang ignores it)
ADAPTIVE_DRAFT_TOKENS_KEY = "eagle_triton_draft_tokens"


def _adaptive_config(sa) -> dict:
    path = glue_args.settings(sa).speculative_adaptive_config
    if not path:
        return {}
    with open(path) as f:
        return json.load(f)


def adaptive_tree(sa, steps: int) -> tuple[int, int]:
    """``(topk, draft tokens)`` of the adaptive candidate of ``steps``: the server's topk and steps + 1 for chains
    and steps 0, else the config file's ``"eagle_triton_draft_tokens"`` entry (``n`` at the server's topk, or a
    narrower ``[k, n]``) as :func:`handle_server_args` read it at start (:data:`ADAPTIVE_TREES_ENV`; a process
    that did not inherit it, e.g. a scheduler started by Ray, reads the file again)."""
    topk = glue_args.settings(sa).speculative_eagle_topk or 1
    if steps == 0 or topk == 1:
        return topk, steps + 1
    return _resolved_trees(sa)[steps]


def _resolved_trees(sa) -> dict[int, tuple[int, int]]:
    trees = os.environ.get(ADAPTIVE_TREES_ENV)
    if trees is None:
        trees = os.environ[ADAPTIVE_TREES_ENV] = json.dumps(_trees_from_config(glue_args.settings(sa)))
    return _parsed_trees(trees)


@functools.lru_cache(maxsize=4)
def _parsed_trees(trees: str) -> dict[int, tuple[int, int]]:
    return {int(s): tuple(kn) for s, kn in json.loads(trees).items()}


def _trees_from_config(sa) -> dict[str, list[int]]:
    """``{"<steps>": [topk, draft tokens]}`` of every adaptive candidate, from ``sa``'s config file (validated at
    start by :func:`_check_adaptive_trees`)."""
    from sglang.srt.speculative.adaptive_spec_params import resolve_candidate_steps_from_config

    given, topk = _adaptive_config(sa)[ADAPTIVE_DRAFT_TOKENS_KEY], sa.speculative_eagle_topk
    return {str(s): list(_tree_entry(given[str(s)], topk, "") if s else (topk, 1))
            for s in resolve_candidate_steps_from_config(sa.speculative_adaptive_config)}


def adaptive_max_draft_tokens(sa) -> int | None:
    """The widest per-request KV and buffer rows of any adaptive candidate, max over candidates of max(steps * topk,
    draft tokens) (tree candidates; None for anything else: SGLang's own answer stands)."""
    cfg = glue_args.settings(sa)
    if not cfg.speculative_adaptive or (cfg.speculative_eagle_topk or 1) == 1:
        return None
    topk = cfg.speculative_eagle_topk
    return max(max(s * topk, n) for s, (_, n) in _resolved_trees(sa).items())


def adaptive_policy(sa) -> str:
    """The adaptive policy an EAGLE_TRITON server runs: ``"sglang"`` (SGLang's EMA brackets, the default) or
    ``"cost"`` (:mod:`sgl_eagle_triton.adaptive`), from ``"eagle_triton_policy"`` in
    ``--speculative-adaptive-config``."""
    return _adaptive_config(sa).get(ADAPTIVE_POLICY_KEY, "sglang")


def stock_adaptive_reason(sa, original=None) -> str | None:
    """Why SGLang would not run ``--speculative-adaptive`` with these args were they stock EAGLE3's (its
    ``adaptive_unsupported_reason``, or ``original``), or None."""
    if original is None:
        from sglang.srt.speculative import adaptive_spec_params

        original = adaptive_spec_params.adaptive_unsupported_reason
    # topk 1: EAGLE_TRITON's tree candidates are checked by _check_adaptive_trees
    return original(glue_args.with_fields(sa, speculative_algorithm="EAGLE3", speculative_eagle_topk=1))


def adaptive_reason(original, server_args, *args, **kwargs):
    """Around-hook on SGLang's ``adaptive_unsupported_reason``, which allows EAGLE / EAGLE3 only: an EAGLE_TRITON
    server is judged by EAGLE3's rules (its own refusals ran before, in :func:`validate_before_defaults`)."""
    if is_ours(server_args):
        return stock_adaptive_reason(server_args, original)
    return original(server_args, *args, **kwargs)


def _validate(sa) -> None:
    """Refuse every setting the Triton path has not been built or validated for."""
    if sa.speculative_draft_model_path is None:
        _refuse("running without a draft model", "Pass --speculative-draft-model-path.")
    if sa.device not in SUPPORTED_DEVICES:
        _refuse(f"--device {sa.device}", "Its kernels are validated on CUDA GPUs only; use --device cuda.")
    if sa.speculative_use_rejection_sampling:
        _refuse("--speculative-use-rejection-sampling", "Drop the flag (tree verification is lossless).")
    if getattr(sa, "speculative_use_block_verification", False):  # SGLang 0.5.22+
        _refuse("--speculative-use-block-verification", "Drop the flag (tree verification is lossless).")
    if getattr(sa, "enable_watermark", False):  # SGLang 0.5.22+
        _refuse("--enable-watermark yet (SGLang watermarks in its own sampled verify)", "Drop the flag.")
    if sa.enable_multi_layer_eagle:
        _refuse("--enable-multi-layer-eagle", "Drop the flag.")
    if sa.speculative_draft_window_size is not None:
        _refuse("--speculative-draft-window-size", "Drop the flag.")
    if sa.enable_dp_attention or (getattr(sa, "attn_dp_size", None) or 1) > 1:  # 0.5.22+: attn_dp_size
        _refuse("--enable-dp-attention", "Drop the flag.")
    if sa.pp_size != 1:
        _refuse(f"pipeline parallelism (pp={sa.pp_size})", "Use --pp 1.")
    if getattr(sa, "dcp_size", 1) != 1 or getattr(sa, "attn_cp_size", 1) not in (None, 1):
        # DCP shards the KV cache by position (writes at loc // dcp_size), attention CP the heads' reduction group:
        # neither the draft attention nor the steps-0 KV fill follows them
        _refuse(f"context parallelism (--dcp-size {getattr(sa, 'dcp_size', 1)}, --attn-cp-size "
                f"{getattr(sa, 'attn_cp_size', 1)})", "Use --dcp-size 1 --attn-cp-size 1.")
    if sa.tp_size != 1:
        if getattr(sa, "enable_symm_mem", False):
            # its in-place all-reduce expects inputs in symmetric memory; the drafter's are plain allocations
            _refuse(f"--enable-symm-mem with --tp {sa.tp_size} yet", "Drop --enable-symm-mem or use --tp 1.")
        if getattr(sa, "speculative_token_map", None):
            # SGLang indexes the rank's LM-head shard with the map's whole-vocabulary ids (init_lm_head)
            _refuse(f"--speculative-token-map with --tp {sa.tp_size}", "Drop the token map or use --tp 1.")
    if sa.disaggregation_mode not in (None, "null"):
        _refuse("prefill/decode disaggregation", "Drop --disaggregation-mode.")
    if sa.enable_lora:
        _refuse("LoRA adapters", "Drop --enable-lora / --lora-paths.")
    if getattr(sa, "enable_unified_memory", False):
        # Its pools size req_to_token rows without get_req_to_token_extra_context_len (see req_to_token_headroom).
        _refuse("--enable-unified-memory yet", "Drop the flag.")
    from sglang.srt.environ import envs

    if getattr(envs, SKIP_ZERO_STEP_EXTEND_ENV).get():  # read as SGLang reads it
        # SGLang would skip our steps-0 KV fill with its extend: the draft KV and the resume bookkeeping go stale
        _refuse(f"{SKIP_ZERO_STEP_EXTEND_ENV}={os.environ[SKIP_ZERO_STEP_EXTEND_ENV]} (steps 0 keeps the draft KV "
                "cache with its own fill, which this would skip)", f"Unset {SKIP_ZERO_STEP_EXTEND_ENV}.")
    reason = simulated_acceptance.misconfigured()
    if reason is not None:
        _refuse(f"simulated acceptance here: {reason}", "Set both SGLANG_EAGLE_TRITON_SIMULATED_ACCEPTANCE=<profile> "
                "and SGLANG_EAGLE_TRITON_BENCHMARK=1 (benchmarks only), or neither.")
    _check_verify_attention(sa)
    _check_rocm(sa)
    if cycle_timing_every() is None:
        _refuse(f"{CYCLE_TIMING_ENV}={os.environ[CYCLE_TIMING_ENV]!r}", "Give a whole number of decode steps > 0, "
                "or unset it.")
    if cycle_timing_scope() is None:
        _refuse(f"{CYCLE_TIMING_SCOPE_ENV}={os.environ[CYCLE_TIMING_SCOPE_ENV]!r}",
                f"Give one of {', '.join(CYCLE_TIMING_SCOPES)}, or unset it.")
    if os.environ.get(CYCLE_TIMING_SCOPE_ENV) and not cycle_timing_every():
        _refuse(f"{CYCLE_TIMING_SCOPE_ENV} without {CYCLE_TIMING_ENV} (it says what the cycle timing times)",
                f"Set {CYCLE_TIMING_ENV}=<decode steps> too, or unset {CYCLE_TIMING_SCOPE_ENV}.")
    if ab_steps() and cycle_timing_scope() == "scheduler":
        _refuse(f"{AB_STEPS_ENV} with {CYCLE_TIMING_SCOPE_ENV}=scheduler (each arm is timed by the worker's cycle "
                "timing, which that scope leaves out)", f"Unset {CYCLE_TIMING_SCOPE_ENV}, or unset {AB_STEPS_ENV}.")
    if cycle_profile_top() is None:
        _refuse(f"{CYCLE_PROFILE_ENV}={os.environ[CYCLE_PROFILE_ENV]!r}", "Give a whole number of functions > 0, "
                "or unset it.")
    if ab_steps() is None:
        _refuse(f"{AB_STEPS_ENV}={os.environ[AB_STEPS_ENV]!r}", "Give a whole number of decode steps > 0, or unset it.")
    if ab_feature() is None:
        _refuse(f"{AB_FEATURE_ENV}={os.environ[AB_FEATURE_ENV]!r}", f"Give one of {', '.join(AB_ARMS)}, or unset it.")
    if ab_steps() and not cycle_timing_every():
        _refuse(f"{AB_STEPS_ENV} without {CYCLE_TIMING_ENV} (each arm is timed by the cycle timing)",
                f"Set {CYCLE_TIMING_ENV}=<decode steps> too, or unset {AB_STEPS_ENV}.")
    if ab_steps() and ab_feature() == "verify_in_graph" and verify_in_graph_mode() != "on":
        _refuse(f"{AB_STEPS_ENV} for verify_in_graph without {VERIFY_IN_GRAPH_ENV}=1 (the arms alternate it)",
                f"Set {VERIFY_IN_GRAPH_ENV}=1 too, or unset {AB_STEPS_ENV}.")
    if ab_steps() and ab_feature() == "lean_extend" and lean_extend_mode() != "on":
        _refuse(f"{AB_STEPS_ENV} for lean_extend without {LEAN_EXTEND_ENV}=1 (the arms alternate it)",
                f"Set {LEAN_EXTEND_ENV}=1 too, or unset {AB_STEPS_ENV}.")
    if ab_steps() and ab_feature() == "lean_draft" and (lean_draft_mode() == "off" or lean_draft_unserved(sa)):
        _refuse(f"{AB_STEPS_ENV} for lean_draft where the lean draft phase does not run (the arms alternate it)",
                f"Unset {LEAN_DRAFT_ENV}, serve one GPU without the draft check or paged trees, or unset "
                f"{AB_STEPS_ENV}.")
    if ab_steps() and ab_feature() == "off_nonspec" and not off_nonspec():
        _refuse(f"{AB_STEPS_ENV} for off_nonspec without {OFF_NONSPEC_ENV}=1 (the arms alternate the route)",
                f"Set {OFF_NONSPEC_ENV}=1 too, or unset {AB_STEPS_ENV}.")
    if ab_steps() and ab_feature() == "plain_direct" and not plain_off():
        _refuse(f"{AB_STEPS_ENV} for plain_direct without {PLAIN_OFF_ENV}=1 (the arms alternate the plain step's "
                "entry)", f"Set {PLAIN_OFF_ENV}=1 too, or unset {AB_STEPS_ENV}.")
    if ab_steps() and ab_feature() == "plain_direct" and off_nonspec_mode() != "off":
        _refuse(f"{AB_STEPS_ENV} for plain_direct without {OFF_NONSPEC_ENV}=0 (held plain steps would run as "
                "SGLang's non-speculative decode, in neither arm)", f"Set {OFF_NONSPEC_ENV}=0 too, or unset "
                f"{AB_STEPS_ENV}.")
    if cycle_profile_top() and not cycle_timing_every():
        _refuse(f"{CYCLE_PROFILE_ENV} without {CYCLE_TIMING_ENV} (the profile is logged with its summaries)",
                f"Set {CYCLE_TIMING_ENV}=<decode steps> too, or unset {CYCLE_PROFILE_ENV}.")
    if os.environ.get(CYCLE_PROFILE_DIR_ENV) and not cycle_profile_top():
        _refuse(f"{CYCLE_PROFILE_DIR_ENV} without {CYCLE_PROFILE_ENV} (it keeps the profiles listed)",
                f"Set {CYCLE_PROFILE_ENV}=<functions> too, or unset {CYCLE_PROFILE_DIR_ENV}.")
    if (folder := os.environ.get(CYCLE_PROFILE_DIR_ENV)) and not (os.path.isdir(folder) and os.access(folder, os.W_OK)):
        _refuse(f"{CYCLE_PROFILE_DIR_ENV}={folder!r} (not a writable folder)", "Create the folder first, or unset it.")
    if os.environ.get(PLAIN_OFF_ENV, "0") not in ("0", "1"):
        _refuse(f"{PLAIN_OFF_ENV}={os.environ[PLAIN_OFF_ENV]!r}", "Give 1 (steps 0 must be a plain decode step) or 0 "
                "(SGLang's verify at steps 0), or unset it (a plain decode step wherever it can run).")
    if plain_off() and not sa.speculative_adaptive:
        _refuse(f"{PLAIN_OFF_ENV}=1 without --speculative-adaptive (it changes adaptive steps 0)",
                f"Add --speculative-adaptive with 0 among the candidate steps, or unset {PLAIN_OFF_ENV}.")
    if plain_off() and sa.tp_size > 1:
        _refuse(f"{PLAIN_OFF_ENV}=1 with --tp {sa.tp_size} (its sampler's agreement across ranks is untested)",
                f"Use --tp 1, or unset {PLAIN_OFF_ENV}.")
    if os.environ.get(OFF_NONSPEC_ENV, "0") not in ("0", "1"):
        _refuse(f"{OFF_NONSPEC_ENV}={os.environ[OFF_NONSPEC_ENV]!r}", "Give 1 (held steps 0 must run as SGLang's "
                "non-speculative decode) or 0 (the plain step on the speculative path), or unset it (wherever it can "
                "run).")
    if off_nonspec() and (why := off_nonspec_unserved(sa)) is not None:
        _refuse(f"{OFF_NONSPEC_ENV}=1 with {why[0]}", f"{why[1]}, or unset {OFF_NONSPEC_ENV}.")
    if os.environ.get(LEAN_DRAFT_ENV, "0") not in ("0", "1"):
        _refuse(f"{LEAN_DRAFT_ENV}={os.environ[LEAN_DRAFT_ENV]!r}", "Give 1 (the draft phase must run without "
                "SGLang's prepare_for_draft and draft graphs) or 0 (SGLang's draft phase), or unset it (the lean "
                "draft phase wherever it can run).")
    if lean_draft() and (why := lean_draft_unserved(sa)) is not None:
        _refuse(f"{LEAN_DRAFT_ENV}=1 with {why[0]}", f"{why[1]}, or unset {LEAN_DRAFT_ENV}.")
    if os.environ.get(LEAN_EXTEND_ENV, "0") not in ("0", "1"):
        _refuse(f"{LEAN_EXTEND_ENV}={os.environ[LEAN_EXTEND_ENV]!r}", "Give 1 (the lean draft extend, required) or 0 "
                "(SGLang's draft extend), or unset it (the lean draft extend wherever it can run).")
    if lean_extend_mode() == "on" and (why := lean_extend_unserved(sa)) is not None:
        _refuse(f"{LEAN_EXTEND_ENV}=1 with {why[0]}", f"{why[1]}, or unset {LEAN_EXTEND_ENV}.")
    if os.environ.get(VERIFY_IN_GRAPH_ENV, "0") not in ("0", "1"):
        _refuse(f"{VERIFY_IN_GRAPH_ENV}={os.environ[VERIFY_IN_GRAPH_ENV]!r}", "Give 1 (greedy chains verified inside "
                "the target's CUDA graphs) or 0 (after them), or unset it (inside them wherever they can).")
    if verify_in_graph_mode() == "on" and (why := verify_in_graph_unserved(sa)) is not None:
        _refuse(f"{VERIFY_IN_GRAPH_ENV}=1 with {why[0]}", f"{why[1]}, or unset {VERIFY_IN_GRAPH_ENV}.")
    if os.environ.get(DRAFT_CHECK_ENV) and not sa.disable_cuda_graph:
        _refuse(f"{DRAFT_CHECK_ENV} with CUDA graphs (the check syncs with the host)", "Add --disable-cuda-graph.")
    if getattr(sa, "enable_fp32_lm_head", False):
        _refuse("--enable-fp32-lm-head yet (the fused drafter's LM head computes bf16 logits)", "Drop the flag.")
    if sa.kv_cache_dtype not in KV_CACHE_DTYPES:
        _refuse(f"--kv-cache-dtype {sa.kv_cache_dtype} yet (the draft attention reads 16-bit and FP8 pools)",
                f"Use --kv-cache-dtype {', '.join(KV_CACHE_DTYPES)}.")


def _count_env(name: str) -> int | None:
    """Environment variable ``name`` as a whole number > 0 (0 when unset; None when set to anything else)."""
    value = os.environ.get(name, "")
    if not value:
        return 0
    return int(value) if value.isdecimal() and value.isascii() and int(value) > 0 else None


def cycle_timing_every() -> int | None:
    """:data:`CYCLE_TIMING_ENV` as a number of decode steps (0 when unset; None when not a whole number > 0)."""
    return _count_env(CYCLE_TIMING_ENV)


def cycle_timing_scope() -> str | None:
    """:data:`CYCLE_TIMING_SCOPE_ENV`: what the cycle timing times (one of :data:`CYCLE_TIMING_SCOPES`; ``all`` when
    unset; None when not one)."""
    value = os.environ.get(CYCLE_TIMING_SCOPE_ENV) or "all"
    return value if value in CYCLE_TIMING_SCOPES else None


def ab_feature() -> str | None:
    """:data:`AB_FEATURE_ENV`: the feature an A/B inside one server alternates (a key of :data:`AB_ARMS`;
    ``verify_in_graph`` when unset; None when not one)."""
    value = os.environ.get(AB_FEATURE_ENV) or "verify_in_graph"
    return value if value in AB_ARMS else None


def ab_steps() -> int | None:
    """:data:`AB_STEPS_ENV` as a number of decode steps per arm (0 when unset; None when not a whole number > 0)."""
    return _count_env(AB_STEPS_ENV)


def cycle_profile_top() -> int | None:
    """:data:`CYCLE_PROFILE_ENV` as a number of functions to list (0 when unset; None when not a whole number > 0)."""
    return _count_env(CYCLE_PROFILE_ENV)


def plain_off_mode() -> str:
    """:data:`PLAIN_OFF_ENV` as ``"auto"`` (unset: adaptive steps 0 as a plain decode step wherever it can run),
    ``"on"`` (``1``: required) or ``"off"`` (``0``: SGLang's verify); values the start-up refused read as ``"off"``."""
    return PLAIN_OFF_MODES.get(os.environ.get(PLAIN_OFF_ENV), "off")


def plain_off() -> bool:
    """Whether :data:`PLAIN_OFF_ENV` requires adaptive steps 0 as a plain decode step (``1``)."""
    return plain_off_mode() == "on"


def off_nonspec_mode() -> str:
    """:data:`OFF_NONSPEC_ENV` as ``"auto"`` (unset: held steps 0 as SGLang's non-speculative decode wherever it can
    run), ``"on"`` (``1``: required) or ``"off"`` (``0``: the plain step on the speculative path); values the start-up
    refused read as ``"off"``."""
    return OFF_NONSPEC_MODES.get(os.environ.get(OFF_NONSPEC_ENV), "off")


def off_nonspec() -> bool:
    """Whether :data:`OFF_NONSPEC_ENV` requires held steps 0 as SGLang's non-speculative decode (``1``)."""
    return off_nonspec_mode() == "on"


def off_nonspec_unserved(sa) -> tuple[str, str] | None:
    """Why held steps 0 cannot run as SGLang's non-speculative decode with server args ``sa`` (what, what to change),
    None if it can (the worker checks SGLang's touchpoints at start)."""
    sa = glue_args.settings(sa)
    if not sa.speculative_adaptive:
        return ("no --speculative-adaptive (the route holds adaptive steps 0)",
                "Add --speculative-adaptive with 0 among the candidate steps")
    if plain_off_mode() == "off":
        return f"{PLAIN_OFF_ENV}=0 (the non-speculative step is the plain step)", f"Unset {PLAIN_OFF_ENV}"
    if sa.tp_size > 1 or getattr(sa, "dp_size", 1) > 1:
        return (f"--tp {sa.tp_size} --dp {getattr(sa, 'dp_size', 1)} (the route is tested on one GPU)",
                "Serve one GPU")
    if getattr(sa, "disable_overlap_schedule", False):
        return ("--disable-overlap-schedule (the route is written for the overlap scheduler's relay)",
                "Remove --disable-overlap-schedule")
    if (sa.page_size or 1) > 1:
        return (f"--page-size {sa.page_size} (turning a batch frees its reservation token by token)",
                "Use --page-size 1")
    if getattr(sa, "enable_hisparse", False):
        return ("--enable-hisparse (its decode preparation maps the step's slot elsewhere; the held step writes "
                "the slot SGLang's preparation allocated)", "Remove --enable-hisparse")
    return None


def lean_draft_mode() -> str:
    """:data:`LEAN_DRAFT_ENV` as ``"auto"`` (unset: the lean draft phase wherever it can run), ``"on"`` (``1``:
    required) or ``"off"`` (``0``: SGLang's draft phase); values the start-up refused read as ``"off"``."""
    return LEAN_DRAFT_MODES.get(os.environ.get(LEAN_DRAFT_ENV), "off")


def lean_draft() -> bool:
    """Whether :data:`LEAN_DRAFT_ENV` requires the lean draft phase (``1``)."""
    return lean_draft_mode() == "on"


def lean_draft_unserved(sa) -> tuple[str, str] | None:
    """Why the server args ``sa`` rule the lean draft phase out, as ``(what, what to change)``; None where they do
    not (SGLang's own touchpoints are checked when the worker starts it: ``EagleTritonWorkerV2.start_lean_draft``)."""
    sa = glue_args.settings(sa)
    if sa.tp_size > 1:
        return (f"--tp {sa.tp_size} (its drafter graphs under tensor parallelism are untested)", "Use --tp 1")
    if os.environ.get(DRAFT_CHECK_ENV):
        return f"{DRAFT_CHECK_ENV} (the check runs SGLang's draft beside ours)", f"Unset {DRAFT_CHECK_ENV}"
    if (sa.page_size or 1) > 1 and (sa.speculative_eagle_topk or 1) > 1:
        return (f"--page-size {sa.page_size} and --speculative-eagle-topk {sa.speculative_eagle_topk} (SGLang's "
                "draft preparation copies each branch's prefix tail there)",
                "Use --page-size 1 or --speculative-eagle-topk 1")
    return None


def lean_extend_mode() -> str:
    """:data:`LEAN_EXTEND_ENV` as ``"auto"`` (unset: the lean draft extend wherever it can run), ``"on"`` (``1``:
    required) or ``"off"`` (``0``, and values the start-up refused)."""
    return LEAN_EXTEND_MODES.get(os.environ.get(LEAN_EXTEND_ENV), "off")


def lean_extend_unserved(sa) -> tuple[str, str] | None:
    """Why the server args ``sa`` rule the lean draft extend out, as ``(what, what to change)``; None where they do
    not (the draft model's own hooks are checked by the worker: ``EagleTritonWorkerV2.start_lean_extend``)."""
    sa = glue_args.settings(sa)
    if (version := versions.installed()) not in versions.GPU_TESTED:
        return (f"SGLang {version} (the lean extend is read against SGLang's extend of {', '.join(versions.GPU_TESTED)}"
                " only, the release GPU runs serve; 0.5.23's plans its KV window in the draft phase)",
                f"Use SGLang {versions.GPU_TESTED[-1]}")
    if sa.tp_size > 1:
        return f"--tp {sa.tp_size} (its graphs under tensor parallelism are untested)", "Use --tp 1"
    if (sa.speculative_eagle_topk or 1) > 1:
        return (f"--speculative-eagle-topk {sa.speculative_eagle_topk} (it extends chains only: a tree's verified "
                "rows are not one request's consecutive positions)", "Use --speculative-eagle-topk 1")
    if getattr(sa, "disable_overlap_schedule", False):
        return ("--disable-overlap-schedule (its outputs are graph buffers the overlap scheduler's relay copies in "
                "the same step)", "Remove --disable-overlap-schedule")
    return None


def verify_in_graph_mode() -> str:
    """:data:`VERIFY_IN_GRAPH_ENV` as ``"auto"`` (unset: greedy chains verified inside the target's verify graphs
    wherever they can be), ``"on"`` (``1``: required) or ``"off"`` (``0``, and values the start-up refused)."""
    return VERIFY_IN_GRAPH_MODES.get(os.environ.get(VERIFY_IN_GRAPH_ENV), "off")


def verify_in_graph_unserved(sa) -> tuple[str, str] | None:
    """Why the server args ``sa`` rule the greedy verify inside the target's graphs out, as ``(what, what to
    change)``; None where they do not (SGLang's touchpoints and the graphs captured are checked by the worker:
    ``EagleTritonWorkerV2.start_verify_in_graph``)."""
    sa = glue_args.settings(sa)
    if sa.tp_size > 1:
        return f"--tp {sa.tp_size} (untested under tensor parallelism)", "Use --tp 1"
    if sa.disable_cuda_graph:
        return "--disable-cuda-graph (it runs inside CUDA graphs)", "Remove --disable-cuda-graph"
    if (sa.speculative_eagle_topk or 1) > 1:
        return (f"--speculative-eagle-topk {sa.speculative_eagle_topk} (it verifies chains only: topk 1)",
                "Use --speculative-eagle-topk 1")
    return None


def verify_attention_mode() -> str:
    """:data:`VERIFY_ATTENTION_ENV`'s value, ``"auto"`` when unset (one of :data:`VERIFY_ATTENTION_MODES` once the
    server started)."""
    return os.environ.get(VERIFY_ATTENTION_ENV, "auto")


def verify_attention_unserved(page_size: int | None, kv_cache_dtype) -> str | None:
    """Why our verify-attention kernel cannot serve a KV pool of ``page_size`` and ``kv_cache_dtype``, None if it can:
    the command line's ``--kv-cache-dtype`` name (``"auto"`` passes; SGLang may still resolve it to FP8 for an FP8
    checkpoint) or the torch dtype the model runner resolved it to. The backend itself is checked where SGLang
    builds it (plugin.verify_attention_backend); head dims per layer (verify.TreeVerifyAttention)."""
    if (page_size or 1) > 1:
        return f"--page-size {page_size} (the kernel reads page-1 pools)"
    if isinstance(kv_cache_dtype, str):
        if kv_cache_dtype not in ("auto", "bf16", "bfloat16"):
            return f"--kv-cache-dtype {kv_cache_dtype} (the kernel reads 16-bit pools)"
    elif str(kv_cache_dtype) not in ("torch.bfloat16", "torch.float16"):
        return f"a {str(kv_cache_dtype).removeprefix('torch.')} KV pool (the kernel reads 16-bit pools)"
    return None


def verify_attention_wanted(page_size: int | None, kv_cache_dtype) -> bool:
    """Whether the target's triton backend should attend its verify through our kernel (arguments as
    :func:`verify_attention_unserved`'s)."""
    return verify_attention_mode() != "0" and verify_attention_unserved(page_size, kv_cache_dtype) is None


def _check_verify_attention(sa) -> None:
    """The mode is one we know; under ``"1"`` a server where our kernel would not run at all is refused rather than
    let it pretend; the retired trial variable names its successor."""
    retired = [name for name in RETIRED_VERIFY_ATTENTION_ENVS if name in os.environ]
    if retired:
        _refuse(f"{retired[0]} any more (our verify attention is the default on the triton backend)",
                f"Unset it; set {VERIFY_ATTENTION_ENV}=1 to require our kernel, or =0 for SGLang's.")
    mode = verify_attention_mode()
    if mode not in VERIFY_ATTENTION_MODES:
        _refuse(f"{VERIFY_ATTENTION_ENV}={mode!r}", f"Use one of {', '.join(VERIFY_ATTENTION_MODES)}, or unset it.")
    if mode != "1":
        return
    backends = _attention_backends(sa)
    if backends != {"triton"}:
        _refuse(f"{VERIFY_ATTENTION_ENV}=1 with the {', '.join(sorted(backends)) or 'default'} attention backend "
                "(the kernel replaces the triton backend's verify attention)",
                f"Use --attention-backend triton, or unset {VERIFY_ATTENTION_ENV}.")
    unserved = verify_attention_unserved(sa.page_size, sa.kv_cache_dtype)
    if unserved is not None:
        _refuse(f"{VERIFY_ATTENTION_ENV}=1 with {unserved}", f"Change that, or unset {VERIFY_ATTENTION_ENV}.")


def _check_rocm(sa) -> None:
    """On a ROCm build of torch: only :data:`ROCM_ATTENTION_BACKENDS` and 16-bit KV pools (SGLang's default backend,
    none named, is aiter there)."""
    import torch

    if not torch.version.hip:
        return
    others = sorted(_attention_backends(sa) - set(ROCM_ATTENTION_BACKENDS))
    if others:
        _refuse(f"the {', '.join(others)} attention backend{'s' if len(others) > 1 else ''} on ROCm (AMD GPUs)",
                f"Use --attention-backend {' or '.join(ROCM_ATTENTION_BACKENDS)} (our verify attention runs on "
                "triton), or leave it unset (aiter).")
    if sa.kv_cache_dtype not in ROCM_KV_CACHE_DTYPES:
        _refuse(f"--kv-cache-dtype {sa.kv_cache_dtype} on ROCm (AMD GPUs; the draft attention reads e4m3fn / e5m2 "
                "FP8 pools, an MI300X's are e4m3fnuz)", "Use --kv-cache-dtype auto or bf16.")


def _attention_backends(sa) -> set:
    """The attention backends named on the command line (empty: SGLang's default)."""
    return {sa.attention_backend, sa.decode_attention_backend, sa.prefill_attention_backend} - {None}


def _check_topk_backend(sa, topk: int) -> set:
    """The attention backends in use (returned); topk > 1 is refused on trtllm_mha."""
    backends = _attention_backends(sa)
    if topk > 1 and "trtllm_mha" in backends:
        _refuse("--speculative-eagle-topk > 1 with --attention-backend trtllm_mha",
                "Use --speculative-eagle-topk 1 or another backend.")
    return backends


def _check_tree(steps: int, topk: int, n: int, source: str = "") -> None:
    """A tree of ``n`` draft tokens is buildable from ``steps`` levels of ``topk`` (``source``: where n came from,
    when not the flag)."""
    max_nodes = 1 + topk + (steps - 1) * topk * topk
    if not 2 <= n <= min(max_nodes, MAX_DRAFT_TOKENS):
        _refuse(
            f"--speculative-num-draft-tokens {n} with steps={steps}, topk={topk}{source}",
            f"Use 2 <= draft tokens <= min(1 + topk + (steps-1)*topk^2, {MAX_DRAFT_TOKENS}) = "
            f"{min(max_nodes, MAX_DRAFT_TOKENS)}.",
        )


def _resolve_tree_shape(sa) -> None:
    """Fill (steps, topk, draft tokens) like SGLang's EAGLE, then check the tree is buildable."""
    steps, topk, n = sa.speculative_num_steps, sa.speculative_eagle_topk, sa.speculative_num_draft_tokens
    if steps is None:
        if topk is not None or n is not None:
            _refuse(
                "--speculative-eagle-topk / --speculative-num-draft-tokens without --speculative-num-steps",
                "Pass --speculative-num-steps too, or none of the three for the defaults.",
            )
        llama = _architecture(sa.model_path, sa.trust_remote_code) == "LlamaForCausalLM"
        steps, topk, n = (5, 4, 8) if llama else (3, 1, 4)
    topk = 1 if topk is None else topk
    if topk == 1 and n != steps + 1:
        if n is not None:
            logger.warning("EAGLE_TRITON: speculative_num_draft_tokens is set to num_steps + 1 = %d for topk 1",
                           steps + 1)
        n = steps + 1
    if n is None:
        _refuse("--speculative-eagle-topk > 1 without --speculative-num-draft-tokens", "Pass the draft token count.")
    if steps < 1 or not 1 <= topk <= MAX_TOPK:
        _refuse(f"--speculative-num-steps {steps} with --speculative-eagle-topk {topk}",
                f"Use steps >= 1 and 1 <= topk <= {MAX_TOPK}.")
    _check_tree(steps, topk, n)
    backends = _check_topk_backend(sa, topk)
    paged_off = sorted(backends - set(PAGED_TREE_BACKENDS))
    if topk > 1 and (sa.page_size or 1) > 1 and paged_off:
        _refuse(f"--speculative-eagle-topk {topk} with --page-size {sa.page_size} on the {', '.join(paged_off)} "
                "attention backend",
                f"SGLang runs topk > 1 with page size > 1 only on {', '.join(PAGED_TREE_BACKENDS)}: use one of those, "
                "--page-size 1 or --speculative-eagle-topk 1.")
    sa.speculative_num_steps, sa.speculative_eagle_topk, sa.speculative_num_draft_tokens = steps, topk, n


def shared_logits_rows(rows: int, model_runner, *args, **kwargs) -> int:
    """After-hook on SGLang's ``ModelRunner.max_decode_logits_rows``: under ``--speculative-adaptive`` the target's
    logits buffer shared by its CUDA graphs holds the widest candidate's verify tree.

    SGLang 0.5.17 / 0.5.18 size it for the initial step count (max graph batch x its draft tokens; 0.5.19+ for every
    chain candidate, not our trees), so capturing a larger candidate's verify graph fails an assertion at start
    (stock EAGLE3 too, e.g. the default brackets from their middle candidate 3 with ``--cuda-graph-max-bs 16``:
    "holds 64 rows but caller needs 128").
    """
    sa = glue_args.settings(model_runner.server_args)
    if (not is_ours(sa) or not sa.speculative_adaptive
            or model_runner.is_draft_worker or rows <= 0):
        return rows
    per_req = model_runner.decode_num_tokens_per_req()
    return max(rows, rows // per_req * glue_args.max_draft_tokens(model_runner.server_args))


def _resolve_adaptive_trees(sa) -> None:
    """Tree candidates' topk and draft tokens from the config file, once, into :data:`ADAPTIVE_TREES_ENV` (every
    process of the server inherits it: :func:`adaptive_tree`); the initial state's draft tokens; and the per-request
    KV and buffer rows of the widest candidate (:func:`adaptive_max_draft_tokens`: SGLang's
    ``get_alloc_len_per_decode`` takes the initial step count's steps * topk and that), which SGLang up to 0.5.18
    reads from the server args and later releases ask the algorithm for (``EagleTritonSpecAlgo``)."""
    trees = _trees_from_config(sa)
    os.environ[ADAPTIVE_TREES_ENV] = json.dumps(trees)
    sa.speculative_num_draft_tokens = trees[str(sa.speculative_num_steps)][1]
    topk = sa.speculative_eagle_topk
    glue_args.set_max_draft_tokens(sa, max(max(int(s) * topk, n) for s, (_, n) in trees.items()))


def handle_server_args(sa) -> None:
    """Validate, fill defaults and export the draft kind; mutates ``sa`` in place. Under ``--speculative-adaptive``
    SGLang has already set the initial steps (a candidate), topk 1 unless given, and draft tokens = steps + 1 (for
    tree candidates replaced here by the config file's)."""
    sa = glue_args.resolving(sa)
    _validate(sa)
    if _adaptive_requested and not sa.speculative_adaptive:
        _refuse("--speculative-adaptive here: SGLang switched it off (its warning says why; is sgl-eagle-triton's "
                "hook on SGLang's adaptive_unsupported_reason loaded?)", "Drop --speculative-adaptive.")
    os.environ[DRAFT_KIND_ENV] = resolve_draft_kind(sa.speculative_draft_model_path, sa.trust_remote_code)
    _check_fused_drafter(sa)  # first: what no setting makes work (e.g. heads that --tp does not divide)
    _check_tensor_parallel_trial(sa, os.environ[DRAFT_KIND_ENV])
    if not sa.speculative_adaptive:
        _resolve_tree_shape(sa)
    elif sa.speculative_num_steps == 0:  # the initial state is the worker's own: built drafting, never as steps 0
        _refuse("--speculative-adaptive starting at steps 0 (--speculative-num-steps 0, or a config file whose "
                "candidate_steps are [0] alone: SGLang starts at the middle candidate)",
                "Start at a drafting candidate: pass --speculative-num-steps N > 0 from candidate_steps (the policy "
                "reaches steps 0 by itself).")
    elif (sa.speculative_eagle_topk or 1) > 1:  # tree candidates: SGLang set draft tokens = steps + 1 (chains)
        _resolve_adaptive_trees(sa)
    if sa.max_running_requests is None:
        sa.max_running_requests = 48
    if sa.enable_mixed_chunk:
        logger.warning("EAGLE_TRITON: mixed chunked prefill is disabled under speculative decoding")
        sa.enable_mixed_chunk = False


def req_to_token_headroom(extra: int, server_args=None, *args, **kwargs) -> int:
    """After-hook on SGLang's ``get_req_to_token_extra_context_len`` (of the server args up to 0.5.17, of the
    published settings later): an EAGLE_TRITON server's ``req_to_token`` rows hold the whole per-decode KV
    reservation, page size 1 included.

    SGLang (0.5.17 ... 0.5.23) widens the rows (``context_len + 4 + draft tokens``) to the reservation
    (``2 * max(topk * steps, draft tokens)`` past the committed length, ``eagle_prepare_for_decode``) only when
    ``page_size > 1``. With page size 1 the reservation outgrows the row whenever it exceeds the headroom plus the
    few tokens a decoding request stays below the context (e.g. the default 5 / 4 / 8: 40 against 12): a
    request near the context limit gets slots assigned past its row's end, which land in the next request's row
    (overwriting its first KV indices; past the tensor for the last row) and are never freed (up to 25 per
    request at 5 / 4 / 8; ~130 in the load test, until the idle leak check stops the scheduler). A row of
    ``context_len + reservation`` holds any allocation, since the committed length never exceeds the context.
    """
    if server_args is None:
        spec, page_size = glue_args.published_spec(), glue_args.published_page_size()
    else:
        spec = server_args = glue_args.settings(server_args)
        page_size = server_args.page_size
    if not is_ours(spec):
        return extra
    return max(extra, glue_args.alloc_reserve_per_decode(server_args) + page_size - 1)


def check_req_to_token_rows(row_width: int, context_len: int, server_args) -> None:
    """At worker start: the pool's rows really hold the reservation (fails if the hook above was not applied,
    e.g. a pool built by a path that sizes its rows itself)."""
    need = context_len + glue_args.alloc_reserve_per_decode(server_args)
    if row_width < need:
        raise RuntimeError(
            f"EAGLE_TRITON: req_to_token rows hold {row_width} tokens, but a request near the context limit "
            f"({context_len}) reserves up to {need}; the plugin's hook on SGLang's "
            "get_req_to_token_extra_context_len was not applied in this process (is sgl-eagle-triton loaded through "
            "SGLang's plugins?)."
        )
