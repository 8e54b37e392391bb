"""Plain-PyTorch twin of ``kernels.draft_attention``: the attention of one EAGLE draft-decode step.

Each row attends over its request's prefix KV and then over its own chain, as SGLang's draft decode does.
The twin loops over rows and is written for clarity.
"""

import torch


def rope_neox(x: torch.Tensor, positions: torch.Tensor, cos_sin_cache: torch.Tensor) -> torch.Tensor:
    """Neox RoPE over the full head of ``x`` [R, H, D] (bf16 or fp16) at ``positions`` [R]: fp32 math, rounded to
    ``x``'s dtype."""
    cos, sin = cos_sin_cache[positions][:, None].chunk(2, dim=-1)
    x1, x2 = x.float().chunk(2, dim=-1)
    return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1).to(x.dtype)


def draft_attention(
    qkv: torch.Tensor,
    positions: torch.Tensor,
    cos_sin_cache: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    req_to_token: torch.Tensor,
    req_pool_indices: torch.Tensor,
    seq_lens: torch.Tensor,
    chain_k: torch.Tensor,
    chain_v: torch.Tensor,
    step: int,
    topk: int,
    num_q_heads: int,
    num_kv_heads: int,
    head_dim: int,
    scale: float,
    out: torch.Tensor,
) -> torch.Tensor:
    """Same arguments and results as ``sgl_eagle_triton.kernels.draft_attention.draft_attention``.

    Row ``r`` of request ``b = r // topk`` ropes its q and k and stores k and its v at ``chain_k/v[step, r]``.
    Its keys are ``k_cache[req_to_token[req_pool_indices[b], :L_b]]`` followed by ``chain_k[0 .. step, r]``,
    and its values are gathered the same way. Query head ``h`` uses kv head ``h // (Hq / Hkv)``.
    ``out[r]`` is ``softmax(scale * q.k) . v`` computed in fp32 and stored in ``out``'s dtype (the model's).
    """
    rows = req_pool_indices.shape[0] * topk
    heads = qkv.unflatten(1, (-1, head_dim))
    q = rope_neox(heads[:, :num_q_heads], positions, cos_sin_cache)
    chain_k[step, :rows] = rope_neox(heads[:, num_q_heads : num_q_heads + num_kv_heads], positions, cos_sin_cache)
    chain_v[step, :rows] = heads[:, num_q_heads + num_kv_heads :]
    group = num_q_heads // num_kv_heads
    for r in range(rows):
        b = r // topk
        slots = req_to_token[req_pool_indices[b], : int(seq_lens[b])].long()
        keys = torch.cat((k_cache[slots], chain_k[: step + 1, r])).float().repeat_interleave(group, dim=1)
        values = torch.cat((v_cache[slots], chain_v[: step + 1, r])).float().repeat_interleave(group, dim=1)
        scores = torch.einsum("hd,nhd->hn", q[r].float(), keys) * scale
        out[r] = torch.einsum("hn,nhd->hd", scores.softmax(dim=-1), values).flatten().to(out.dtype)
    return out
