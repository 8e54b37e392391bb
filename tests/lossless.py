"""Tie-aware greedy equality (see docs/losslessness.md).

Speculative and plain decoding round bf16 differently (the verify pass computes positions with
another kernel shape), so at a near-tie of the target's best logits any tied token is the target's
greedy choice. A speculative output is lossless for a prompt if its token ids equal the no-spec
ids, or if at the first differing position it chose a token whose no-spec log-prob is within what
correct changes of kernel arithmetic were measured to move the greedy token against a rival
(``TIE_MARGIN`` below the no-spec top-1). A divergence to a token further below, or to one the
no-spec run did not list among its ``TOP_LOGPROBS`` best, is a bug.

That judges each output up to its first departure. :func:`rescore_body` / :func:`deficits` judge every token:
the no-spec server teacher-forces prompt + output in one prefill, and a token more than ``TIE_MARGIN`` below
the target's best there is a bug wherever it stands. The no-spec output itself, rescored the same way, is the
control: prefill and decode round differently too (and an FP8 KV cache is read by decode, not by the one
prefill), so the bound is the larger of ``TIE_MARGIN`` and the control's largest deficit.
"""

from __future__ import annotations

from dataclasses import dataclass

# log-prob units: the most a single correct change of kernel arithmetic (tiling, bf16 probabilities, split-KV, exp2,
# partial sums, prefill shapes) lowered the tiny target's greedy token against its best rival, measured on the CPU
# over 2048 positions x 6 variants (bench/results/2026-11-27-cpu-margin-shift.md; flips seen up to 0.375 there and
# 0.3125 on GPUs). docs/losslessness.md.
TIE_MARGIN = 0.625
# the most a no-spec output token may lie below the target's best when rescored (tests/e2e.rescore): beyond it the
# rescoring itself is suspect (prompt ids, alignment); twice what one arithmetic change was measured to move
CONTROL_CEILING = 2 * TIE_MARGIN
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
                      nospec_top: list[list[tuple[float, int]]], unlisted: str = "bug") -> Verdict:
    """``nospec_top[i]`` holds the no-spec run's best (log-prob, token id) at output position ``i``, best
    first (:func:`top_logprobs`). Where the speculative output ends first, the no-spec top-1/top-2 margin
    decides. A departing token the list does not hold while its last entry is still within ``TIE_MARGIN``
    of the top-1 (more near-ties than listed: the random target) cannot be judged from the list: its verdict is
    ``unlisted`` ("tie" where the rescoring judges that token, tests/e2e.verdicts)."""
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
        floor = top1 - min(lp for lp, _ in listed)
        return Verdict(unlisted if floor <= TIE_MARGIN else "bug", i, floor, -1)
    margin = top1 - listed[rank][0]
    return Verdict("tie" if margin <= TIE_MARGIN else "bug", i, margin, rank)


def top_logprobs(meta_info: dict) -> list[list[tuple[float, int]]]:
    """The listed best (log-prob, token id) per output position from SGLang's ``/generate`` meta_info (whose
    entries are ``(logprob, token_id, text)``; ask for ``top_logprobs_num=TOP_LOGPROBS``)."""
    return [[(entry[0], entry[1]) for entry in position] for position in meta_info["output_top_logprobs"]]


def rescore_body(prompt_ids: list[int], output_ids: list[int]) -> dict:
    """A ``/generate`` request that teacher-forces ``prompt_ids + output_ids`` through the no-spec server in one
    prefill and returns, for every output position, the log-prob of the output token and the target's best
    (``logprob_start_len`` = the last prompt token: SGLang lists a None, then one entry per later input token)."""
    return {"input_ids": [*prompt_ids, *output_ids], "return_logprob": True, "top_logprobs_num": 1,
            "logprob_start_len": len(prompt_ids) - 1,
            "sampling_params": {"temperature": 0, "max_new_tokens": 1, "ignore_eos": True}}


def deficits(meta_info: dict, output_ids: list[int]) -> list[float]:
    """Per output token, the target's top-1 log-prob minus the token's (0 where the token is its argmax), from the
    response to :func:`rescore_body`; raises if the response does not list ``output_ids``. SGLang 0.5.17 lists the
    id ``vocab_size - 1`` as 0 (``logprob_result_processor``: ``x if x < vocab_size - 1 else 0``) while scoring
    the real token: a listed 0 matches any id."""
    tokens, top = meta_info["input_token_logprobs"][1:], meta_info["input_top_logprobs"][1:]
    listed = [entry[1] for entry in tokens]
    if len(listed) != len(output_ids) or any(a not in (b, 0) for a, b in zip(listed, output_ids, strict=True)):
        raise ValueError(f"rescoring listed other tokens than the output: {listed[:8]}... vs {output_ids[:8]}...")
    return [max(best[0][0] - entry[0], 0.0) for entry, best in zip(tokens, top, strict=True)]


def rescored_bugs(deficits_by_prompt: list[list[float]], bound: float = TIE_MARGIN) -> list[tuple[int, int, float]]:
    """(prompt, position, deficit) wherever an output token lies more than ``bound`` below the target's best."""
    return [(i, j, d) for i, row in enumerate(deficits_by_prompt) for j, d in enumerate(row) if d > bound]
