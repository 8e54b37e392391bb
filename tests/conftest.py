"""Shared fixtures. Without CUDA, Triton kernels run on the CPU through ``TRITON_INTERPRET=1``."""

import os

import pytest
import torch

HAS_CUDA = torch.cuda.is_available()
if not HAS_CUDA:
    os.environ.setdefault("TRITON_INTERPRET", "1")

requires_cuda = pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA GPU")


@pytest.fixture(scope="session")
def device() -> str:
    """Where kernel tests run: ``cuda`` when present, else ``cpu`` (Triton interpreter)."""
    return "cuda" if HAS_CUDA else "cpu"
