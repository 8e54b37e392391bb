"""Server arguments across SGLang's two configuration models.

Up to SGLang 0.5.18 ``ServerArgs`` is resolved in place when it is built (``__post_init__``): every reader sees the
resolved value on the object, and a plugin's ``handle_server_args`` writes onto it. From 0.5.19 the object is a raw
record of the command line, resolved once (``resolve_once``) into declarations: its attributes keep the raw input
(``speculative_num_steps`` stays None), the resolved values are read through ``resolving_view(record)``, and a
plugin's hooks get a stand-in that reads through that view and records writes to *fields* only (0.5.20+:
``record_foreign_defaults``; anything else written is dropped).

So every read of a server argument outside the launcher's hooks goes through :func:`settings`, and the plugin keeps
what is not a field (the adaptive tree candidates) in the environment its processes inherit.
Nothing here imports SGLang at module import (the launcher imports config, which imports this).
"""

from __future__ import annotations

import functools
import inspect
from functools import cache


@cache
def _server_args_class():
    from sglang.srt.server_args import ServerArgs

    return ServerArgs


@cache
def resolves_once() -> bool:
    """Whether this SGLang resolves a raw record once (0.5.19+) rather than in ``ServerArgs.__post_init__``."""
    return hasattr(_server_args_class(), "resolve_once")


@cache
def _resolving_view():
    from sglang.srt.arg_groups import overrides

    return getattr(overrides, "resolving_view", None)


def settings(server_args):
    """What SGLang resolved for ``server_args``, read by attribute: the object itself up to 0.5.18 (and for anything
    that is not a ``ServerArgs`` record: a hook's stand-in, a test's namespace); from 0.5.19 a record read through
    SGLang's resolving view (declarations over the raw input)."""
    view = _resolving_view() if resolves_once() else None
    if view is not None and isinstance(server_args, _server_args_class()):
        return view(server_args)
    return server_args


def prepare_server_args(argv: list[str]):
    """SGLang's ``prepare_server_args(argv)``, resolved as a launcher resolves it (``resolve_once`` where it exists):
    the record (read it through :func:`settings`). For tests, benchmarks and tools that build server args in-process."""
    from sglang.srt.server_args import prepare_server_args as prepare

    server_args = prepare(argv)
    if hasattr(server_args, "resolve_once"):
        server_args.resolve_once()
    return server_args


class Overlay:
    """``server_args`` (read through :func:`settings`) with some fields read as other values, for asking SGLang how it
    would judge another algorithm's settings (e.g. ``adaptive_unsupported_reason`` as for EAGLE3). Read-only; SGLang's
    views over it see no declarations of its own, so they read the overlay, then the resolved settings."""

    __slots__ = ("_base", "_fields")

    def __init__(self, server_args, **fields):
        object.__setattr__(self, "_base", settings(server_args))
        object.__setattr__(self, "_fields", fields)

    def __getattr__(self, name: str):
        fields = object.__getattribute__(self, "_fields")
        if name in fields:
            return fields[name]
        if name in ("_resolved_overrides", "_raw_input"):  # SGLang's views: no declarations of the overlay's own
            return None
        return getattr(object.__getattribute__(self, "_base"), name)

    def __setattr__(self, name: str, value) -> None:
        raise AttributeError("Overlay is read-only")


def with_fields(server_args, **fields):
    """``server_args`` read with ``fields`` in place, for asking SGLang how it would judge other settings: up to 0.5.18,
    during resolution, a shallow copy of the object with the fields set (SGLang's views still see its pending
    declarations); otherwise an :class:`Overlay` of the resolved settings."""
    if not resolves_once():
        import copy

        copied = copy.copy(target(server_args))
        try:
            for name, value in fields.items():
                setattr(copied, name, value)
            return copied
        except AttributeError:  # a record already resolved is read-only (only during resolution may it change)
            pass
    return Overlay(server_args, **fields)


def _takes_an_argument(fn) -> bool:
    return bool(inspect.signature(fn).parameters)


