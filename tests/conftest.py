"""Shared fixtures and the one GPU gate. Without CUDA, Triton kernels run on the CPU through
``TRITON_INTERPRET=1`` and every test marked ``gpu`` is skipped (``pytest.mark.gpu``; nothing imports
from this file)."""

import os
import time

import pytest
import torch

HAS_CUDA = torch.cuda.is_available()
if not HAS_CUDA:
    os.environ.setdefault("TRITON_INTERPRET", "1")
    from tests import compile_check

    compile_check.install()  # every interpreted kernel is also compiled for sm_90, gfx942, gfx950 at the end


def pytest_sessionfinish(session, exitstatus):
    """On the CPU: compile every kernel variant the tests interpreted, with its launch options, for an H100 (sm_90),
    an MI300X (gfx942) and an MI355X (gfx950) (tests/compile_check.py); a variant that does not compile, or whose
    shared memory exceeds the target's, fails the run (the interpreter skips the compiler's checks). Reports the
    count per target."""
    if HAS_CUDA or exitstatus != 0:
        return
    from tests import compile_check

    if not compile_check.RECORDS:
        return
    started = time.monotonic()
    failures = compile_check.compile_all(compile_check.RECORDS)
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    if reporter is not None:
        per_target = ", ".join(f"{target} ({sum(f.startswith(target + ' ') for f in failures)} failed)"
                               for target in compile_check.TARGETS)
        reporter.write_line(f"compile check: {len(compile_check.RECORDS)} kernel variants for {per_target}; "
                            f"{time.monotonic() - started:.0f} s")
        for line in failures:
            reporter.write_line(f"  {line}")
    if failures:
        session.exitstatus = 1


def pytest_collection_modifyitems(config, items):
    if HAS_CUDA:
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU (marker gpu)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def device() -> str:
    """Where kernel tests run: ``cuda`` when present, else ``cpu`` (Triton interpreter)."""
    return "cuda" if HAS_CUDA else "cpu"


@pytest.fixture
def eagle_triton_args(monkeypatch):
    """Server args from a command line, resolved as SGLang's launcher resolves them, with EAGLE_TRITON registered and
    its device check widened to the CPU (:class:`tests.sglang_compat.Args`: read as SGLang's processes read them;
    ``.record`` is SGLang's object); what server-arg handling exports is cleared before and after the test."""
    from sglang.srt.plugins import load_plugins

    from sgl_eagle_triton import config
    from tests.sglang_compat import resolved

    load_plugins()
    monkeypatch.setattr(config, "SUPPORTED_DEVICES", ("cuda", "cpu"))
    monkeypatch.delenv(config.DRAFT_KIND_ENV, raising=False)
    monkeypatch.delenv(config.ADAPTIVE_TREES_ENV, raising=False)
    yield lambda argv: resolved([*argv, "--device", "cuda" if HAS_CUDA else "cpu"])
    os.environ.pop(config.DRAFT_KIND_ENV, None)
    os.environ.pop(config.ADAPTIVE_TREES_ENV, None)


@pytest.fixture
def published_server(eagle_triton_args):
    """An EAGLE_TRITON server's settings (the trained pair, 3 / 1 / 4) published in this process as a scheduler's:
    what SGLang's own functions read from 0.5.18 on (``runtime_context.get_spec()``)."""
    from tests.sglang_compat import published
    from tests.tiny_models import TRAINED_PAIR

    args = eagle_triton_args(["--model-path", str(TRAINED_PAIR / "target"), "--speculative-algorithm",
                              "EAGLE_TRITON", "--speculative-draft-model-path", str(TRAINED_PAIR / "eagle3"),
                              "--speculative-num-steps", "3", "--speculative-eagle-topk", "1",
                              "--speculative-num-draft-tokens", "4"])
    with published(args.record):
        yield args
