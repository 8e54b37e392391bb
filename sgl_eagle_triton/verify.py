"""The verify step's token selection: SGLang 0.5.17's ``eagle_sample`` on our Triton kernels.

Greedy batches run SGLang's own ``eagle_sample`` (argmax, then ``verify_tree_greedy_func``, which
the worker points at our greedy kernel). Batches with any sampled request (mixed batches included:
SGLang rewrites greedy requests to ``T=1, top_k=1``, whose target distribution is one-hot) take
the path below, which differs from stock in three ways:

- target probabilities come from one fused Triton kernel (temperature, softmax, top-k, top-p,
  min-p) with the joint semantics of SGLang's non-speculative samplers (the pytorch backend; the
  flashinfer backend when min-p is off); stock applies top-p after a top-k renormalisation and
  ignores min-p, so its sampled output is not distributed like no-spec;
- the tree walk uses the strict acceptance test ``q > 0 and coin < acc`` (sgl-kernel 0.4.5's
  ``coin <= acc`` can accept a zero-probability token when the coin is 0.0);
- no dense ``[bs, n, vocab]`` draft-probability tensor is allocated and zeroed per step.

Logit pre-processing (NaN sanitising, penalties, logit bias, grammar mask) and the coins
(``torch.rand``, or seeded under deterministic inference) are SGLang's, in SGLang's order. So is the
benchmark-only simulated acceptance (``SGLANG_SIMULATE_ACC_LEN`` and its ``_METHOD`` / ``_TOKEN_MODE``): after
the walk, SGLang's ``generate_simulated_accept_index`` replaces what was accepted, on both paths, as stock.
"""

from __future__ import annotations

import logging
from collections import Counter

import torch
from sglang.srt.layers.attention.triton_backend import TritonAttnBackend
from sglang.srt.model_executor.forward_batch_info import ForwardMode
from sglang.srt.runtime_context import get_spec
from sglang.srt.sampling.penaltylib.repetition_penalty import apply_scaling_penalties
from sglang.srt.speculative import spec_utils
from sglang.srt.utils.async_probe import sanitize_nan_logits

from sgl_eagle_triton import ALGORITHM_NAME
from sgl_eagle_triton.glue import call_sites as glue
from sgl_eagle_triton.glue.hooks import global_tp_group
from sgl_eagle_triton.kernels.rounding import MODEL_DTYPES
from sgl_eagle_triton.kernels.target_probs import prepare_target_probs
from sgl_eagle_triton.kernels.tree_rows import start_up_chains, verify_outputs
from sgl_eagle_triton.kernels.tree_sampling import tree_speculative_sampling
from sgl_eagle_triton.kernels.verify_attention import MAX_HEAD_DIM, verify_attention
from sgl_eagle_triton.kernels.verify_greedy import verify_tree_greedy

logger = logging.getLogger(__name__)


RAN: Counter = Counter()
"""Calls of each :func:`witnessed` entry point in this process, by name (e.g. ``"triton build_tree"``): the
worker's first-step check and its ``/server_info`` report read it."""


def note_ran(what: str, where: str = "") -> None:
    """Count one call of ``what`` in ``RAN``, logging one line at its first in this process (``where`` it ran, if not
    where it was called): proof in the log that it ran."""
    if not RAN[what]:
        logger.info("%s: %s ran (%sfirst call in this process)", ALGORITHM_NAME, what, f"{where}; " if where else "")
    RAN[what] += 1


def count_ran(*whats: str) -> None:
    """:func:`note_ran` of each of ``whats`` in one call (a decode step's hot path: its counts after the first are
    plain dict updates)."""
    for what in whats:
        if RAN[what]:
            RAN[what] += 1
        else:
            note_ran(what)


def witnessed(fn, what: str):
    """``fn``, counting its calls in ``RAN[what]`` and logging one line at its first call (:func:`note_ran`)."""

    def wrapper(*args, **kwargs):
        note_ran(what)
        return fn(*args, **kwargs)

    return wrapper


VERIFY_GREEDY, VERIFY_SAMPLING = "triton verify_tree_greedy", "triton tree_speculative_sampling"
_verify_tree_greedy = witnessed(verify_tree_greedy, VERIFY_GREEDY)
_tree_speculative_sampling = witnessed(tree_speculative_sampling, VERIFY_SAMPLING)


