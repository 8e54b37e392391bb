"""EAGLE_TRITON's workers: thin subclasses of SGLang's EAGLE V2 workers.

SGLang's decode cycle stays SGLang's (scheduler, overlap, CUDA graphs, draft extend, target verify
forward). The draft, its tree building and token selection are ours:

- the draft: :meth:`TritonEagleDraftWorker.draft_forward` (the method SGLang's draft CUDA-graph
  runner captures) runs :class:`sgl_eagle_triton.drafter.FusedDrafter`, bound to the draft model's
  weights and KV pool when SGLang allocates the pool;

swapped in only while our workers call into SGLang, so that nothing else in the process changes:

- tree building: ``eagle_worker_common.build_tree_kernel_efficient`` during
  :meth:`TritonEagleDraftWorker.draft` -> :mod:`sgl_eagle_triton.kernels.build_tree`;
- verification, during :meth:`EagleTritonWorkerV2.verify`: ``eagle_worker_common.eagle_sample``
  -> :func:`sgl_eagle_triton.verify.eagle_sample` (sampled batches: Triton target probabilities and
  tree speculative sampling), and ``eagle_utils.verify_tree_greedy_func`` (greedy batches) ->
  :mod:`sgl_eagle_triton.kernels.verify_greedy`.
"""

from __future__ import annotations

import logging
from contextlib import contextmanager

import torch
from sglang.srt.speculative import eagle_utils, eagle_worker_common, eagle_worker_v2
from sglang.srt.speculative.eagle_worker_v2 import EagleDraftWorker, EAGLEWorkerV2

from sgl_eagle_triton import ALGORITHM_NAME, config, draft_check, verify
from sgl_eagle_triton.drafter import FusedDrafter, draft_weights
from sgl_eagle_triton.kernels.build_tree import build_tree_kernel_efficient
from sgl_eagle_triton.kernels.linear import CUBLAS_MIN_ROWS
from sgl_eagle_triton.verify import logged_once

logger = logging.getLogger(__name__)

KERNELS_IN_USE = {
    "draft forward": "triton sgl_eagle_triton.drafter (draft_input, linear, draft_attention, lm_head_topk, "
    f"draft_select, draft_organize); from {CUBLAS_MIN_ROWS} rows per forward (batch x topk) on, the linears' and "
    "the LM head's GEMMs are cuBLAS between Triton rms_norm and Triton epilogue / top-k kernels",
    "build tree": "triton sgl_eagle_triton.kernels.build_tree",
    "verify greedy": "triton sgl_eagle_triton.kernels.verify_greedy",
    "verify sampling": "triton sgl_eagle_triton.kernels.target_probs + tree_sampling",
}


# SGLang names this worker rebinds or relies on: checked when the worker is built, so that an SGLang
# whose EAGLE internals moved fails at server start rather than at the first decode.
_SGLANG_NAMES = (
    (eagle_worker_v2, "EagleDraftWorker"),
    (eagle_worker_v2, "organize_draft_results"),
    (eagle_worker_common, "build_tree_kernel_efficient"),
    (eagle_worker_common, "eagle_sample"),
    (eagle_utils, "verify_tree_greedy_func"),
    (eagle_utils, "eagle_sample"),
    (eagle_utils, "_verify_coins"),
)


@contextmanager
def _swapped(module, name: str, replacement):
    """Rebind ``module.name`` for the duration of the block; fails loudly if SGLang moved it."""
    original = getattr(module, name)
    setattr(module, name, replacement)
    try:
        yield
    finally:
        setattr(module, name, original)


_build_tree = logged_once(build_tree_kernel_efficient, "triton build_tree")
_fused_draft = logged_once(FusedDrafter.draft, "triton fused drafter")


class TritonEagleDraftWorker(EagleDraftWorker):
    """SGLang's EAGLE draft worker with our fused draft forward; the verify tree it hands over is built
    by our Triton kernel."""

    def alloc_memory_pool(self, *args, **kwargs):
        super().alloc_memory_pool(*args, **kwargs)
        config.check_req_to_token_rows(self.req_to_token_pool.req_to_token.shape[1],
                                       self.target_worker.model_config.context_len, self.server_args)
        weights = draft_weights(self.draft_runner.model, self.hot_token_id)
        pool = self.draft_runner.token_to_kv_pool
        layer_id = self.draft_runner.model.model.layers[0].self_attn.attn.layer_id
        self.fused_drafter = FusedDrafter(
            weights,
            self.topk,
            self.speculative_num_steps,
            self.speculative_num_draft_tokens,
            pool.get_key_buffer(layer_id),
            pool.get_value_buffer(layer_id),
            self.req_to_token_pool.req_to_token,
        )

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
        organize = eagle_worker_v2.organize_draft_results

        def capturing(score_list, *args):
            captured.append(torch.cat(score_list, dim=1).flatten(1))
            return organize(score_list, *args)

        with _swapped(eagle_worker_v2, "organize_draft_results", capturing):
            stock = super().draft_forward(forward_batch)
        draft_check.record(check_file, tree, stock, captured[0] if captured else None, self.topk)

    def draft(self, batch, *args, **kwargs):
        with _swapped(eagle_worker_common, "build_tree_kernel_efficient", _build_tree):
            return super().draft(batch, *args, **kwargs)


class EagleTritonWorkerV2(EAGLEWorkerV2):
    """SGLang's EAGLE V2 worker with our draft worker and our tree verification (greedy and sampled)."""

    def __init__(self, *args, **kwargs):
        missing = [f"{module.__name__}.{name}" for module, name in _SGLANG_NAMES if not hasattr(module, name)]
        if missing:
            raise RuntimeError(f"{ALGORITHM_NAME} is built against SGLang 0.5.17; this SGLang lacks {missing}")
        with _swapped(eagle_worker_v2, "EagleDraftWorker", TritonEagleDraftWorker):
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

    def verify(self, batch, *args, **kwargs):
        with (
            _swapped(eagle_utils, "verify_tree_greedy_func", verify.verify_tree_greedy_func),
            _swapped(eagle_worker_common, "eagle_sample", verify.eagle_sample),
        ):
            return super().verify(batch, *args, **kwargs)
