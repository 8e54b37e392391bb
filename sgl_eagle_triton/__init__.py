"""sgl-eagle-triton: EAGLE / EAGLE-3 speculative decoding for SGLang with Triton tree kernels.

Installed, it registers ``--speculative-algorithm EAGLE_TRITON`` through SGLang's
``sglang.srt.plugins`` entry point (see :mod:`sgl_eagle_triton.plugin`).
"""

__version__ = "0.1.0"
ALGORITHM_NAME = "EAGLE_TRITON"
