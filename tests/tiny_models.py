"""Test model pairs: the trained tiny EAGLE-3 pair shipped as package data
(``sgl_eagle_triton/devtools/assets/tiny-code-v1``) and random-weight pairs from
:mod:`sgl_eagle_triton.devtools.tiny_models` (the one copy of the model-building code)."""

from __future__ import annotations

from pathlib import Path

from sgl_eagle_triton.devtools import TRAINED_PAIR
from sgl_eagle_triton.devtools.tiny_models import write_random_pair

__all__ = ["TRAINED_PAIR", "write_random_eagle1_pair"]


def write_random_eagle1_pair(root: Path, seed: int = 0) -> tuple[Path, Path]:
    """``root/target`` (4-layer Llama, the trained pair's tokenizer) and ``root/eagle`` (EAGLE-1 head)."""
    return write_random_pair(root, draft="eagle", seed=seed, tokenizer_dir=TRAINED_PAIR / "target")
