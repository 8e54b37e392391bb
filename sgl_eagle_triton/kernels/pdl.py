"""Programmatic dependent launch (PDL, sm_90+) for the draft chain's kernels.

The draft is a fixed chain of ~10 kernels per forward inside SGLang's draft CUDA graph; between two of them
the GPU drains one grid before it launches the next. Each chain kernel is launched with
``**pdl_args(device)`` and starts with :func:`wait_for_prior`: ``griddepcontrol.wait`` (returns once the
previous kernel has finished and its writes are visible, so nothing a kernel reads can race) then
``griddepcontrol.launch_dependents`` (lets the next kernel's programs launch while this one's last wave
runs). What overlaps is launch latency and each kernel's set-up before its first dependent load; a kernel
after a non-PDL one (cuBLAS, torch) simply starts when that one ends.
"""

import functools

import torch
import triton
import triton.language as tl

from sgl_eagle_triton.kernels.device import device_info, pdl


@triton.jit
def wait_for_prior(USE_GDC: tl.constexpr):
    if USE_GDC:
        tl.extra.cuda.gdc_wait()
        tl.extra.cuda.gdc_launch_dependents()


@functools.cache
def pdl_args(device: torch.device) -> dict:
    """Launch keywords of a chain kernel: ``USE_GDC`` (its :func:`wait_for_prior`) and ``launch_pdl`` always
    together, since a kernel launched early without the wait would race its predecessor's writes. PDL on CUDA
    devices of compute capability 9.0 and up (never under the CPU interpreter, never on AMD)."""
    on = pdl(device_info(device))
    return {"USE_GDC": on, "launch_pdl": on}


