"""One tensor-parallel rank's share of the draft's embedding lookup: ``out[r] = table[ids[r] - offset]`` where that
id is among this rank's ``valid`` vocabulary rows, else zeros (SGLang's ``VocabParallelEmbedding``: the ranks'
outputs all-reduced give every row exactly, one rank's row plus zeros). One launch instead of the mask's torch
chain (subtract, two compares, and, clamp, gather, cast, multiply). Grid ``(R, cdiv(H, BLOCK))``.
"""

import torch
import triton
import triton.language as tl

from sgl_eagle_triton.kernels.pdl import pdl_args, wait_for_prior


@triton.jit
def _embed_shard_kernel(ids_ptr, table_ptr, out_ptr, offset, valid, H: tl.constexpr, BLOCK: tl.constexpr,
                        USE_GDC: tl.constexpr):
    wait_for_prior(USE_GDC)
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    in_row = cols < H
    local = tl.load(ids_ptr + row) - offset
    mine = (local >= 0) & (local < valid)
    values = tl.load(table_ptr + local * H + cols, mask=in_row & mine, other=0.0)
    tl.store(out_ptr + row * H + cols, values, mask=in_row)


def embed_shard(ids: torch.Tensor, table: torch.Tensor, offset: int, valid: int, out: torch.Tensor) -> torch.Tensor:
    """ids: [R] int64 contiguous (whole-vocabulary ids); table: [V_rank, H] this rank's embedding rows (bf16 / fp16,
    contiguous; rows ``valid`` and on are padding); out: [R, H] in the table's dtype, contiguous. Returns ``out``:
    row ``r`` is ``table[ids[r] - offset]`` where ``0 <= ids[r] - offset < valid``, else zeros."""
    R, H = out.shape
    assert ids.shape == (R,) and ids.dtype == torch.int64 and ids.is_contiguous()
    assert table.shape[1] == H and table.is_contiguous()
    assert out.dtype == table.dtype and out.is_contiguous() and 0 <= valid <= table.shape[0]
    block = min(1024, triton.next_power_of_2(H))
    _embed_shard_kernel[(R, triton.cdiv(H, block))](ids, table, out, offset, valid, H=H, BLOCK=block,
                                                     **pdl_args(ids.device), num_warps=4)
    return out
