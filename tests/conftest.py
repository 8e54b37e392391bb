"""Shared fixtures and the one GPU gate. Without CUDA, Triton kernels run on the CPU through
``TRITON_INTERPRET=1`` and every test marked ``gpu`` is skipped (``pytest.mark.gpu``; nothing imports
from this file)."""

import os

import pytest
import torch

HAS_CUDA = torch.cuda.is_available()
if not HAS_CUDA:
    os.environ.setdefault("TRITON_INTERPRET", "1")


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
    """``prepare_server_args`` with EAGLE_TRITON registered and its device check widened to the CPU;
    the draft kind that server-arg handling exports is cleared before and after the test."""
    from sglang.srt.plugins import load_plugins
    from sglang.srt.server_args import prepare_server_args

    from sgl_eagle_triton import config

    load_plugins()
    monkeypatch.setattr(config, "SUPPORTED_DEVICES", ("cuda", "cpu"))
    monkeypatch.delenv(config.DRAFT_KIND_ENV, raising=False)
    yield lambda argv: prepare_server_args([*argv, "--device", "cuda" if HAS_CUDA else "cpu"])
    os.environ.pop(config.DRAFT_KIND_ENV, None)
