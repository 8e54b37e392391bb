"""The overlap scheduler's relay after a fill-only step: the bonus token alone.

Under overlap scheduling SGLang relays each speculative step's draft input to the next step through its
``FutureMap``: ``stash`` scatters the bonus tokens, top-k probabilities and indices and hidden states into
request-indexed buffers after the step, ``_resolve_spec_extras`` gathers them back before the next. After a step
that only filled the draft KV (adaptive steps 0, ours: ``TritonEagleDraftWorker.fill_draft_kv``) the top-k and
hidden states are stubs (zeros) that nothing reads: the next decode step is another fill-only step or a resume,
which runs at steps 0 with the full draft extend (it reads the bonus token only and computes new ones). On the
trained tiny pair those three scatters and gathers cost ~0.14 ms of host time a step (one H200; no-spec relays the
token alone). :func:`bonus_only_after_fill` makes a server's future map relay the bonus token alone for a payload
whose top-k probabilities are :func:`mark_stub`-marked, and give the next step stub views in place of the gather.
A payload of the token alone (no top-k, no hidden states: a held step's result, which carries no draft input; SGLang's
own stash would fail on it on a server relaying top-k) is relayed the same way. A publish that
:func:`publish_unfenced` announced (the scheduler's publish of a held step's lengths) is left out, no write and no
event: nothing reads those lengths (a held batch's next step is non-speculative, and a batch turned back keeps its
lengths: :data:`LENGTHS_KEPT`), where a no-spec server writes them for nobody.

Everything else goes to SGLang's methods: a payload or draft input without the mark, the first stash (SGLang makes
its buffers from the first payload), draft probabilities, DSA top-k indices, ngram, an idle batch, and SGLang's CI
assertions (``SGLANG_IS_IN_CI``). Served 0.5.17-0.5.23: the buffers are made by ``_forward_buf_initialized``
(0.5.17-0.5.18) or per field, ``need_topk`` turning true (0.5.19+); 0.5.19+ relay a token alone through
``stash_bonus_tokens``.
"""

from __future__ import annotations

import functools

import torch

STUB_MARK = "sgl_eagle_triton_stub"  # set on the stub tensors of a fill-only step's draft input
# set on a draft input whose batch's seq_lens are already what the step reads (a batch turned speculative again after
# non-speculative steps: glue.nonspec.leave): the relay's sequence-length resolve leaves them
LENGTHS_KEPT = "sgl_eagle_triton_lengths_kept"
SERVER_FUTURE_MAP = None  # the future map bonus_only_after_fill made last in this process (a scheduler makes one)
UNFENCED = "sgl_eagle_triton_unfenced"  # set on the future map: its next publish (a held step's) is left out


def mark_stub(tensor: torch.Tensor | None) -> torch.Tensor | None:
    """``tensor`` (a stub of a fill-only step's draft input, or None) marked as one; returns it."""
    if tensor is not None:
        setattr(tensor, STUB_MARK, True)
    return tensor


def is_stub(tensor) -> bool:
    return bool(getattr(tensor, STUB_MARK, False))


def bonus_only_after_fill(future_map):
    """``future_map`` (SGLang's ``FutureMap``, as the speculative algorithm's ``create_future_map`` made it) with its
    class swapped for a subclass of that class relaying a fill-only step's bonus token alone (the module's
    docstring), and a draft input marked :data:`LENGTHS_KEPT` keeping its batch's ``seq_lens`` at the sequence-length
    resolve; returns it (kept in :data:`SERVER_FUTURE_MAP`)."""
    global SERVER_FUTURE_MAP
    future_map.__class__ = _bonus_only_class(type(future_map))
    SERVER_FUTURE_MAP = future_map
    return future_map


