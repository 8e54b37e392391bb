"""The tie-aware equality rule the e2e test applies (tests/lossless.py)."""

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
