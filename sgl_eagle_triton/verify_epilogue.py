"""Greedy verification of a chain inside the target's verify CUDA graph (config.VERIFY_IN_GRAPH_ENV,
``SGLANG_EAGLE_TRITON_VERIFY_IN_GRAPH``: unset, wherever it can run; 1, required; 0, off).

A drafting state whose tree is a chain (topk 1, ``n`` draft tokens) verifies a greedy batch with ``argmax`` of the
target's logits and our ``verify_tree_greedy`` kernel over a tree whose retrieve arrays are the same at every step
(:func:`chain_tree`); the tokens verified are the graph's own input ids. So both can run at the end of every CUDA
graph SGLang captures for that state's target verify, through the model runner's capture tail hooks (as steps 0's
``off_step.GraphEpilogue``): each replay then leaves ``predict`` / ``accept_lens`` / ``accept_index`` in a static
buffer, and a greedy verify (:func:`from_graph`) takes them with one copy instead of SGLang's ``eagle_sample``
(three allocations, an argmax and a kernel launch from Python). Same kernel on the same inputs as the eager path:
the outputs are equal bit for bit.

Used only where the graph that ran is the one that wrote the buffer: the logits SGLang hands over are that graph's
output buffer (same storage; the graph's logits are held here, so no later tensor can take their address), the
batch padded to the smallest captured size that holds it. A batch with penalties, logit bias, a grammar, custom
logit processors, SGLang's simulated acceptance or (0.5.20+) UNO / watermark arguments takes ``eagle_sample``.
Every SGLang call goes through :mod:`sgl_eagle_triton.glue`.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from sgl_eagle_triton.glue import call_sites as glue
from sgl_eagle_triton.kernels.verify_greedy import verify_tree_greedy
from sgl_eagle_triton.verify import VERIFY_GREEDY, note_ran

VERIFY_IN_GRAPH = "greedy verify in the target graph"  # RAN's key: greedy verifies served from the graph


def chain_tree(bs: int, n: int, device) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The retrieve arrays [bs, n] int64 of ``bs`` chains of ``n`` nodes, as build_tree makes them for topk 1:
    ``retrieve_index`` the flat positions ``b * n + i``, ``retrieve_next_token`` ``i + 1`` (-1 at the last node),
    ``retrieve_next_sibling`` -1."""
    index = torch.arange(bs * n, dtype=torch.int64, device=device).view(bs, n)
    next_token = torch.arange(1, n + 1, dtype=torch.int64, device=device).repeat(bs, 1)
    next_token[:, -1] = -1
    return index, next_token, torch.full((bs, n), -1, dtype=torch.int64, device=device)


class _Captured(NamedTuple):
    logits: torch.Tensor  # the graph's logits output [size * n, vocab] (held: its storage stays this graph's)
    flat: torch.Tensor  # [size * n | size | size * depth] int32: predict, accept lengths, accept index
    size: int  # requests the graph was captured for
    depth: int  # accept_index's width (steps + 1)


def _views(flat: torch.Tensor, size: int, n: int, depth: int, bs: int):
    """``(predict [bs * n], accept_lens [bs], accept_index [bs, depth])`` of a packed buffer laid out for ``size``."""
    lens_at, index_at = size * n, size * n + size
    return flat[:bs * n], flat[lens_at:lens_at + bs], flat[index_at:index_at + bs * depth].view(bs, depth)