def verify_tree_greedy_func(
    predicts,
    accept_index,
    accept_token_num,
    candidates,
    retrieve_index,
    retrieve_next_token,
    retrieve_next_sibling,
    target_predict,
    topk: int = -1,
):
    """``eagle_utils.verify_tree_greedy_func``'s signature (SGLang calls it with keywords) and return value, on our
    kernel."""
    outputs = predicts, accept_index, accept_token_num
    tree = candidates, retrieve_index, retrieve_next_token, retrieve_next_sibling
    _verify_tree_greedy(*outputs, *tree, target_predict)
    return outputs


def eagle_sample(verify_input, batch, logits_output, grammar_mask=None, uno_target_max_top_k=None, *,
                 watermark_state=None, watermark_full_mask=True):
    """Same arguments and results as ``sglang.srt.speculative.eagle_utils.eagle_sample``:
    ``(predict [bs * n] int32, accept_lens [bs] int32, accept_index [bs, steps + 1] int32)``. The keywords newer
    SGLang adds (0.5.20: UNO's top-k, another algorithm's; 0.5.22: a watermark, refused at start) go to SGLang's own
    greedy path when set; the sampled path serves them unset only. A keyword SGLang starts passing beyond these
    refuses the server at start (glue.check_glue matches this signature against SGLang's)."""
    extra = {}  # the new keywords SGLang set away from their defaults (an older SGLang's eagle_sample lacks them)
    if uno_target_max_top_k is not None:
        extra["uno_target_max_top_k"] = uno_target_max_top_k
    if watermark_state is not None:
        extra["watermark_state"] = watermark_state
    if watermark_full_mask is not True:
        extra["watermark_full_mask"] = watermark_full_mask
    info = batch.sampling_info
    if batch.forward_mode.is_idle() or info.is_all_greedy:
        return glue.sglang_eagle_sample()(verify_input, batch, logits_output, grammar_mask, **extra)
    if extra.get("uno_target_max_top_k") is not None or extra.get("watermark_state") is not None:
        raise RuntimeError(f"{ALGORITHM_NAME}: SGLang asked its sampled verify for {', '.join(extra)}, which it does "
                           "not serve (the server should have refused the flag at start)")

    bs, n = len(batch.seq_lens), verify_input.draft_token_num
    logits = logits_output.next_token_logits  # [bs * n, vocab] float32
    sanitize_nan_logits(logits, "verify: target model logits")
    if info.acc_additive_penalties is not None:
        logits.add_(torch.repeat_interleave(info.acc_additive_penalties, n, dim=0))
    if info.acc_scaling_penalties is not None:
        apply_scaling_penalties(logits, torch.repeat_interleave(info.acc_scaling_penalties, n, dim=0))
    if info.logit_bias is not None:
        logits.add_(torch.repeat_interleave(info.logit_bias, n, dim=0))
    if grammar_mask is not None:
        grammar_mask.apply(logits)

    # A strided view when SGLang trims a padded fp32 LM head (logits_processor's eager path).
    probs = prepare_target_probs(logits.contiguous(), info.temperatures, info.top_ks, info.top_ps, info.min_ps, n)
    candidates = verify_input.draft_token.reshape(bs, n)
    coins, final_coins = glue.verify_coins()(
        sampling_info=info, seq_lens=batch.seq_lens, draft_token_num=n, candidates=candidates, device=batch.device
    )
    predict = torch.zeros(bs * n, dtype=torch.int32, device=batch.device)
    accept_index = torch.full((bs, verify_input.max_tree_depth), -1, dtype=torch.int32, device=batch.device)
    num_correct_drafts = torch.empty(bs, dtype=torch.int32, device=batch.device)
    spec = get_spec()
    _tree_speculative_sampling(
        predict,
        accept_index,
        num_correct_drafts,
        candidates,
        verify_input.retrieve_index,
        verify_input.retrieve_next_token,
        verify_input.retrieve_next_sibling,
        coins,
        final_coins,
        probs.view(bs, n, -1),
        spec.speculative_accept_threshold_single,
        spec.speculative_accept_threshold_acc,
    )
    agree_with_rank_0(predict, accept_index, num_correct_drafts)
    if glue.sglang_simulates_acceptance():
        accept_index = simulate_acceptance(verify_input, logits, predict, num_correct_drafts, accept_index, candidates)
    return predict, num_correct_drafts + 1, accept_index


