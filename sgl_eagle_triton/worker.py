"""EAGLE_TRITON's workers: thin subclasses of SGLang's EAGLE V2 workers.

SGLang's decode cycle stays SGLang's (scheduler, overlap, CUDA graphs, draft forward, draft
extend, target verify forward). Its tree building and token selection are ours, swapped in only
while our workers call into SGLang so that nothing else in the process changes:

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

from sglang.srt.speculative import eagle_utils, eagle_worker_common, eagle_worker_v2
from sglang.srt.speculative.eagle_worker_v2 import EagleDraftWorker, EAGLEWorkerV2

from sgl_eagle_triton import ALGORITHM_NAME, config, verify
from sgl_eagle_triton.kernels.build_tree import build_tree_kernel_efficient
from sgl_eagle_triton.verify import logged_once

logger = logging.getLogger(__name__)

KERNELS_IN_USE = {
    "draft forward": "SGLang (stock)",
    "build tree": "triton sgl_eagle_triton.kernels.build_tree",
    "verify greedy": "triton sgl_eagle_triton.kernels.verify_greedy",
    "verify sampling": "triton sgl_eagle_triton.kernels.target_probs + tree_sampling",
}


# SGLang names this worker rebinds or relies on: checked when the worker is built, so that an SGLang
# whose EAGLE internals moved fails at server start rather than at the first decode.
_SGLANG_NAMES = (
    (eagle_worker_v2, "EagleDraftWorker"),
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


class TritonEagleDraftWorker(EagleDraftWorker):
    """SGLang's EAGLE draft worker; the verify tree it hands over is built by our Triton kernel."""

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
