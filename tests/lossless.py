"""Tie-aware greedy equality (see docs/losslessness.md).

Speculative and plain decoding round bf16 differently (the verify pass computes positions with
another kernel shape), so at a near-tie of the target's top-2 logits either token is the target's
greedy choice. A speculative output is lossless for a prompt if its token ids equal the no-spec
ids, or if at the first differing position it chose the no-spec run's runner-up (one of its two
best) and the no-spec top-1/top-2 log-prob margin is within what correct changes of kernel
arithmetic were measured to move it. A divergence at a larger margin, or to any other token, is a
bug.
"""

from __future__ import annotations

from dataclasses import dataclass

# log-prob units: the most a single correct change of kernel arithmetic (tiling, bf16 probabilities, split-KV, exp2,
# partial sums, prefill shapes) lowered the tiny target's greedy token against its best rival, measured on the CPU
# over 2048 positions x 6 variants (bench/results/2026-11-27-cpu-margin-shift.md; flips seen up to 0.375 there and
# 0.3125 on GPUs). docs/losslessness.md.
TIE_MARGIN = 0.625


@dataclass
class Verdict:
    kind: str  # "identical" | "tie" | "bug"
    index: int = -1  # first differing position
    margin: float = 0.0  # no-spec top-1 minus top-2 log-prob there


def tie_aware_compare(spec_ids: list[int], nospec_ids: list[int],
                      nospec_top2: list[list[tuple[float, int]]]) -> Verdict:
    """``nospec_top2[i]`` holds the no-spec run's two best (log-prob, token id) at output position ``i``
    (:func:`top2_logprobs`). Where the speculative output ends first, the margin alone decides."""
    if spec_ids == nospec_ids:
        return Verdict("identical")
    pairs = enumerate(zip(spec_ids, nospec_ids, strict=False))
    i = next((j for j, (a, b) in pairs if a != b), min(len(spec_ids), len(nospec_ids)))
    if i >= len(nospec_top2):
        return Verdict("bug", i, float("inf"))
    (top1, first), (top2, second) = nospec_top2[i]
    margin = top1 - top2
    # SGLang lists the two best by torch.topk, whose order at an exact tie need not be argmax's (the greedy token)
    flipped = i >= len(spec_ids) or spec_ids[i] in (first, second)
    return Verdict("tie" if margin <= TIE_MARGIN and flipped else "bug", i, margin)


def top2_logprobs(meta_info: dict) -> list[list[tuple[float, int]]]:
    """The two best (log-prob, token id) per output position from SGLang's ``/generate`` meta_info (whose
    entries are ``(logprob, token_id, text)``)."""
    return [[(entry[0], entry[1]) for entry in position[:2]] for position in meta_info["output_top_logprobs"]]
