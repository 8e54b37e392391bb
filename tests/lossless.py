"""Tie-aware greedy equality (see docs/losslessness.md).

Speculative and plain decoding round bf16 differently (the verify pass computes positions with
another kernel shape), so at a near-tie of the target's top-2 logits either token is the target's
greedy choice. A speculative output is lossless for a prompt if its token ids equal the no-spec
ids, or if at the first differing position the no-spec top-1/top-2 log-prob margin is within a
few bf16 ulps. A divergence at a larger margin is a bug.
"""

from __future__ import annotations

from dataclasses import dataclass

TIE_MARGIN = 0.25  # log-prob units; bf16 spacing near logits of ~10 is 0.0625


@dataclass
class Verdict:
    kind: str  # "identical" | "tie" | "bug"
    index: int = -1  # first differing position
    margin: float = 0.0  # no-spec top-1 minus top-2 log-prob there


def tie_aware_compare(spec_ids: list[int], nospec_ids: list[int], nospec_top2: list[list[float]]) -> Verdict:
    """``nospec_top2[i]`` holds the no-spec run's two best log-probs at output position ``i``."""
    if spec_ids == nospec_ids:
        return Verdict("identical")
    pairs = enumerate(zip(spec_ids, nospec_ids, strict=False))
    i = next((j for j, (a, b) in pairs if a != b), min(len(spec_ids), len(nospec_ids)))
    if i >= len(nospec_top2):
        return Verdict("bug", i, float("inf"))
    top1, top2 = nospec_top2[i]
    margin = top1 - top2
    return Verdict("tie" if margin <= TIE_MARGIN else "bug", i, margin)


def top2_logprobs(meta_info: dict) -> list[list[float]]:
    """The two best log-probs per output position from SGLang's ``/generate`` meta_info."""
    return [[entry[0] for entry in position[:2]] for position in meta_info["output_top_logprobs"]]
