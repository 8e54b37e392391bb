"""PyTorch twin of :class:`sgl_eagle_triton.drafter.FusedDrafter`: SGLang's EAGLE draft of one decode
cycle (``select_top_k_tokens`` / draft forward per step, ``organize_draft_results``), composed from the
per-op twins. Takes the same :class:`~sgl_eagle_triton.drafter.DraftWeights`."""

import torch

from sgl_eagle_triton.devtools.reference.draft_attention import draft_attention, rope_neox
from sgl_eagle_triton.devtools.reference.draft_select import organize, select_step
from sgl_eagle_triton.devtools.reference.linear import linear, rms_norm
from sgl_eagle_triton.devtools.reference.lm_head_topk import lm_head_logits, lm_head_topk


def _gap(values: torch.Tensor, k: int) -> torch.Tensor:
    """Relative gap between the ``k``-th and ``k+1``-th largest of each row of ``values`` (inf if none)."""
    if values.shape[-1] <= k:
        return torch.full(values.shape[:-1], float("inf"), device=values.device)
    top = values.topk(k + 1, dim=-1).values.double()
    return (top[..., k - 1] - top[..., k]) / top[..., k - 1].abs().clamp_min(1e-300)


def layer_input(w, input_ids, hidden):
    """``(x, residual)``: the draft layer's input rows for tokens ``input_ids`` with carried hidden states ``hidden``
    (EAGLE-3: ``[input_norm(embed); hidden_norm(hidden)]``, the residual the hidden state; EAGLE-1: ``fc([embed;
    hidden])``, also the residual)."""
    embeds = w.embed[input_ids]
    if w.eagle3:
        x = torch.cat((rms_norm(embeds, w.input_norm, w.eps), rms_norm(hidden, w.hidden_norm, w.eps)), dim=-1)
        return x, hidden
    x, _ = linear(torch.cat((embeds, hidden), dim=-1), w.fc, bias=w.fc_bias)
    return x, x


def draft_step(w, input_ids, hidden, positions, step, topk, kv, chain_k, chain_v, margins=None):
    """One draft forward: ``(topk_p [R, k], topk_index [R, k] target ids, new hidden [R, H])``.

    kv = (k_cache, v_cache, req_to_token, req_pool_indices, seq_lens[, k_scale, v_scale]) as for the attention
    twin (the scales of an FP8 pool; 1 when left out); chain_k / chain_v in the pool's dtype. ``margins``:
    a list that receives each row's relative gap between its ``k``-th and ``k+1``-th probability [R]."""
    x, residual = layer_input(w, input_ids, hidden)
    qkv, _ = linear(x, w.qkv, bias=w.qkv_bias)
    attn = torch.empty(qkv.shape[0], w.num_q_heads * w.head_dim, dtype=qkv.dtype, device=qkv.device)
    draft_attention(qkv, positions, w.rotary.cos_sin_cache, *kv[:5], chain_k, chain_v, step, topk,
                    w.num_q_heads, w.num_kv_heads, w.head_dim, w.head_dim**-0.5, attn, *kv[5:7])
    h1, h1_sum = linear(attn, w.o_proj, bias=w.o_bias, residual=residual)
    act, _ = linear(h1_sum, w.gate_up, norm_weight=w.post_norm, eps=w.eps, silu_mul=True)
    s, s_sum = linear(act, w.down, residual=h1)
    head_in, norm = (s_sum, dict(norm_weight=w.final_norm, eps=w.eps)) if w.eagle3 else (s, {})
    p, index = lm_head_topk(head_in, w.lm_head, topk, token_map=w.token_map, **norm)
    if margins is not None:
        margins.append(_gap(torch.softmax(lm_head_logits(head_in, w.lm_head, **norm), dim=-1), topk))
    return p, index, s


def draft_kv(w, input_ids, hidden, positions):
    """Twin of :meth:`FusedDrafter.draft_kv`: the draft layer's roped K and V [bs, Hkv, D] of one token per request
    (the first part of :func:`draft_step`)."""
    x, _ = layer_input(w, input_ids, hidden)
    qkv, _ = linear(x, w.qkv, bias=w.qkv_bias)
    q_size, kv_size = w.num_q_heads * w.head_dim, w.num_kv_heads * w.head_dim
    k = qkv[:, q_size:q_size + kv_size].unflatten(1, (w.num_kv_heads, w.head_dim))
    v = qkv[:, q_size + kv_size:].unflatten(1, (w.num_kv_heads, w.head_dim))
    return rope_neox(k, positions, w.rotary.cos_sin_cache), v


