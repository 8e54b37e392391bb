"""The flags every end-to-end test server shares (tests/test_e2e_server.py, tests/test_load_fault.py),
and :func:`e2e_server`, which starts one through :class:`sgl_eagle_triton.launcher.Server`."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

from sgl_eagle_triton.launcher import Server

# The GPU bundle has no FA3/FlashInfer/xgrammar kernels (see README); deterministic inference makes greedy
# outputs comparable across servers (tests/lossless.py).
COMMON_ARGS = (
    "--attention-backend", "triton",
    "--sampling-backend", "pytorch",
    "--grammar-backend", "none",
    "--enable-deterministic-inference",
    "--cuda-graph-max-bs", "16",
    "--max-running-requests", "16",
    "--mem-fraction-static", "0.85",
    "--max-total-tokens", "65536",
)


def e2e_server(name: str, model_path: str, args: Sequence[str], log_dir: Path,
               env: Mapping[str, str] | None = None) -> Server:
    """A started (not yet ready) server with ``COMMON_ARGS``, then ``args`` (a flag given again there wins);
    its log is ``log_dir/<name>.log``."""
    return Server(name, model_path, [*COMMON_ARGS, *args], log_dir, env=env)
