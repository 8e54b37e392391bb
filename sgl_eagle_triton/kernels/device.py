"""What the kernels' launchers know about the GPU: its properties, queried once per device, and the tuning
constants that turn them into grid sizes.

Under the Triton CPU interpreter (``TRITON_INTERPRET=1``, CI) there is no GPU to ask: :data:`INTERPRETER`
stands in, with a few "SMs" so that the interpreted grids stay small while still splitting work.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class DeviceInfo:
    """sms: streaming multiprocessors; shared_per_block: bytes of shared memory one block may use (opt-in
    maximum); capability: (major, minor) compute capability, (0, 0) for the interpreter."""

    sms: int
    shared_per_block: int
    capability: tuple[int, int]


INTERPRETER = DeviceInfo(sms=4, shared_per_block=232_448, capability=(0, 0))


@functools.cache
def device_info(device: torch.device) -> DeviceInfo:
    """The properties of ``device`` (:data:`INTERPRETER` for a non-CUDA device)."""
    if device.type != "cuda":
        return INTERPRETER
    props = torch.cuda.get_device_properties(device)
    return DeviceInfo(props.multi_processor_count, props.shared_memory_per_block_optin,
                      torch.cuda.get_device_capability(device))


def pipeline_budget(gpu: DeviceInfo) -> int:
    """Bytes of shared memory a GEMM tile rule may fill with pipeline stages on ``gpu`` (one block's, less
    :data:`SHARED_RESERVE`)."""
    return gpu.shared_per_block - SHARED_RESERVE


def stage_bytes(rows: int, cols: int, block_k: int, x_bytes: int, weight_tiles: int = 1) -> int:
    """Shared memory of one pipeline stage of a tiled ``x @ weight.T``: a ``[rows, block_k]`` tile of x
    (``x_bytes`` an element) and ``weight_tiles`` 16-bit ``[cols, block_k]`` weight tiles."""
    return rows * block_k * x_bytes + weight_tiles * cols * block_k * 2


# --- tuning constants ---------------------------------------------------------------------------------------
# Linear layer and LM head: from this many rows on cuBLAS runs the GEMM (bench/drafter.py's per-op rows on an
# H100, 2026-11-26: our Triton GEMM at 0.83-1.09x cuBLAS up to 8 rows, 1.0-1.6x at 64 and 1.2-3.4x at 256).
CUBLAS_MIN_ROWS = 33
# Headroom the GEMM tile rules keep below a block's shared memory: they count stages x (x tile + weight tiles) plus
# this, an upper bound of what Triton 3.6 allocates (about stages - 1 of them, plus a normalised x tile).
SHARED_RESERVE = 8192
# Draft attention: prefix chunks per (request, kv head) give this many waves over the SMs, at most MAX.
ATTENTION_WAVES = 2
ATTENTION_MAX_SPLIT = 32
# Target probabilities and tree sampling: programs per vocabulary row at most, programs aimed at per SM, and
# tokens per program at least (its fixed cost per pass is about one 2048-token chunk's).
VOCAB_MAX_SPLIT = 32
VOCAB_PROGRAMS_PER_SM = 2
VOCAB_MIN_SLICE = 3072
