"""What the kernels' launchers know about the GPU: its properties, queried once per device, and the tuning
constants that turn them into grid sizes.

Under the Triton CPU interpreter (``TRITON_INTERPRET=1``, CI) there is no GPU to ask: :data:`INTERPRETER`
stands in, with a few "SMs" so that the interpreted grids stay small while still splitting work.

On ROCm (AMD Instinct) the same rules read an AMD entry: compute units for SMs, the CU's LDS for shared memory,
wavefronts of 64 (:func:`warps`), no PDL (:func:`pdl`). The CPU suite compiles the rules' tiles for :data:`H100`,
:data:`MI300X` and :data:`MI355X` and checks their shared memory (tests/test_tile_targets.py); the tuning constants
below were measured on NVIDIA GPUs only and never on AMD.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class DeviceInfo:
    """sms: streaming multiprocessors (compute units on AMD); shared_per_block: bytes of shared memory one block may
    use (opt-in maximum; an AMD CU's LDS); capability: (major, minor) compute capability, (0, 0) for the interpreter
    (what ROCm's torch reports on AMD, e.g. (9, 4) for gfx942: never read as an NVIDIA one); warp_size: threads
    of one warp, 64 in an AMD Instinct wavefront (Triton's ``num_warps`` counts them); arch: the AMD ISA
    (``gfx942``), empty elsewhere."""

    sms: int
    shared_per_block: int
    capability: tuple[int, int]
    warp_size: int = 32
    arch: str = ""

    @property
    def amd(self) -> bool:
        return self.arch.startswith("gfx")


INTERPRETER = DeviceInfo(sms=4, shared_per_block=232_448, capability=(0, 0))
# The GPUs the CPU suite compiles every kernel for (tests/compile_check.py) and checks the tile rules on
H100 = DeviceInfo(sms=132, shared_per_block=232_448, capability=(9, 0))  # an H200's are the same
MI300X = DeviceInfo(sms=304, shared_per_block=65_536, capability=(9, 4), warp_size=64, arch="gfx942")
MI355X = DeviceInfo(sms=256, shared_per_block=163_840, capability=(9, 5), warp_size=64, arch="gfx950")
AMD_GPUS = {gpu.arch: gpu for gpu in (MI300X, MI355X)}


@functools.cache
def device_info(device: torch.device) -> DeviceInfo:
    """The properties of ``device`` (:data:`INTERPRETER` for a non-CUDA device). On ROCm (``torch.version.hip``)
    the CU count as reported, wavefronts of the reported size (64 if unreported) and the LDS of :data:`AMD_GPUS`' entry
    for its ISA (else the reported shared memory per block)."""
    if device.type != "cuda":
        return INTERPRETER
    props = torch.cuda.get_device_properties(device)
    capability = torch.cuda.get_device_capability(device)
    if torch.version.hip:
        arch = props.gcnArchName.split(":")[0]
        known = AMD_GPUS.get(arch)
        return DeviceInfo(props.multi_processor_count,
                          known.shared_per_block if known else props.shared_memory_per_block, capability,
                          getattr(props, "warp_size", 64), arch)
    return DeviceInfo(props.multi_processor_count, props.shared_memory_per_block_optin, capability)


def warps(gpu: DeviceInfo, threads: int) -> int:
    """Triton's ``num_warps`` for ``threads`` threads a program on ``gpu``: warps of 32 on NVIDIA, wavefronts of 64
    on AMD Instinct (at least one)."""
    return max(1, threads // gpu.warp_size)


def pdl(gpu: DeviceInfo) -> bool:
    """Whether ``gpu`` launches with programmatic dependent launch: NVIDIA compute capability 9.0 and up only."""
    return not gpu.amd and gpu.capability >= (9, 0)


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
