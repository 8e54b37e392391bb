"""Plain-PyTorch twins of every kernel, written for clarity; test and benchmark oracles only.

The package itself never imports from here.
"""
