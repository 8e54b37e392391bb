"""Tie-aware greedy equality (see docs/losslessness.md).

Speculative and plain decoding round bf16 differently (the verify pass computes positions with
another kernel shape), so at a near-tie of the target's top-2 logits either token is the target's
greedy choice. A speculative output is lossless for a prompt if its token ids equal the no-spec
ids, or if at the first differing position it chose a token whose no-spec log-prob is within what
correct changes of kernel arithmetic were measured to move the greedy token against a rival
(``TIE_MARGIN`` below the no-spec top-1). A divergence to a token further below, or to one the
no-spec run did not list among its ``TOP_LOGPROBS`` best, is a bug.
"""

from __future__ import annotations

from dataclasses import dataclass

# log-prob units: the most a single correct change of kernel arithmetic (tiling, bf16 probabilities, split-KV, exp2,
# partial sums, prefill shapes) lowered the tiny target's greedy token against its best rival, measured on the CPU
# over 2048 positions x 6 variants (bench/results/2026-11-27-cpu-margin-shift.md; flips seen up to 0.375 there and
# 0.3125 on GPUs). docs/losslessness.md.
TIE_MARGIN = 0.625
# alternatives the no-spec run lists per position: more than two, as bf16 logits tie three ways and more (the random
# target ties at most positions; GPU runs of 2026-11-27 departed to a third token at exact top-1/top-2 ties)
TOP_LOGPROBS = 8


@dataclass
class Verdict:
    kind: str  # "identical" | "tie" | "bug"
    index: int = -1  # first differing position
    margin: float = 0.0  # no-spec top-1 log-prob minus the departing token's there (a lower bound where unlisted)
    rank: int = -1  # the departing token's place in the no-spec list (0 = listed first); -1 unlisted or none


def tie_aware_compare(spec_ids: list[int], nospec_ids: list[int],
                      nospec_top: list[list[tuple[float, int]]]) -> Verdict:
    """``nospec_top[i]`` holds the no-spec run's best (log-prob, token id) at output position ``i``, best
    first (:func:`top_logprobs`). Where the speculative output ends first, the no-spec top-1/top-2 margin
    decides."""
    if spec_ids == nospec_ids:
        return Verdict("identical")
    pairs = enumerate(zip(spec_ids, nospec_ids, strict=False))
    i = next((j for j, (a, b) in pairs if a != b), min(len(spec_ids), len(nospec_ids)))
    if i >= len(nospec_top):
        return Verdict("bug", i, float("inf"))
    listed = nospec_top[i]
    if len(listed) < 2:
        return Verdict("bug", i, float("inf"))
    top1 = max(lp for lp, _ in listed)
    if i >= len(spec_ids):
        margin = top1 - sorted(lp for lp, _ in listed)[-2]
        return Verdict("tie" if margin <= TIE_MARGIN else "bug", i, margin)
    # SGLang lists by torch.topk, whose order at an exact tie need not be argmax's (the greedy token): the rule reads
    # log-probs, never the order
    rank = next((r for r, (_, tok) in enumerate(listed) if tok == spec_ids[i]), -1)
    if rank < 0:
        return Verdict("bug", i, top1 - min(lp for lp, _ in listed), -1)
    margin = top1 - listed[rank][0]
    return Verdict("tie" if margin <= TIE_MARGIN else "bug", i, margin, rank)


def top_logprobs(meta_info: dict) -> list[list[tuple[float, int]]]:
    """The listed best (log-prob, token id) per output position from SGLang's ``/generate`` meta_info (whose
    entries are ``(logprob, token_id, text)``; ask for ``top_logprobs_num=TOP_LOGPROBS``)."""
    return [[(entry[0], entry[1]) for entry in position] for position in meta_info["output_top_logprobs"]]
