"""Plain-PyTorch twin of :mod:`sgl_eagle_triton.kernels.embed_shard` (the masked lookup as SGLang's
``VocabParallelEmbedding`` writes it)."""

import torch


def embed_shard(ids: torch.Tensor, table: torch.Tensor, offset: int, valid: int) -> torch.Tensor:
    """[R, H]: ``table[ids - offset]`` where the id is among this rank's ``valid`` rows, else zeros."""
    local = ids - offset
    mine = (local >= 0) & (local < valid)
    return table[local.clamp(0, max(valid - 1, 0))] * mine[:, None].to(table.dtype)
