"""Draft check mode's tree comparison: sibling order (tie order) does not make trees differ."""

import json

import pytest
import torch

from sgl_eagle_triton.draft_check import record


def test_sibling_permutation_is_the_same_tree(tmp_path):
    # k = 2, S = 3: step-0 candidates 0, 1; step-1 candidates 2..5 under frontier nodes parent_list[1:3].
    ours = (torch.tensor([[-1, 0, 1, 2, 3]]), torch.tensor([[0, 1, 2, 3]]), torch.tensor([[10, 11, 12, 13]]),
            torch.tensor([[0.5, 0.4, 0.3, 0.2, 0.1, 0.05]]))
    # SGLang ordered the tied step-1 children the other way round: ids 2 and 3 swapped.
    stock = (torch.tensor([[-1, 0, 1, 2, 3]]), torch.tensor([[0, 1, 2, 3]]), torch.tensor([[10, 11, 13, 12]]))
    stock_scores = torch.tensor([[0.5, 0.4, 0.2, 0.3, 0.1, 0.05]])
    line = record(str(tmp_path / "c.jsonl"), ours, stock, stock_scores, topk=2)
    assert line["same_tree"] == 1 and line["same_ids"] == 0 and line["max_rel_score_diff"] == 0
    assert line["first_forward_rel_p_diff"] == [0, 0]  # children of one parent compared as a sorted set
    worst = line["first_forward_worst"]
    assert worst["request"] == 0 and worst["ours"][1] == pytest.approx([0.05, 0.1])
    assert json.loads((tmp_path / "c.jsonl").read_text()) == line


def test_different_tokens_differ(tmp_path):
    ours = (torch.tensor([[-1, 0, 1]]), torch.tensor([[0, 2]]), torch.tensor([[10, 12]]), torch.rand(1, 6))
    stock = (torch.tensor([[-1, 0, 1]]), torch.tensor([[0, 2]]), torch.tensor([[10, 14]]))
    line = record(str(tmp_path / "c.jsonl"), ours, stock, torch.tensor([[0.5, 0.4, 0.3, 0.2, 0.1, 0.05]]), topk=2)
    assert line["same_tree"] == 0 and line["differing_min_rel_gap"] == [pytest.approx(0.2)]


def test_first_forward_worst_names_the_request(tmp_path):
    tree = (torch.tensor([[-1, 0, 1]] * 2), torch.tensor([[0, 2]] * 2), torch.tensor([[10, 12]] * 2))
    stock_scores = torch.tensor([[0.5, 0.4, 0.3, 0.2, 0.1, 0.05]] * 2)
    ours_scores = stock_scores.clone()
    ours_scores[1, 4] = 0.15  # request 1, second parent: one child 50 % off
    line = record(str(tmp_path / "c.jsonl"), (*tree, ours_scores), tree, stock_scores, topk=2)
    assert line["first_forward_rel_p_diff"] == [0, pytest.approx(0.5)]
    worst = line["first_forward_worst"]
    assert worst["request"] == 1 and worst["ours"][1] == pytest.approx([0.05, 0.15])
    assert worst["stock"][1] == pytest.approx([0.05, 0.1])
