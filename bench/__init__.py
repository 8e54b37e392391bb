"""Benchmarks (GPU), a package run from the repository root: ``python -m bench.serve``, ``python -m bench.drafter``,
``python -m bench.kernels``, ``python -m bench.sweep_linear``, ``python -m bench.trace_breakdown``. Importing a
module runs nothing; their pure-Python parts are tested on the CPU (tests/test_bench*.py, test_trace_breakdown.py).
"""
