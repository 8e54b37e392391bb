"""Plain-PyTorch twin of ``kernels.lm_head_topk``: the draft model's last step, from hidden states to the
``topk`` most probable tokens, as SGLang's EAGLE drafter computes it (final RMSNorm, LM head in the model's
dtype (bf16 or fp16, the weight's), ``.float()``, softmax, top-k, ``hot_token_id``), with the full logits
materialised.
"""

import torch

from sgl_eagle_triton.devtools.reference.rms_norm import rms_norm


def lm_head_input(x: torch.Tensor, weight: torch.Tensor, norm_weight: torch.Tensor | None = None,
                  eps: float = 1e-6) -> torch.Tensor:
    """``z`` [R, H] in the weight's dtype: SGLang's RMSNorm of ``x``
    (:func:`sgl_eagle_triton.devtools.reference.rms_norm.rms_norm`), or ``x`` in that dtype."""
    return x.to(weight.dtype) if norm_weight is None else rms_norm(x, norm_weight, eps)


def lm_head_logits(
    x: torch.Tensor, weight: torch.Tensor, norm_weight: torch.Tensor | None = None, eps: float = 1e-6
) -> torch.Tensor:
    """[R, V] fp32 logits holding values of the weight's dtype: ``z @ weight.T`` summed in fp32, rounded to that
    dtype (SGLang's GEMM output, whose summation order differs), then ``.float()``."""
    return (lm_head_input(x, weight, norm_weight, eps).float() @ weight.float().T).to(weight.dtype).float()


def lm_head_topk(
    x: torch.Tensor,
    weight: torch.Tensor,
    topk: int,
    norm_weight: torch.Tensor | None = None,
    eps: float = 1e-6,
    token_map: torch.Tensor | None = None,
    out_p: torch.Tensor | None = None,
    out_index: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Same arguments and results as ``sgl_eagle_triton.kernels.lm_head_topk.lm_head_topk``.

    Ranks follow the logits, the lower id first on equal logits (a stable sort), so they are also ranks of
    ``p = softmax(logits)``; ``torch.topk`` of ``p``, as SGLang calls it, leaves ties in any order.
    """
    logits = lm_head_logits(x, weight, norm_weight, eps)
    ids = torch.sort(logits, dim=-1, descending=True, stable=True).indices[:, :topk].contiguous()
    topk_p = torch.softmax(logits, dim=-1).gather(-1, ids)
    topk_index = token_map[ids] if token_map is not None else ids
    if out_p is not None:
        topk_p = out_p.copy_(topk_p)
    if out_index is not None:
        topk_index = out_index.copy_(topk_index)
    return topk_p, topk_index


def encode_keys(logits: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    """The kernels' int64 candidate keys: the order-preserving int32 image of each fp32 logit in the high half,
    ``2**32 - 1 - id`` in the low half (a larger key: a larger logit or, on equal logits, the lower id)."""
    bits = logits.float().contiguous().view(torch.int32).long()
    ordered = bits ^ ((bits >> 31) & 0x7FFFFFFF)
    return (ordered << 32) | (0xFFFFFFFF - ids.long())


def decode_keys(keys: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(fp32 logits, int64 ids)`` of :func:`encode_keys`'s keys."""
    ordered = keys >> 32
    bits = (ordered ^ ((ordered >> 31) & 0x7FFFFFFF)).to(torch.int32)
    return bits.view(torch.float32), 0xFFFFFFFF - (keys & 0xFFFFFFFF)


KEY_MIN = -(2**63)


def lm_head_topk_shard(x, weight, topk, norm_weight=None, eps=1e-6, vocab_offset=0, valid=None):
    """Same arguments and results as ``kernels.lm_head_topk.lm_head_topk_shard``: ``(keys [R, topk], sum [R])``,
    the shard's best candidates (global ids ``vocab_offset + row``; rows from ``valid`` on excluded) and
    ``sum(exp(logit - best))`` over its real rows (0 for a shard of padding only)."""
    valid = weight.shape[0] if valid is None else valid
    logits = lm_head_logits(x, weight, norm_weight, eps)[:, :valid]
    R = logits.shape[0]
    keys = torch.full((R, topk), KEY_MIN, dtype=torch.int64)
    total = torch.zeros(R)
    if valid:
        all_keys = encode_keys(logits, torch.arange(valid) + vocab_offset)
        best = all_keys.sort(dim=-1, descending=True).values[:, :topk]
        keys[:, : best.shape[1]] = best
        total = torch.exp(logits - logits.max(dim=-1, keepdim=True).values).sum(-1)
    return keys, total


def merge_shards(keys, sums, shard_size, topk, token_map=None):
    """Same arguments and results as ``kernels.lm_head_topk.merge_shards`` (CPU tensors): the ranks' best
    candidates merged by key, ``p = exp(logit - M) / sum_r(sum_r * exp(M_r - M))``."""
    tp, R, _ = keys.shape
    flat = keys.permute(1, 0, 2).reshape(R, -1)
    top = flat.sort(dim=-1, descending=True).values[:, :topk]
    logit, ids = decode_keys(top)
    rank_max, _ = decode_keys(keys[:, :, 0])  # [tp, R]
    real = keys[:, :, 0] != KEY_MIN
    row_max = logit[:, :1]
    total = torch.where(real, sums * torch.exp(rank_max - row_max.T), 0.0).sum(0)
    p = torch.exp(logit - row_max) / total[:, None]
    return p, (token_map[ids] if token_map is not None else ids)
