"""Plain-PyTorch twin of ``kernels.lm_head_topk``: the draft model's last step, from hidden states to the
``topk`` most probable tokens, as SGLang's EAGLE drafter computes it (final RMSNorm, LM head in the model's
dtype (bf16 or fp16, the weight's), ``.float()``, softmax, top-k, ``hot_token_id``), with the full logits
materialised.
"""

import torch

from sgl_eagle_triton.reference.rms_norm import rms_norm


def lm_head_input(x: torch.Tensor, weight: torch.Tensor, norm_weight: torch.Tensor | None = None,
                  eps: float = 1e-6) -> torch.Tensor:
    """``z`` [R, H] in the weight's dtype: SGLang's RMSNorm of ``x``
    (:func:`sgl_eagle_triton.reference.rms_norm.rms_norm`), or ``x`` in that dtype."""
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