def alloc_reserve_per_decode(server_args=None) -> int:
    """SGLang's KV reservation per request and decode step (``allocation_sizing.get_alloc_reserve_per_decode``): of
    ``server_args`` up to 0.5.17; from 0.5.18 of the published speculative settings (the argument is not read)."""
    from sglang.srt.mem_cache.allocation_sizing import get_alloc_reserve_per_decode

    if _takes_an_argument(get_alloc_reserve_per_decode):
        return get_alloc_reserve_per_decode(server_args)
    return get_alloc_reserve_per_decode()


def published_spec():
    """The speculative settings SGLang published in this process (``runtime_context.get_spec()``: the algorithm,
    steps, topk, draft tokens, adaptive flags), for hooks SGLang calls without server args (0.5.18+)."""
    from sglang.srt.runtime_context import get_spec

    return get_spec()


def published_page_size() -> int:
    """The KV page size SGLang published in this process (``runtime_context.get_schedule().page_size``)."""
    from sglang.srt.runtime_context import get_schedule

    return get_schedule().page_size or 1


@cache
def keeps_max_draft_tokens_on_the_record() -> bool:
    """Whether SGLang reads the widest per-request draft width from ``ServerArgs.max_speculative_num_draft_tokens``
    (a cached property of the record, up to 0.5.18), which a plugin sets by storing the value in the instance; from
    0.5.19 it asks the algorithm (``resolve_max_speculative_num_draft_tokens``)."""
    return isinstance(getattr(_server_args_class(), "max_speculative_num_draft_tokens", None),
                      (property, functools.cached_property))


def max_draft_tokens(server_args) -> int | None:
    """The widest draft (tokens per request) any state of the server verifies: the record's
    ``max_speculative_num_draft_tokens`` up to 0.5.18; from 0.5.19 the published one (``runtime_context``; what the
    algorithm's ``resolve_max_speculative_num_draft_tokens`` answered at start)."""
    if keeps_max_draft_tokens_on_the_record():
        return server_args.max_speculative_num_draft_tokens
    from sglang.srt.runtime_context import max_speculative_num_draft_tokens

    return max_speculative_num_draft_tokens()


def set_max_draft_tokens(server_args, tokens: int) -> None:
    """Up to 0.5.18: store the widest draft in the record (over its cached property, so that every process reads it
    from the pickled args). From 0.5.19 SGLang asks the algorithm instead (``EagleTritonSpecAlgo``): nothing to set."""
    if keeps_max_draft_tokens_on_the_record():
        vars(target(server_args))["max_speculative_num_draft_tokens"] = tokens


class Resolving:
    """The server args a plugin hook is handed, read as resolved so far: writes go to SGLang's object (which declares
    them: 0.5.19 diffs the record, 0.5.20+ records the stand-in's writes) and are read back from here; every other
    read goes through :func:`settings` (0.5.19 hands the raw record, whose attributes keep the command line's
    ``None``). Up to 0.5.18, and on 0.5.20+'s stand-in, reads and writes are the object's own."""

    __slots__ = ("_target", "_view", "_written")

    def __init__(self, server_args):
        object.__setattr__(self, "_target", server_args)
        object.__setattr__(self, "_view", settings(server_args))
        object.__setattr__(self, "_written", {})

    def __getattr__(self, name: str):
        written = object.__getattribute__(self, "_written")
        if name in written:
            return written[name]
        return getattr(object.__getattribute__(self, "_view"), name)

    def __setattr__(self, name: str, value) -> None:
        object.__getattribute__(self, "_written")[name] = value
        setattr(object.__getattribute__(self, "_target"), name, value)


def resolving(server_args):
    """``server_args`` wrapped as :class:`Resolving` where SGLang's object does not read resolved values itself (a
    0.5.19+ record), else itself."""
    if isinstance(server_args, Resolving) or settings(server_args) is server_args:
        return server_args
    return Resolving(server_args)


def target(server_args):
    """The object SGLang handed (under a :class:`Resolving` wrapper, if any)."""
    return object.__getattribute__(server_args, "_target") if isinstance(server_args, Resolving) else server_args
