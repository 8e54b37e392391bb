"""The tie-aware equality rule the e2e test applies (tests/lossless.py)."""

import pytest

from tests.lossless import TIE_MARGIN, tie_aware_compare, top_logprobs

# no-spec ids 5, 6, 7; position 1 a near-tie of three (6, 9, 3 within 0.6), 2 listed best first
TOP = [[(-0.1, 5), (-3.0, 8), (-3.5, 2)], [(-0.7, 6), (-0.75, 9), (-1.3, 3), (-1.4, 4)], [(-0.2, 7), (-2.0, 4)]]


def test_identical():
    assert tie_aware_compare([5, 6, 7], [5, 6, 7], TOP).kind == "identical"


def test_divergence_at_near_tie_is_allowed():
    v = tie_aware_compare([5, 9, 1], [5, 6, 7], TOP)
    assert (v.kind, v.index, v.rank) == ("tie", 1, 1) and abs(v.margin - 0.05) < 1e-9


def test_divergence_to_a_third_token_within_the_margin_is_a_tie():
    """bf16 logits tie three ways: a token listed third but within TIE_MARGIN of the top-1 is a tie."""
    v = tie_aware_compare([5, 3], [5, 6, 7], TOP)
    assert (v.kind, v.rank) == ("tie", 2) and abs(v.margin - 0.6) < 1e-9 and v.margin <= TIE_MARGIN


def test_divergence_to_a_listed_token_beyond_the_margin_is_a_bug():
    """Position 1: token 4 is listed, but 0.7 below the top-1 (the runner-up being close does not excuse it)."""
    v = tie_aware_compare([5, 4, 1], [5, 6, 7], TOP)
    assert (v.kind, v.index, v.rank) == ("bug", 1, 3) and abs(v.margin - 0.7) < 1e-9


def test_divergence_to_an_unlisted_token_is_a_bug():
    v = tie_aware_compare([5, 11, 1], [5, 6, 7], TOP)
    assert (v.kind, v.index, v.rank) == ("bug", 1, -1) and abs(v.margin - 0.7) < 1e-9


def test_an_unlisted_token_among_more_near_ties_than_listed_is_left_to_the_rescoring():
    """Every listed token within TIE_MARGIN of the top-1: an unlisted one may be as close. The list cannot judge it;
    where the rescoring measures its exact deficit the caller says "tie", elsewhere it stays a bug."""
    flat = [[(-1.0, 5), (-1.1, 6), (-1.2, 7)]]
    assert tie_aware_compare([9], [5], flat).kind == "bug"
    v = tie_aware_compare([9], [5], flat, unlisted="tie")
    assert (v.kind, v.rank) == ("tie", -1) and abs(v.margin - 0.2) < 1e-9
    assert tie_aware_compare([9], [5], [[(-1.0, 5), (-2.0, 6)]], unlisted="tie").kind == "bug"  # the list decides


def test_the_rescoring_bound_is_the_no_spec_controls_largest_deficit_when_above_the_tie_margin():
    from tests.e2e import verdicts

    top = [[(0.0, 100), (-1.0, 5)]]
    nospec = {"generate": [[100]], "generate_concurrent": [[100]], "top": [top],
              "deficits": {"generate": [[0.9]], "generate_concurrent": [[0.0]]}}
    spec = {"generate": [[100]], "generate_concurrent": [[100]],
            "deficits": {"generate": [[0.8]], "generate_concurrent": [[0.95]]}}
    v = verdicts(spec, nospec)
    assert v["rescored"]["bound"] == 0.9 and v["bugs"] == [("rescored", "generate_concurrent", 0, 0, 0.95)]


def test_outputs_served_for_rescoring_but_not_rescored_are_refused():
    from tests.e2e import verdicts

    served = {"prompts": ["p"], "generate": [[100]], "generate_concurrent": [[100]], "top": [[[(0.0, 100)] * 2]]}
    with pytest.raises(AssertionError, match="did not rescore"):
        verdicts(served, served)


def test_exact_tie_listed_in_either_order_is_a_tie():
    """At an exact tie SGLang's list (torch.topk) may put the rival first, the greedy token second."""
    top = [[(-0.7, 9), (-0.7, 6)]]  # greedy (argmax) took 6
    assert tie_aware_compare([9], [6], top).kind == "tie"


def test_speculative_output_ending_first_at_a_near_tie_is_judged_by_the_margin():
    assert tie_aware_compare([5], [5, 6, 7], TOP).kind == "tie"


def test_divergence_at_clear_margin_is_a_bug():
    v = tie_aware_compare([8, 6, 7], [5, 6, 7], TOP)
    assert (v.kind, v.index, v.rank) == ("bug", 0, 1)


def test_length_mismatch_is_judged_where_it_starts():
    assert tie_aware_compare([5, 6], [5, 6, 7], TOP).kind == "bug"


def test_a_position_listing_fewer_than_two_tokens_is_a_bug_not_a_crash():
    assert tie_aware_compare([5, 9], [5, 6, 7], [[(-0.1, 5), (-3.0, 8)], [(-0.7, 6)]]).kind == "bug"
    assert tie_aware_compare([5], [5, 6], [[(-0.1, 5), (-3.0, 8)], []]).kind == "bug"


def test_top_logprobs_from_meta_info():
    meta = {"output_top_logprobs": [[(-0.1, 5, None), (-3.0, 8, None), (-4.0, 1, None)], [(-0.7, 6, None)]]}
    assert top_logprobs(meta) == [[(-0.1, 5), (-3.0, 8), (-4.0, 1)], [(-0.7, 6)]]


