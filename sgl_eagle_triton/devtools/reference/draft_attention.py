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
    k_scale: float = 1.0,
    v_scale: float = 1.0,
) -> torch.Tensor:
    """Same arguments and results as ``sgl_eagle_triton.kernels.draft_attention.draft_attention``.

    Row ``r`` of request ``b = r // topk`` ropes its q and k and stores k and its v at ``chain_k/v[step, r]``.
    Its keys are ``k_cache[req_to_token[req_pool_indices[b], :L_b]]`` followed by ``chain_k[0 .. step, r]``,
    and its values are gathered the same way. Query head ``h`` uses kv head ``h // (Hq / Hkv)``.
    ``out[r]`` is ``softmax(scale * q.k) . v`` computed in fp32 and stored in ``out``'s dtype (the model's).
    An FP8 pool (and chain) holds ``x / scale`` quantised as SGLang's ``set_kv_buffer`` stores it (divided in the
    model's dtype, then cast to FP8) and is read back as ``fp8 * scale``.
    """
    rows = req_pool_indices.shape[0] * topk
    quantised = k_cache.dtype != qkv.dtype
    k_scale, v_scale = (k_scale, v_scale) if quantised else (1.0, 1.0)

    def stored(x: torch.Tensor, scale_: float) -> torch.Tensor:
        return (x / scale_).to(x.dtype).to(k_cache.dtype) if quantised else x

    heads = qkv.unflatten(1, (-1, head_dim))
    q = rope_neox(heads[:, :num_q_heads], positions, cos_sin_cache)
    roped_k = rope_neox(heads[:, num_q_heads : num_q_heads + num_kv_heads], positions, cos_sin_cache)
    chain_k[step, :rows] = stored(roped_k, k_scale)
    chain_v[step, :rows] = stored(heads[:, num_q_heads + num_kv_heads :], v_scale)
    group = num_q_heads // num_kv_heads
    for r in range(rows):
        b = r // topk
        slots = req_to_token[req_pool_indices[b], : int(seq_lens[b])].long()
        keys = torch.cat((k_cache[slots], chain_k[: step + 1, r])).float().repeat_interleave(group, dim=1) * k_scale
        values = torch.cat((v_cache[slots], chain_v[: step + 1, r])).float().repeat_interleave(group, dim=1) * v_scale
        scores = torch.einsum("hd,nhd->hn", q[r].float(), keys) * scale
        out[r] = torch.einsum("hn,nhd->hd", scores.softmax(dim=-1), values).flatten().to(out.dtype)
    return out
