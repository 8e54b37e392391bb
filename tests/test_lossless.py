"""The tie-aware equality rule the e2e test applies (tests/lossless.py)."""

from tests.lossless import tie_aware_compare, top2_logprobs

TOP2 = [[-0.1, -3.0], [-0.7, -0.75], [-0.2, -2.0]]


def test_identical():
    assert tie_aware_compare([5, 6, 7], [5, 6, 7], TOP2).kind == "identical"


def test_divergence_at_near_tie_is_allowed():
    v = tie_aware_compare([5, 9, 1], [5, 6, 7], TOP2)
    assert (v.kind, v.index) == ("tie", 1) and abs(v.margin - 0.05) < 1e-9


def test_divergence_at_clear_margin_is_a_bug():
    v = tie_aware_compare([8, 6, 7], [5, 6, 7], TOP2)
    assert (v.kind, v.index) == ("bug", 0)


def test_length_mismatch_is_judged_where_it_starts():
    assert tie_aware_compare([5, 6], [5, 6, 7], TOP2).kind == "bug"


def test_top2_from_meta_info():
    meta = {"output_top_logprobs": [[(-0.1, 5, None), (-3.0, 8, None)], [(-0.7, 6, None), (-0.75, 9, None)]]}
    assert top2_logprobs(meta) == [[-0.1, -3.0], [-0.7, -0.75]]
