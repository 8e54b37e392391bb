"""Tie-aware greedy equality (see docs/losslessness.md).

Speculative and plain decoding round bf16 differently (the verify pass computes positions with
another kernel shape), so at a near-tie of the target's top-2 logits either token is the target's
greedy choice. A speculative output is lossless for a prompt if its token ids equal the no-spec
ids, or if at the first differing position it chose the no-spec run's runner-up and the no-spec
top-1/top-2 log-prob margin is within a few bf16 ulps. A divergence at a larger margin, or to any
other token, is a bug.
"""

from __future__ import annotations

from dataclasses import dataclass

# log-prob units. Correct changes of kernel arithmetic flipped the tiny target's greedy token at no-spec margins up
# to 0.375 on the CPU and 0.3125 on GPUs, never from 0.5625 on (bench/results/2026-11-27-cpu-margin-shift.md);
# 0.5 is the largest of those plus one bf16 step at its logits (0.125 at 16-32). docs/losslessness.md.
TIE_MARGIN = 0.5


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
    (top1, _), (top2, runner_up) = nospec_top2[i]
    margin = top1 - top2
    flipped = i >= len(spec_ids) or spec_ids[i] == runner_up
    return Verdict("tie" if margin <= TIE_MARGIN and flipped else "bug", i, margin)


def top2_logprobs(meta_info: dict) -> list[list[tuple[float, int]]]:
    """The two best (log-prob, token id) per output position from SGLang's ``/generate`` meta_info (whose
    entries are ``(logprob, token_id, text)``)."""
    return [[(entry[0], entry[1]) for entry in position[:2]] for position in meta_info["output_top_logprobs"]]