def draft(w, topk, num_steps, num_draft_tokens, topk_p, topk_index, hidden, positions, kv, forward=None):
    """``(parent_list, top_scores_index, draft_tokens, all_scores)`` and ``positions`` advanced by ``S - 1`` in place;
    arguments as :meth:`FusedDrafter.draft` with kv as for :func:`draft_step`.

    ``forward(step, input_ids, hidden_rows, positions)``, if given, replaces the twin's own draft forward and
    returns its ``(p, index, new hidden)``: a test feeds the twin's selection another drafter's forwards."""
    bs = topk_p.shape[0]
    chain_k = torch.empty(max(num_steps - 1, 1), bs * topk, w.num_kv_heads, w.head_dim, dtype=kv[0].dtype,
                          device=hidden.device)
    chain_v = torch.empty_like(chain_k)
    p, index = topk_p, (w.token_map[topk_index] if w.token_map is not None else topk_index)
    scores, score_list, token_list, parents_list = None, [], [], []
    for step in range(num_steps):
        input_ids, hidden_rows, scores, cand_scores, cand_tokens, parents = select_step(step, p, index, scores, topk)
        score_list.append(cand_scores)
        token_list.append(cand_tokens)
        parents_list.append(parents)
        if step == num_steps - 1:
            break
        if forward is not None:
            p, index, hidden = forward(step, input_ids, hidden_rows, positions + step)
        else:
            p, index, hidden = draft_step(w, input_ids, hidden[hidden_rows], positions + step, step, topk, kv,
                                          chain_k, chain_v)
    positions += num_steps - 1
    return (*organize(score_list, token_list, parents_list, num_draft_tokens), torch.cat(score_list, dim=1))


def draft_extend(w, input_ids, hidden, seq_lens, accept_lens, kv, out_cache_loc, topk, margins=None):
    """Twin of :meth:`FusedDrafter.draft_extend` as SGLang's V2 ``_draft_extend_for_decode`` computes it for a
    chain: the draft layer over every one of each request's ``n`` rows (token ``input_ids[b, j]`` at position
    ``seq_lens[b] + j``, carried hidden state ``hidden[b, j]``), their K / V stored at ``out_cache_loc[b, j]`` of the
    pool, each row attending causally over the request's pool positions up to its own; then the row of the last
    accepted token (``accept_lens[b] - 1``) gives the next draft's input: ``(topk_p [bs, topk], topk_index [bs,
    topk] draft vocabulary, hidden [bs, H])``, ``topk_p`` ones at ``topk`` 1 (SGLang's argmax).

    kv = (k_cache, v_cache, req_to_token, req_pool_indices[, k_scale, v_scale]): written in place (a 16-bit pool, or
    FP8 as SGLang's ``set_kv_buffer`` stores it). All rows run the whole layer, as SGLang's extend does; only the
    selected one's outputs are returned. ``margins``: a list that receives the selected rows' relative gap between
    their ``topk``-th and ``topk + 1``-th probability [bs] (as :func:`draft_step`)."""
    k_cache, v_cache, req_to_token, req_pool_indices = kv[:4]
    k_scale, v_scale = (kv[4], kv[5]) if len(kv) > 4 else (1.0, 1.0)
    quantised = k_cache.dtype != w.dtype
    bs, n = input_ids.shape
    Hq, Hkv, D = w.num_q_heads, w.num_kv_heads, w.head_dim
    ids, carried = input_ids.reshape(-1), hidden.reshape(bs * n, -1)
    positions = (seq_lens[:, None] + torch.arange(n, device=seq_lens.device)).reshape(-1)
    x, residual = layer_input(w, ids, carried)
    qkv, _ = linear(x, w.qkv, bias=w.qkv_bias)
    heads = qkv.unflatten(1, (-1, D))
    q = rope_neox(heads[:, :Hq], positions, w.rotary.cos_sin_cache)
    k = rope_neox(heads[:, Hq:Hq + Hkv], positions, w.rotary.cos_sin_cache)
    v = heads[:, Hq + Hkv:]
    slots = out_cache_loc.reshape(-1).long()
    k_cache[slots] = (k / k_scale).to(w.dtype).to(k_cache.dtype) if quantised else k
    v_cache[slots] = (v / v_scale).to(w.dtype).to(v_cache.dtype) if quantised else v
    attn = torch.empty(bs * n, Hq * D, dtype=w.dtype, device=qkv.device)
    for r in range(bs * n):
        pool = req_to_token[req_pool_indices[r // n], : positions[r] + 1].long()
        keys = k_cache[pool].float() * (k_scale if quantised else 1.0)  # [L, Hkv, D]
        values = v_cache[pool].float() * (v_scale if quantised else 1.0)
        kv_head = torch.arange(Hq, device=qkv.device) // (Hq // Hkv)
        scores = torch.einsum("hd,lhd->hl", q[r].float(), keys[:, kv_head]) * D**-0.5
        attn[r] = torch.einsum("hl,lhd->hd", scores.softmax(dim=-1), values[:, kv_head]).reshape(-1).to(w.dtype)
    h1, h1_sum = linear(attn, w.o_proj, bias=w.o_bias, residual=residual)
    act, _ = linear(h1_sum, w.gate_up, norm_weight=w.post_norm, eps=w.eps, silu_mul=True)
    s, s_sum = linear(act, w.down, residual=h1)
    selected = torch.arange(bs, device=ids.device) * n + accept_lens.long() - 1
    head_in, norm = (s_sum, dict(norm_weight=w.final_norm, eps=w.eps)) if w.eagle3 else (s, {})
    p, index = lm_head_topk(head_in[selected], w.lm_head, topk, **norm)
    if margins is not None:
        margins.append(_gap(torch.softmax(lm_head_logits(head_in[selected], w.lm_head, **norm), dim=-1), topk))
    return (torch.ones_like(p) if topk == 1 else p), index, s[selected]