class VerifyEpilogue:
    """The greedy verify of chains, captured at the end of the target's verify graphs (:meth:`hook`, SGLang's
    ``capture_tail_hooks`` entry) of the states the worker marks while they are captured (:attr:`chain` =
    ``(n draft tokens, steps + 1)``; None: graphs captured then are left alone), and served from them
    (:meth:`outputs`) for the chains :meth:`enable` was told of."""

    def __init__(self, capturing=None):
        self.capturing = capturing or (lambda: torch.cuda.is_available() and torch.cuda.is_current_stream_capturing())
        self.chain: tuple[int, int] | None = None
        self.captured: dict[tuple[int, int], _Captured] = {}  # (n, size) -> what that graph writes
        self.ambiguous: set[tuple[int, int]] = set()  # captured more than once: not used
        self.enabled: set[int] = set()  # n of the chains served
        self._served_sizes: dict[int, list[int]] = {}  # n -> sizes(n) when enabled: read at every verify
        self.paused = False  # the verify after the graph for now (an A/B inside one server: config.AB_STEPS_ENV)
        self._trees: dict[tuple, tuple] = {}  # (size, n, device) -> chain_tree, made once (outside the capture)

    def hook(self, graph_runner, logits_output, forward_batch, num_tokens: int) -> None:
        """After the target's forward in a capture's warm-up runs and in the capture: a TARGET_VERIFY graph of the
        marked chain (``n`` tokens per request) gets argmax, the greedy walk and its packed outputs; others nothing."""
        if self.chain is None:
            return
        n, depth = self.chain
        size, logits = forward_batch.batch_size, logits_output.next_token_logits
        if not forward_batch.forward_mode.is_target_verify() or num_tokens != size * n or logits is None:
            return
        key = (size, n, logits.device)
        if key not in self._trees:
            self._trees[key] = chain_tree(size, n, logits.device)
        flat = torch.empty(size * (n + 1 + depth), dtype=torch.int32, device=logits.device)
        predict, accept_lens, accept_index = _views(flat, size, n, depth, size)
        predict.zero_()
        accept_index.fill_(-1)
        target = torch.argmax(logits, dim=-1).view(size, n)
        candidates = forward_batch.input_ids[:num_tokens].to(torch.int64).view(size, n)
        verify_tree_greedy(predict, accept_index, accept_lens, candidates, *self._trees[key], target)
        accept_lens.add_(1)  # SGLang's accept lengths count the bonus token
        if self.capturing():
            if (n, size) in self.captured:
                self.ambiguous.add((n, size))
            self.captured[n, size] = _Captured(logits, flat, size, depth)

    def sizes(self, n: int) -> list[int]:
        """The batch sizes captured once with the chain of ``n`` tokens, ascending."""
        return sorted(s for m, s in self.captured if m == n and (m, s) not in self.ambiguous)

    def enable(self, n: int) -> None:
        self.enabled.add(n)
        self._served_sizes[n] = self.sizes(n)  # the captures are over: found once, not at every verify

    def outputs(self, verify_input, bs: int, logits: torch.Tensor):
        """``(predict [bs * n], accept_lens [bs], accept_index [bs, depth])`` int32 (copies) of the last replay of
        the graph this verify ran, when that is a graph with the epilogue of an enabled chain; else None."""
        n = verify_input.draft_token_num
        if n not in self.enabled or verify_input.topk != 1:
            return None
        size = min((s for s in self._served_sizes[n] if s >= bs), default=None)
        if size is None:
            return None
        captured = self.captured[n, size]
        if (logits.data_ptr() != captured.logits.data_ptr() or logits.shape[0] != bs * n
                or verify_input.spec_steps + 1 != captured.depth):
            return None  # an eager forward, or a graph without the epilogue
        return _views(captured.flat.clone(), size, n, captured.depth, bs)


def from_graph(epilogue: VerifyEpilogue, eagle_sample):
    """``eagle_sample`` (``sglang...eagle_sample``'s signature and results) that takes a greedy batch's verify from
    ``epilogue`` where :meth:`VerifyEpilogue.outputs` has it and SGLang's sampler would pick the argmax."""

    def sample(verify_input, batch, logits_output, grammar_mask=None, *args, **kwargs):
        if (epilogue.enabled and not epilogue.paused and grammar_mask is None and not args
                and kwargs.get("uno_target_max_top_k") is None and kwargs.get("watermark_state") is None
                and not batch.forward_mode.is_idle()
                and glue.argmax_is_sample(batch.sampling_info) and not glue.sglang_simulates_acceptance()):
            outputs = epilogue.outputs(verify_input, batch.seq_lens.shape[0], logits_output.next_token_logits)
            if outputs is not None:
                note_ran(VERIFY_IN_GRAPH)
                note_ran(VERIFY_GREEDY, "inside the target's verify graph")  # our greedy kernel ran, in the graph
                return outputs
        return eagle_sample(verify_input, batch, logits_output, grammar_mask, *args, **kwargs)

    sample.sgl_eagle_triton_verify_epilogue = epilogue
    return sample
