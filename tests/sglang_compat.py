"""The tests' side of the glue: server args built, resolved and published as each served SGLang release's launcher
and scheduler do it (0.5.17 resolves in place and its sizing functions take the server args; 0.5.18+ sizes from the
published settings; 0.5.19+ resolves once and keeps the raw input on the record)."""

from __future__ import annotations

import inspect
from contextlib import contextmanager

from sgl_eagle_triton.glue.args import prepare_server_args, settings

__all__ = ["prepare_server_args", "settings", "published", "req_to_token_extra", "alloc_reserve"]


@contextmanager
def published(record):
    """``record``'s settings published in this process as a scheduler's (``runtime_context.publish``), reset after."""
    from sglang.srt import runtime_context

    runtime_context.publish(record, role="test" if "test" in getattr(runtime_context, "ROLE_NAMESPACE_SETS", {})
                            else "scheduler")
    try:
        yield
    finally:
        runtime_context.reset_context()


def _call(fn, record):
    if inspect.signature(fn).parameters:
        return fn(record)
    with published(record):
        return fn()


def req_to_token_extra(record) -> int:
    """SGLang's ``req_to_token`` row headroom for ``record``, as its KV-cache configurator asks (hooks applied)."""
    from sglang.srt.mem_cache import kv_cache_configurator

    return _call(kv_cache_configurator.get_req_to_token_extra_context_len, record)


def alloc_reserve(record) -> int:
    """SGLang's KV reservation per request and decode step for ``record``."""
    from sglang.srt.mem_cache.allocation_sizing import get_alloc_reserve_per_decode

    return _call(get_alloc_reserve_per_decode, record)


class Args:
    """A resolved record read as SGLang's own processes read it (:func:`settings`); ``record`` is SGLang's object."""

    def __init__(self, record):
        self.record = record

    def __getattr__(self, name: str):
        return getattr(settings(self.record), name)

    @property
    def max_speculative_num_draft_tokens(self) -> int | None:
        """The widest per-request draft SGLang sizes KV and buffers for (the glue's reading, published)."""
        from sgl_eagle_triton.glue.args import max_draft_tokens

        with published(self.record):
            return max_draft_tokens(self.record)


def resolved(argv) -> Args:
    """``prepare_server_args(argv)`` resolved as a launcher resolves it, read as SGLang's processes read it."""
    return Args(prepare_server_args(argv))


def check_rows(row_width: int, context_len: int, args: Args) -> None:
    """``config.check_req_to_token_rows`` as the worker runs it (the scheduler's settings published)."""
    from sgl_eagle_triton import config

    with published(args.record):
        config.check_req_to_token_rows(row_width, context_len, args.record)


def adaptive_trees(monkeypatch, trees: dict) -> None:
    """The adaptive tree candidates ``{steps: (topk, draft tokens)}`` as ``config.handle_server_args`` leaves them for
    every process of a server (``config.ADAPTIVE_TREES_ENV``), for the test's duration."""
    import json

    from sgl_eagle_triton import config

    monkeypatch.setenv(config.ADAPTIVE_TREES_ENV, json.dumps({str(s): list(kn) for s, kn in trees.items()}))