def compile_verify_kernels(shapes, vocab_size: int, device) -> None:
    """Greedy and sampled verification run on one and on two chains of each ``(draft tokens n, steps)`` in
    ``shapes``, so that Triton compiles them before serving. They run outside CUDA graphs, and Triton compiles a
    variant per tree shape at its first launch (``N`` and ``NUM_SPEC`` are compile-time constants; the batch size is
    not), and per alignment of the tree rows' pointers (one and two requests give both, ``start_up_chains``): else
    the first verify of each (an adaptive state's first use, the first sampled request) waits for the compiler,
    0.1-1 s and more while other processes compile. Inputs have serving's dtypes (SGLang's sampling parameters:
    temperatures, top-p, min-p float32, top-k int32), which are part of a variant's key."""
    for n, steps, requests, tree in start_up_chains(shapes, device):
        verify_tree_greedy(*verify_outputs(requests, n, steps, device), *tree,
                           torch.zeros(requests, n, dtype=torch.int64, device=device))
        ones = torch.ones(requests, dtype=torch.float32, device=device)
        top_ks = torch.full((requests,), 1 << 30, dtype=torch.int32, device=device)
        probs = prepare_target_probs(torch.zeros(requests * n, vocab_size, dtype=torch.float32, device=device),
                                     ones, top_ks, ones, torch.zeros_like(ones), n)
        tree_speculative_sampling(*verify_outputs(requests, n, steps, device), *tree,
                                  torch.rand(requests, n, device=device), torch.rand(requests, device=device),
                                  probs.view(requests, n, vocab_size))


def agree_with_rank_0(*tensors) -> None:
    """Under tensor parallelism, rank 0's sampled verification for every rank, as SGLang's ``eagle_sample`` does it
    (a broadcast of its predicts, accept index and accepted counts over the TP group): the ranks' target
    probabilities may differ in their last bits, and ranks that accepted differently would part (and hang in their
    next collective). Greedy verification needs none: every rank argmaxes the same all-gathered logits."""
    group = global_tp_group()  # None in a process without SGLang's parallel groups (one GPU, CPU tests)
    if group is not None and group.world_size > 1:
        for t in tensors:
            group.broadcast(t, src=0)


def simulate_acceptance(verify_input, logits, predict, num_correct_drafts, accept_index, candidates):
    """SGLang's simulated acceptance (``SGLANG_SIMULATE_ACC_LEN``, benchmarks only) applied as its
    ``eagle_sample`` applies it after the walk: ``predict`` and ``num_correct_drafts`` overwritten in place,
    the new ``accept_index`` returned."""
    mode = spec_utils.SIMULATE_ACC_TOKEN_MODE
    if mode not in ("fixed", "real-draft-token"):
        raise ValueError(f"Invalid SGLANG_SIMULATE_ACC_TOKEN_MODE {mode!r}; expected 'fixed' or 'real-draft-token'.")
    bs, n = candidates.shape
    target_predict = None
    if mode == "real-draft-token":
        if verify_input.tree_topk != 1:
            raise ValueError("SGLANG_SIMULATE_ACC_LEN with real draft tokens currently requires "
                             "speculative_eagle_topk=1.")
        target_predict = torch.argmax(logits, dim=-1).reshape(bs, n)
    return spec_utils.generate_simulated_accept_index(
        accept_index=accept_index, predict=predict, num_correct_drafts=num_correct_drafts, candidates=candidates,
        target_predict=target_predict, simulate_acc_len=spec_utils.SIMULATE_ACC_LEN,
        simulate_acc_token_mode=mode, bs=bs, spec_steps=verify_input.max_tree_depth - 1)