def test_accept_share_follows_the_verify_attention_that_ran():
    """tests.e2e.accept_share: the looser share only where the server says our verify attention ran."""
    from sgl_eagle_triton.config import VERIFY_ATTENTION_IN_USE
    from tests.e2e import ACCEPT_SHARE, accept_share

    assert accept_share({"kernels": {"verify attention": VERIFY_ATTENTION_IN_USE}}) == ACCEPT_SHARE["ours"] == 0.95
    assert accept_share({"kernels": {"verify attention": "SGLang's FlashInferAttnBackend (...)"}}) == 0.98
    assert accept_share({"kernels": {}}) == ACCEPT_SHARE["sglang"]


def test_rescoring_teacher_forces_prompt_and_output_from_the_last_prompt_token():
    from tests.lossless import rescore_body

    body = rescore_body([1, 2, 3], [7, 8])
    assert body["input_ids"] == [1, 2, 3, 7, 8] and body["logprob_start_len"] == 2
    assert body["return_logprob"] and body["top_logprobs_num"] == 1


def test_deficits_read_each_output_tokens_distance_below_the_best():
    """SGLang's answer to rescore_body: a None entry for the last prompt token, then one per output token."""
    from tests.lossless import deficits, rescored_bugs

    meta = {"input_token_logprobs": [[None, 3, None], [-0.5, 7, None], [-1.5, 8, None]],
            "input_top_logprobs": [None, [[-0.5, 7, None]], [[-0.7, 9, None]]]}
    assert deficits(meta, [7, 8]) == [0.0, pytest.approx(0.8)]
    assert rescored_bugs([[0.0, 0.8], [0.1]]) == [(0, 1, 0.8)]  # beyond TIE_MARGIN
    assert rescored_bugs([[0.0, 0.8], [0.1]], bound=1.0) == []  # within a looser control bound
    with pytest.raises(ValueError, match="other tokens"):
        deficits(meta, [7, 9])
    meta["input_token_logprobs"][2][1] = 0  # SGLang lists the id vocab_size - 1 as 0
    assert deficits(meta, [7, 8]) == [0.0, pytest.approx(0.8)]


def test_a_no_spec_token_far_below_the_best_when_rescored_fails_the_control():
    """The control bounds the rescoring: a no-spec output token more than CONTROL_CEILING below the target's best
    means the rescoring itself is off (prompt ids, alignment), and it must not silently loosen the bound."""
    from tests.e2e import verdicts
    from tests.lossless import CONTROL_CEILING

    top = [[(0.0, 100), (-1.0, 5)]]
    nospec = {"generate": [[100]], "generate_concurrent": [[100]], "top": [top],
              "deficits": {"generate": [[CONTROL_CEILING + 0.5]], "generate_concurrent": [[0.0]]}}
    spec = {"generate": [[100]], "generate_concurrent": [[100]], "deficits": {"generate": [[0.0]],
                                                                               "generate_concurrent": [[0.0]]}}
    v = verdicts(spec, nospec)
    assert v["bugs"] == [("rescored-control", "generate", 0, 0, CONTROL_CEILING + 0.5)]


class FakeNoSpec:
    """A no-spec server whose target prefers token 100 + position after any prefix, token 5 tying at position 0."""

    def post_json(self, path, body):
        if path == "/tokenize":
            return {"tokens": [1, 2]}
        ids, start = body["input_ids"], body["logprob_start_len"]
        out = ids[start + 1:]
        tokens = [[None, ids[start], None]]
        tokens += [[0.0 if t == 100 + j or (j, t) == (0, 5) else -1.0, t, None] for j, t in enumerate(out)]
        return {"meta_info": {"input_token_logprobs": tokens,
                              "input_top_logprobs": [None, *([[0.0, 100 + j, None]] for j in range(len(out)))]}}


def test_rescoring_judges_the_tokens_after_a_tie_that_the_first_departure_rule_leaves_unchecked():
    """A speculative output that takes the tied token 5 first, then a token 1.0 below the target's best: the first-
    departure rule calls it a tie; the rescoring finds the bad token."""
    from tests.e2e import rescore, verdicts

    top = [[(0.0, 100), (0.0, 5)], [(0.0, 101), (-1.0, 6)], [(0.0, 102), (-1.0, 6)]]
    nospec = {"prompts": ["p"], "generate": [[100, 101, 102]], "generate_concurrent": [[100, 101, 102]], "top": [top]}
    spec = {"prompts": ["p"], "generate": [[5, 101, 7]], "generate_concurrent": [[100, 101, 102]]}
    results = {"nospec": nospec, "spec": spec}
    rescore(FakeNoSpec(), results)
    assert nospec["deficits"]["generate"] == [[0.0, 0.0, 0.0]] and spec["deficits"]["generate"] == [[0.0, 0.0, 1.0]]
    v = verdicts(spec, nospec)
    assert v["counts"] == {"identical": 1, "tie": 1, "bug": 0} and v["tie_ranks"] == {"1": 1}
    assert v["bugs"] == [("rescored", "generate", 0, 2, 1.0)]
    assert v["rescored"] == {"spec": {"tokens": 6, "off_argmax": 1, "max": 1.0},
                             "nospec_control": {"tokens": 6, "off_argmax": 0, "max": 0.0}, "bound": TIE_MARGIN}
