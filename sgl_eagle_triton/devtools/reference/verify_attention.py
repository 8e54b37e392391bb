"""Plain-PyTorch twin of :mod:`sgl_eagle_triton.kernels.verify_attention` (the same arguments; fp32 math on the
inputs' values, one request at a time; ``dtype=torch.float64``: the exact attention bench.verify_accuracy measures
errors against)."""

import torch


def verify_attention(q, k_extend, v_extend, o, k_buffer, v_buffer, qo_indptr, kv_indptr, kv_indices, custom_mask,
                     mask_indptr, max_len_extend: int, sm_scale: float, k_scale: float = 1.0, v_scale: float = 1.0,
                     logit_cap: float = 0.0, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Request b's draft tokens attend its prefix (all of it) and the draft tokens its mask row allows (causal
    without a mask); scores ``q.k * sm_scale`` (prefix: also ``* k_scale``), capped by ``logit_cap * tanh(s /
    logit_cap)`` when ``logit_cap > 0``; the prefix's values scaled by ``v_scale``; all in ``dtype``. Writes ``o``
    and returns it."""
    group = q.shape[1] // k_extend.shape[1]
    for b in range(qo_indptr.shape[0] - 1):
        q0, q1 = int(qo_indptr[b]), int(qo_indptr[b + 1])
        k0, k1 = int(kv_indptr[b]), int(kv_indptr[b + 1])
        n, prefix = q1 - q0, k1 - k0
        slots = kv_indices[k0:k1].long()
        keys = torch.cat([k_buffer[slots].to(dtype), k_extend[q0:q1].to(dtype)]).repeat_interleave(group, dim=1)
        values = torch.cat([v_buffer[slots].to(dtype) * v_scale, v_extend[q0:q1].to(dtype)]).repeat_interleave(group,
                                                                                                              dim=1)
        scores = torch.einsum("ihd,jhd->hij", q[q0:q1].to(dtype), keys) * sm_scale
        scores[:, :, :prefix] *= k_scale
        if logit_cap > 0:
            scores = logit_cap * torch.tanh(scores / logit_cap)
        if custom_mask is not None:
            start = int(mask_indptr[b])
            tree = custom_mask[start:start + n * (prefix + n)].view(n, prefix + n)[:, prefix:].bool()
        else:
            tree = torch.ones(n, n, dtype=torch.bool).tril()
        allowed = torch.cat([torch.ones(n, prefix, dtype=torch.bool), tree.cpu()], dim=1).to(scores.device)
        scores = scores.masked_fill(~allowed, float("-inf"))
        o[q0:q1] = torch.einsum("hij,jhd->ihd", scores.softmax(dim=-1), values).to(o.dtype)
    return o