class _AsDecode:
    """A verify forward batch of one node per request seen as the decode batch it amounts to: mode DECODE, no
    speculative input, and every request's KV counting the token verified (its KV is written before attention). The
    host-side lengths (``seq_lens_cpu``, ``seq_lens_sum``) are counted when read: SGLang's Triton backend reads no
    ``seq_lens_cpu`` on its decode paths (a unified pool or a sliding window would), so a step makes no host tensor op
    for it (``seq_lens_sum``, an int, sizes the eager decode metadata)."""

    def __init__(self, forward_batch):
        self._batch = forward_batch
        self.forward_mode, self.spec_info = ForwardMode.DECODE, None
        self.seq_lens = forward_batch.seq_lens + 1

    @property
    def seq_lens_sum(self):
        total = self._batch.seq_lens_sum
        return None if total is None else total + self._batch.batch_size

    @property
    def seq_lens_cpu(self):
        lens_cpu = getattr(self._batch, "seq_lens_cpu", None)
        return None if lens_cpu is None else lens_cpu + 1

    def __getattr__(self, name):
        return getattr(self._batch, name)


def _as_decode(forward_batch):
    return _AsDecode(forward_batch) if forward_batch.forward_mode.is_target_verify() else forward_batch


class OneNodeVerifyAttention(TritonAttnBackend):
    """SGLang's Triton attention backend for the target of adaptive steps 0 ("off"), whose verify holds one node
    per request (the previous bonus token): that verify attends as a plain decode step (SGLang's split-KV decode
    kernel over the prefix and the token) instead of through the extend kernel with a tree mask, which measured
    9.6 ms of a 15.9 ms Llama-3.1-8B verify at batch 64 on an H100 (a plain decode step: 7.4 ms). Metadata for
    eager runs, CUDA-graph capture and replay are the decode ones, for the same reason."""

    def init_forward_metadata(self, forward_batch):
        super().init_forward_metadata(_as_decode(forward_batch))

    def init_forward_metadata_out_graph(self, forward_batch, in_capture: bool = False):
        super().init_forward_metadata_out_graph(_as_decode(forward_batch), in_capture)

    def forward_extend(self, q, k, v, layer, forward_batch, save_kv_cache=True, **kwargs):
        if forward_batch.forward_mode.is_target_verify():
            return self.forward_decode(q, k, v, layer, forward_batch, save_kv_cache, **kwargs)
        return super().forward_extend(q, k, v, layer, forward_batch, save_kv_cache, **kwargs)


def one_node_verify_attention(backend):
    """``backend`` attending as :class:`OneNodeVerifyAttention` if it is SGLang's Triton backend (its class swapped in
    place: only methods change), else ``backend`` unchanged (SGLang's verify attention)."""
    if type(backend) is TreeVerifyAttention:  # steps 0 attends as a decode step, not through our verify kernel
        backend.extend_attention_fwd = backend._sglang_extend_attention_fwd
        backend.__class__ = TritonAttnBackend
    if type(backend) is TritonAttnBackend:
        backend.__class__ = OneNodeVerifyAttention
    return backend


TREE_VERIFY_ATTENTION = "triton verify_attention"
_verify_attention = witnessed(verify_attention, TREE_VERIFY_ATTENTION)