@functools.cache
def _bonus_only_class(base: type) -> type:
    ci_asserts = sglang_ci_asserts()  # a constant of SGLang's module, read once

    class BonusOnlyAfterFill(base):
        def publish(self, *args, **kwargs):
            if not self.__dict__.get(UNFENCED) or ci_asserts:
                return super().publish(*args, **kwargs)
            self.__dict__[UNFENCED] = False  # a held step's lengths: read by nobody (the module's docstring)
            return None

        def resolve_seq_lens_cpu(self, batch, *args, **kwargs):
            if getattr(batch.spec_info, LENGTHS_KEPT, False):
                return None
            return super().resolve_seq_lens_cpu(batch, *args, **kwargs)

        def stash(self, future_indices, payload):
            if not _relays_bonus_alone(self, payload) or future_indices.shape[0] == 0:
                return super().stash(future_indices, payload)
            stash_bonus = getattr(self, "stash_bonus_tokens", None)  # 0.5.19+
            if stash_bonus is not None:
                stash_bonus(future_indices, payload.bonus_tokens)
            else:
                self.output_tokens_buf[future_indices] = payload.bonus_tokens.to(self.output_tokens_buf.dtype)

        def _resolve_spec_extras(self, batch):
            draft_input = batch.spec_info
            indices = getattr(draft_input, "future_indices", None)
            if (ci_asserts or draft_input is None or indices is None or indices.shape[0] == 0
                    or not _relays_extras(self) or not is_stub(getattr(draft_input, "topk_p", None))
                    or getattr(draft_input, "future_dsa_topk_indices_available", False)
                    or getattr(self, "draft_probs_buf", None) is not None):
                return super()._resolve_spec_extras(batch)
            if indices.device.type != "cpu":  # as SGLang's: the indices live until this stream is done with them
                indices.record_stream(torch.get_device_module(self.device).current_stream())
            draft_input.bonus_tokens = self.output_tokens_buf[indices]
            _stubs_of_size(draft_input, indices.shape[0])
            draft_input.dsa_topk_indices = None

    return BonusOnlyAfterFill


def _relays_bonus_alone(future_map, payload) -> bool:
    """A marked payload (or one of the token alone) once SGLang made its relay buffers, with nothing but the bonus
    token, top-k and hidden states to relay."""
    topk_p = payload.topk_p
    return ((is_stub(topk_p) or (topk_p is None and payload.hidden_states is None))
            and getattr(future_map, "_forward_buf_initialized", True) and _relays_extras(future_map)
            and getattr(payload, "draft_probs", None) is None and getattr(payload, "dsa_topk_indices", None) is None)


def publish_unfenced(future_map) -> None:
    """``future_map``'s next ``publish`` (the scheduler's, of a held step's lengths: off_route) left out: neither the
    write of the lengths nor the spec-v2 event that fences a speculative step's resolve of them; none resolves them
    (the held batch's next step is non-speculative, and a batch turned back keeps its lengths: :data:`LENGTHS_KEPT`;
    a later speculative publish writes its own and records the event). SGLang's own under its CI assertions (which
    check that each resolve follows a fresh publish)."""
    if future_map is not None:
        future_map.__dict__[UNFENCED] = True


def _relays_extras(future_map) -> bool:
    """Whether ``future_map`` relays top-k (and hidden states) at all: EAGLE's, once SGLang made those buffers."""
    return getattr(future_map, "need_topk", False) and not future_map.spec_algo.is_ngram()


def _stubs_of_size(draft_input, bs: int) -> None:
    """``draft_input``'s stub top-k probabilities / indices and hidden states (the last fill-only step's) as ``bs``
    rows: kept when they have them (requests finished or joined since only change ``future_indices``), else new
    marked zeros of the same row shape and dtype."""
    for name in ("topk_p", "topk_index", "hidden_states"):
        stub = getattr(draft_input, name, None)
        if stub is not None and stub.shape[0] != bs:
            setattr(draft_input, name, mark_stub(stub.new_zeros((bs, *stub.shape[1:]))))


def sglang_ci_asserts() -> bool:
    """SGLang's relay assertions (``SGLANG_IS_IN_CI``) poison consumed rows: its own methods run them."""
    from sglang.srt.managers import overlap_utils

    return bool(getattr(overlap_utils, "_DEBUG_ASSERT", False))
