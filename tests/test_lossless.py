"""The tie-aware equality rule the e2e test applies (tests/lossless.py)."""

from tests.lossless import tie_aware_compare, top2_logprobs

TOP2 = [[(-0.1, 5), (-3.0, 8)], [(-0.7, 6), (-0.75, 9)], [(-0.2, 7), (-2.0, 4)]]  # no-spec ids 5, 6, 7


def test_identical():
    assert tie_aware_compare([5, 6, 7], [5, 6, 7], TOP2).kind == "identical"


def test_divergence_at_near_tie_is_allowed():
    v = tie_aware_compare([5, 9, 1], [5, 6, 7], TOP2)
    assert (v.kind, v.index) == ("tie", 1) and abs(v.margin - 0.05) < 1e-9


def test_divergence_at_near_tie_to_a_token_not_the_runner_up_is_a_bug():
    v = tie_aware_compare([5, 3, 1], [5, 6, 7], TOP2)
    assert (v.kind, v.index) == ("bug", 1) and abs(v.margin - 0.05) < 1e-9


def test_exact_tie_listed_in_either_order_is_a_tie():
    """At an exact tie SGLang's top-2 (torch.topk) may list the rival first, the greedy token second."""
    top2 = [[(-0.7, 9), (-0.7, 6)]]  # greedy (argmax) took 6
    assert tie_aware_compare([9], [6], top2).kind == "tie"


def test_speculative_output_ending_first_at_a_near_tie_is_judged_by_the_margin():
    assert tie_aware_compare([5], [5, 6, 7], TOP2).kind == "tie"


def test_divergence_at_clear_margin_is_a_bug():
    v = tie_aware_compare([8, 6, 7], [5, 6, 7], TOP2)
    assert (v.kind, v.index) == ("bug", 0)


def test_length_mismatch_is_judged_where_it_starts():
    assert tie_aware_compare([5, 6], [5, 6, 7], TOP2).kind == "bug"


def test_top2_from_meta_info():
    meta = {"output_top_logprobs": [[(-0.1, 5, None), (-3.0, 8, None)], [(-0.7, 6, None), (-0.75, 9, None)]]}
    assert top2_logprobs(meta) == [[(-0.1, 5), (-3.0, 8)], [(-0.7, 6), (-0.75, 9)]]


def test_accept_share_follows_the_verify_attention_that_ran():
    """tests.e2e.accept_share: the looser share only where the server says our verify attention ran."""
    from sgl_eagle_triton.config import VERIFY_ATTENTION_IN_USE
    from tests.e2e import ACCEPT_SHARE, accept_share

    assert accept_share({"kernels": {"verify attention": VERIFY_ATTENTION_IN_USE}}) == ACCEPT_SHARE["ours"] == 0.95
    assert accept_share({"kernels": {"verify attention": "SGLang's FlashInferAttnBackend (...)"}}) == 0.98
    assert accept_share({"kernels": {}}) == ACCEPT_SHARE["sglang"]