class TreeVerifyAttention(TritonAttnBackend):
    """SGLang's Triton attention backend whose target verify attends through our grouped kernel
    (:mod:`sgl_eagle_triton.kernels.verify_attention`: one program per request, kv head and block of draft tokens x
    query heads) instead of SGLang's extend kernel (one program per request and query head, its 64-128 query rows
    mostly padding). Every other forward, and a verify the kernel does not serve (page size > 1, an FP8 or scaled
    pool, heads wider than MAX_HEAD_DIM, sliding window, sinks, score mods, MLA, context parallelism), is SGLang's.
    Both of SGLang's paths are covered: the two-stage ``extend_attention_fwd`` and, under
    ``--enable-deterministic-inference``, the unified kernel (which reads the draft tokens' K/V back from the pool;
    ours takes them as SGLang stored them). The default on the triton backend (config.VERIFY_ATTENTION_ENV: ``0``
    turns it off)."""

    _verify_layer = None  # the layer whose target verify is being computed (set around SGLang's forward_extend)
    _verify_kv = None  # and its draft tokens' own K / V, [T, Hkv, D] each

    def forward_extend(self, q, k, v, layer, forward_batch, save_kv_cache=True, **kwargs):
        if not (forward_batch.forward_mode.is_target_verify() and save_kv_cache and self._serves(layer, q, kwargs)):
            return super().forward_extend(q, k, v, layer, forward_batch, save_kv_cache, **kwargs)
        self._verify_layer = layer
        self._verify_kv = (k.view(-1, layer.tp_k_head_num, layer.qk_head_dim),
                           v.view(-1, layer.tp_v_head_num, layer.v_head_dim))
        try:
            return super().forward_extend(q, k, v, layer, forward_batch, save_kv_cache, **kwargs)
        finally:
            self._verify_layer = self._verify_kv = None

    def _serves(self, layer, q, kwargs) -> bool:
        pool = self.token_to_kv_pool.get_key_buffer(layer.layer_id)
        return (self.page_size == 1 and self.dcp_size == 1 and not self.use_mla and layer.k_scale is None
                and max(layer.qk_head_dim, layer.v_head_dim) <= MAX_HEAD_DIM
                and q.dtype in MODEL_DTYPES and pool.dtype == q.dtype
                and (layer.sliding_window_size is None or layer.sliding_window_size < 0)
                and kwargs.get("sinks") is None and kwargs.get("score_mod") is None
                and getattr(layer, "xai_temperature_len", -1) in (None, -1) and not layer.is_cross_attention)

    @torch.compiler.disable  # as SGLang's own kernels (under --enable-torch-compile nothing here is traced)
    def _verify(self, q, k_extend, v_extend, o, layer, logit_cap: float):
        meta = self.forward_metadata  # SGLang 0.5.17 always builds EAGLE a mask; without one the kernel is causal
        return _verify_attention(
            q.view(-1, layer.tp_q_head_num, layer.qk_head_dim), k_extend, v_extend,
            o.view(-1, layer.tp_q_head_num, layer.v_head_dim),
            self.token_to_kv_pool.get_key_buffer(layer.layer_id),
            self.token_to_kv_pool.get_value_buffer(layer.layer_id),
            meta.qo_indptr, meta.kv_indptr, meta.kv_indices, meta.custom_mask, meta.mask_indptr,
            meta.max_extend_len, layer.scaling, logit_cap=logit_cap,
            # split long prefixes of small batches up to SGLang's --triton-attention-num-kv-splits; never under
            # --enable-deterministic-inference (one pass: the same reduction order at every batch size)
            num_splits=1 if self.enable_deterministic else None, max_splits=self.max_kv_splits)

    def _extend_or_verify(self, q, k, v, o, k_buffer, v_buffer, qo_indptr, kv_indptr, kv_indices, custom_mask,
                          causal, mask_indptr, max_extend_len, *args, **kwargs):
        """Stands in for the instance's ``extend_attention_fwd`` (SGLang's two-stage path)."""
        layer = self._verify_layer
        if layer is None or (custom_mask is None and not causal):
            return self._sglang_extend_attention_fwd(q, k, v, o, k_buffer, v_buffer, qo_indptr, kv_indptr, kv_indices,
                                                     custom_mask, causal, mask_indptr, max_extend_len, *args, **kwargs)
        self._verify(q, k, v, o, layer, float(kwargs.get("logit_cap", 0.0) or 0.0))
        return o

    def _forward_extend_unified(self, q, o, layer, forward_batch, causal, logits_soft_cap, sinks, score_mod=None,
                                aux_tensors=None):
        if self._verify_layer is None or (self.forward_metadata.custom_mask is None and not causal):
            return super()._forward_extend_unified(q, o, layer, forward_batch, causal, logits_soft_cap, sinks,
                                                   score_mod=score_mod, aux_tensors=aux_tensors)
        self._verify(q, *self._verify_kv, o, layer, float(logits_soft_cap or 0.0))  # the K / V SGLang just stored
        return o


def tree_verify_attention(backend):
    """``backend`` attending as :class:`TreeVerifyAttention` if it is SGLang's Triton backend (its class swapped in
    place, its ``extend_attention_fwd`` wrapped), else ``backend`` unchanged."""
    if type(backend) is TritonAttnBackend:
        backend.__class__ = TreeVerifyAttention
        backend._sglang_extend_attention_fwd = backend.extend_attention_fwd
        backend.extend_attention_fwd = backend._extend_or_verify
    return backend
