"""The SGLang releases this wheel serves, and the refusal outside them (imports no SGLang: the version of the imported
module where there is one, else the distribution's metadata)."""

from __future__ import annotations

import re
import sys
from importlib import metadata

# Inclusive range of SGLang releases the glue is written and checked for (pyproject.toml's dependency says the same)
SUPPORTED_RANGE = ("0.5.17", "0.5.23")
# Releases the GPU suite (kernels, e2e losslessness, benchmarks) ran on; every release of the range runs the CPU glue,
# config and plugin tests (.ci/run). The GPU image's torch serves only these.
GPU_TESTED = ("0.5.17",)
CPU_CHECKED = ("0.5.17", "0.5.18", "0.5.19", "0.5.20", "0.5.21", "0.5.22", "0.5.23")


class UnsupportedSGLangError(RuntimeError):
    """The installed SGLang is outside :data:`SUPPORTED_RANGE`."""


def installed() -> str:
    """The installed SGLang's version string: the imported module's ``__version__`` once SGLang is imported (what
    runs), else its distribution metadata (no import: the launcher's config reads this); ``"none"`` without either."""
    module = sys.modules.get("sglang")
    if getattr(module, "__version__", None):
        return module.__version__
    try:
        return metadata.version("sglang")
    except metadata.PackageNotFoundError:
        return "none"


def release(version: str) -> tuple[int, ...]:
    """``"0.5.21.post1"`` -> ``(0, 5, 21)``: the numeric release (pre, post and local suffixes dropped)."""
    match = re.match(r"\d+(\.\d+)*", version)
    return tuple(int(p) for p in match.group(0).split(".")) if match else ()


def unsupported_reason(version: str | None = None) -> str | None:
    """Why ``version`` (default: the installed SGLang's) is not served, None if it is."""
    version = installed() if version is None else version
    low, high = (release(v) for v in SUPPORTED_RANGE)
    if not low <= release(version) <= high:
        return (f"SGLang {version} is outside the releases sgl-eagle-triton serves ({SUPPORTED_RANGE[0]} ... "
                f"{SUPPORTED_RANGE[1]})")
    return None


def check_supported(version: str | None = None) -> None:
    """Refuse (:class:`UnsupportedSGLangError`, naming the range and what to install) an SGLang outside the range."""
    reason = unsupported_reason(version)
    if reason is not None:
        raise UnsupportedSGLangError(
            f"EAGLE_TRITON cannot run here: {reason}. Install a served release, e.g. "
            f"pip install 'sglang>={SUPPORTED_RANGE[0]},<={SUPPORTED_RANGE[1]}' (GPU-tested: {', '.join(GPU_TESTED)}), "
            "or a sgl-eagle-triton release made for this SGLang.")


def cuda_graph_max_bs_flag(version: str | None = None) -> str:
    """The flag that caps the decode CUDA graphs' batch size on ``version`` (default: the installed SGLang):
    ``--cuda-graph-max-bs`` up to 0.5.19; 0.5.20 keeps only ``--cuda-graph-max-bs-decode`` / ``-prefill``."""
    return "--cuda-graph-max-bs" if release(installed() if version is None else version) < (0, 5, 20) \
        else "--cuda-graph-max-bs-decode"
