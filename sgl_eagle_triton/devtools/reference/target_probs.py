"""Plain-PyTorch twin of ``kernels.target_probs``: the target distribution of sampled verification.

Sort-based and computed in float64, straight from the definitions: per row ``p = softmax(logits / T)``;
token ``i`` is kept iff ``count(p_j > p_i) < top_k`` and ``sum(p_j for p_j > p_i) <= top_p`` and
``p_i >= min_p * max(p)`` (joint filters, as SGLang's non-speculative sampler); kept ``p`` are
renormalised, the rest are 0; rows with ``top_k == 1`` (greedy) are one-hot at the first argmax. The
Triton kernel decides ties and thresholds on float32 values instead, so
the two can disagree only where a decision is within float32 rounding of its threshold.
"""

import torch


def keep_mask(p: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor, min_p: torch.Tensor) -> torch.Tensor:
    """[R, V] bool: the kept tokens of probability rows ``p`` [R, V] under per-row ``top_k``, ``top_p``,
    ``min_p`` (each [R])."""
    sorted_p, order = p.sort(dim=-1, descending=True, stable=True)
    # For each sorted position, the first position holding the same value: its index is the number of
    # strictly larger probabilities, and the exclusive prefix sum there is their mass.
    first = torch.searchsorted(-sorted_p, -sorted_p, right=False)
    exclusive = torch.cumsum(sorted_p, dim=-1) - sorted_p
    count_greater = first
    mass_greater = exclusive.gather(-1, first)
    keep_sorted = (
        (count_greater < top_k[:, None])
        & (mass_greater <= top_p[:, None])
        & (sorted_p >= min_p[:, None] * sorted_p[:, :1])
    )
    return torch.zeros_like(keep_sorted).scatter(-1, order, keep_sorted)


def prepare_target_probs(
    logits: torch.Tensor,
    temperatures: torch.Tensor,
    top_ks: torch.Tensor,
    top_ps: torch.Tensor,
    min_ps: torch.Tensor,
    rows_per_request: int,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """Same arguments and result as ``sgl_eagle_triton.kernels.target_probs.prepare_target_probs``
    (float32 result; computed in float64)."""
    R, _ = logits.shape
    request = torch.arange(R, device=logits.device) // rows_per_request

    def per_row(t):
        return t.reshape(-1)[request].double()

    p = torch.softmax(logits.double() / per_row(temperatures)[:, None], dim=-1)
    keep = keep_mask(p, per_row(top_ks), per_row(top_ps), per_row(min_ps))
    kept = torch.where(keep, p, 0.0)
    probs = (kept / kept.sum(dim=-1, keepdim=True)).float()
    greedy = per_row(top_ks) == 1  # one-hot at the first argmax, the token greedy decoding picks
    first_argmax = (logits.double() / per_row(temperatures)[:, None]).argmax(-1, keepdim=True)
    one_hot = torch.zeros_like(probs).scatter_(-1, first_argmax, 1.0)
    probs = torch.where(greedy[:, None], one_hot, probs)
    if out is None:
        return probs
    return out.copy_(probs)
