"""A function of per-row inputs run as one CUDA graph per batch size (steps 0's draft KV fill:
:meth:`sgl_eagle_triton.worker.TritonEagleDraftWorker.fill_draft_kv`).

Where the host sets the cycle, a handful of small launches costs more than the GPU work they start (on the trained
tiny pair, H200, steps 0's eager fill took ~30 % of the host time of a decode step's launch: seven Triton launches
and the torch ops around them). :class:`RowGraphs` captures ``fn`` once per batch size into static input buffers
and replays it on a copy of the batch's rows: one copy per input and one replay. A batch between two captured sizes
runs in the next larger graph, its extra rows padded (the inputs that say where to write, e.g. KV slots, are padded
with a value the caller names: SGLang's padding slot 0); a batch above the largest size, or one whose inputs are not
shaped as the captured ones (trailing dimensions; logged once), runs ``fn`` eagerly. All sizes' graphs read views of
one set of static inputs, as large as the largest size (the replays run one at a time on one stream).
"""

from __future__ import annotations

import bisect
import logging
from collections.abc import Callable, Sequence

import torch

logger = logging.getLogger(__name__)


class RowGraphs:
    """``fn(*inputs)`` for inputs whose first dimension is the batch, writing its results (e.g. into a KV pool) or
    returning them (a tuple of tensors whose first dimension is the batch: the replay returns the captured call's,
    sliced to the batch's rows, valid until the next replay of any size: the sizes share one memory pool):
    :meth:`capture` records one graph per size of ``sizes`` on views of static inputs shaped as ``example``'s rows
    (dtypes and trailing shapes; zeros); ``__call__`` replays the smallest captured size that holds the batch after
    copying the batch's rows in (cast to the static dtypes) and writing ``pads[i]`` (None: left as they are) into
    input i's rows beyond the batch where a larger batch wrote them since (``fn`` must not write its inputs).
    ``graph`` makes a graph (``torch.cuda.CUDAGraph``), ``capturing(graph)`` is the context that records into it
    (default: ``torch.cuda.graph`` on ``pool``)."""

    def __init__(self, fn: Callable, sizes: Sequence[int], pads: Sequence[int | float | None],
                 graph: Callable = torch.cuda.CUDAGraph, capturing: Callable | None = None, pool=None):
        self.fn, self.sizes, self.pads = fn, sorted(set(sizes)), list(pads)
        self._graph, self._pool = graph, pool
        self._capturing = capturing or (lambda g: torch.cuda.graph(g, pool=self._pool))
        self.graphs: dict[int, tuple[object, list[torch.Tensor], tuple | None]] = {}  # size: graph, inputs, outputs
        self.replays = self.eager = self.mismatched = 0
        self._rows: dict[int, list[torch.Tensor]] = {}  # batch rows: views of the static inputs' first rows
        self._padded: dict[int, list[tuple[torch.Tensor, int | float]]] = {}  # batch rows: (rows past it, pad)
        self._dirty = 0  # static rows from here on hold their pads (inputs with one); below it, rows a batch wrote
        self._mixed = False  # the static inputs are of several dtypes (set by capture)

    def capture(self, example: Sequence[torch.Tensor]) -> None:
        """One graph per size, largest first, on views of one set of static inputs (no autograd); ``fn`` runs once
        eagerly on each size's view first (compiles its kernels; rows beyond any batch's hold pads, so what it writes
        goes where pads say)."""
        largest = self.sizes[-1]
        buffers = [torch.zeros(largest, *x.shape[1:], dtype=x.dtype, device=x.device) for x in example]
        self._mixed = len({x.dtype for x in buffers}) > 1
        for x, pad in zip(buffers, self.pads, strict=True):
            if pad is not None:
                x.fill_(pad)
        with torch.no_grad():
            for size in reversed(self.sizes):
                static = [x[:size] for x in buffers]
                self.fn(*static)
                graph = self._graph()
                with self._capturing(graph):
                    outputs = self.fn(*static)
                self.graphs[size] = (graph, static, outputs)

    def _captured(self, rows: int):
        """(graph, static inputs, outputs) of the smallest captured size >= ``rows``, or None."""
        i = bisect.bisect_left(self.sizes, rows)
        return None if i == len(self.sizes) else self.graphs.get(self.sizes[i])

    def graph_for(self, rows: int):
        """The graph a batch of ``rows`` replays, or None (it runs eagerly): the cost policy times it."""
        captured = self._captured(rows)
        return None if captured is None else captured[0]

    def __call__(self, *inputs: torch.Tensor) -> tuple | None:
        rows = inputs[0].shape[0]
        captured = self._captured(rows)
        if captured is not None and any(x.shape[1:] != given.shape[1:] for x, given in zip(captured[1], inputs,
                                                                                           strict=True)):
            if not self.mismatched:
                logger.warning("%s: inputs shaped %s, captured for %s: run eagerly", getattr(self.fn, "__name__", "fn"),
                               [tuple(x.shape) for x in inputs], [tuple(x.shape[1:]) for x in captured[1]])
            self.mismatched += 1
            captured = None
        if captured is None:
            self.eager += 1
            return self.fn(*inputs)
        graph, static, outputs = captured
        size = static[0].shape[0]
        if (views := self._rows.get(rows)) is None:
            views = self._rows[rows] = [x[:rows] for x in static]
        if self._mixed and len({x.dtype for x in inputs}) == 1:  # torch's fast path would cast every input to the
            for x, given in zip(views, inputs, strict=True):  # first buffer's dtype (pytorch#173383)
                x.copy_(given)
        else:  # one call: per-tensor copies in C++ (mixed dtypes), or one launch (one dtype, dense)
            torch._foreach_copy_(views, inputs)
        if self._dirty > rows:  # rows a larger batch wrote since: their pads again, up to this graph's size
            if (padded := self._padded.get(rows)) is None:  # static (its graph's size) follows from rows
                padded = self._padded[rows] = [(x[rows:], pad) for x, pad in zip(static, self.pads, strict=True)
                                               if pad is not None and rows < size]
            for x, pad in padded:
                x.fill_(pad)
        self._dirty = self._dirty if self._dirty > size else rows  # rows past this graph's size not written here
        graph.replay()
        self.replays += 1
        return None if outputs is None else tuple(x[:rows] for x in outputs)
