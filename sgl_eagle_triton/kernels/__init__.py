"""Triton kernels, one op per module: the ``@triton.jit`` kernel(s) and a thin launcher."""
