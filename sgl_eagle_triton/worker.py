"""EAGLE_TRITON's workers: thin subclasses of SGLang's EAGLE V2 workers.

SGLang's decode cycle stays SGLang's (scheduler, overlap, CUDA graphs, draft forward, draft
extend, target verify forward). Two leaves are ours, swapped in only while our workers call into
SGLang so that nothing else in the process changes:

- tree building: ``eagle_worker_common.build_tree_kernel_efficient`` during
  :meth:`TritonEagleDraftWorker.draft` -> :mod:`sgl_eagle_triton.kernels.build_tree`;
- greedy verification: ``eagle_utils.verify_tree_greedy_func`` during
  :meth:`EagleTritonWorkerV2.verify` -> :mod:`sgl_eagle_triton.kernels.verify_greedy`.

Sampled (temperature > 0) verification still runs sgl-kernel's CUDA op; the start-up banner says so.
"""

from __future__ import annotations

import logging
from contextlib import contextmanager

from sglang.srt.speculative import eagle_utils, eagle_worker_common, eagle_worker_v2
from sglang.srt.speculative.eagle_worker_v2 import EagleDraftWorker, EAGLEWorkerV2

from sgl_eagle_triton import ALGORITHM_NAME, config
from sgl_eagle_triton.kernels.build_tree import build_tree_kernel_efficient
from sgl_eagle_triton.kernels.verify_greedy import verify_tree_greedy

logger = logging.getLogger(__name__)

KERNELS_IN_USE = {
    "draft forward": "SGLang (stock)",
    "build tree": "triton sgl_eagle_triton.kernels.build_tree",
    "verify greedy": "triton sgl_eagle_triton.kernels.verify_greedy",
    "verify sampling": "sgl-kernel tree_speculative_sampling_target_only (stock)",
}


def _logged_once(fn, what: str):
    """``fn``, logging one line at its first call in this process: proof in the log that it ran."""
    pending = [True]

    def wrapper(*args, **kwargs):
        if pending:
            pending.clear()
            logger.info("%s: %s ran (first call in this process)", ALGORITHM_NAME, what)
        return fn(*args, **kwargs)

    return wrapper


@contextmanager
def _swapped(module, name: str, replacement):
    """Rebind ``module.name`` for the duration of the block; fails loudly if SGLang moved it."""
    original = getattr(module, name)
    setattr(module, name, replacement)
    try:
        yield
    finally:
        setattr(module, name, original)


def _verify_tree_greedy_func(
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
    """``eagle_utils.verify_tree_greedy_func``'s signature and return value, on our kernel."""
    _verify_tree_greedy(
        predicts,
        accept_index,
        accept_token_num,
        candidates,
        retrieve_index,
        retrieve_next_token,
        retrieve_next_sibling,
        target_predict,
    )
    return predicts, accept_index, accept_token_num


_build_tree = _logged_once(build_tree_kernel_efficient, "triton build_tree")
_verify_tree_greedy = _logged_once(verify_tree_greedy, "triton verify_tree_greedy")


class TritonEagleDraftWorker(EagleDraftWorker):
    """SGLang's EAGLE draft worker; the verify tree it hands over is built by our Triton kernel."""

    def draft(self, batch, *args, **kwargs):
        with _swapped(eagle_worker_common, "build_tree_kernel_efficient", _build_tree):
            return super().draft(batch, *args, **kwargs)


class EagleTritonWorkerV2(EAGLEWorkerV2):
    """SGLang's EAGLE V2 worker with our draft worker and our greedy tree verification."""

    def __init__(self, *args, **kwargs):
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
        with _swapped(eagle_utils, "verify_tree_greedy_func", _verify_tree_greedy_func):
            return super().verify(batch, *args, **kwargs)
