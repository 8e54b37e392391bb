"""bench.pool: one run-by-run ratio over several calls' rows, per call, pairs pooled and between calls."""

import json
import math

import pytest

from bench import pool


def _row(system, batch, runs, steps=None):
    return {"system": system, "batch": batch, "runs": runs, "steps": steps, "topk": 1, "draft_tokens": 4}


def _calls():
    # call 1: a / b = 0.5 and 2.0 (geometric mean 1.0); call 2: 1.5 and 1.5 (b's runs 2, 4); a static row beside
    first = [_row("a", 1, [1.0, 4.0]), _row("b", 1, [2.0, 2.0]), _row("eagle_triton", 1, [3.0, 3.0], steps=3)]
    second = [_row("a", 1, [3.0, 6.0]), _row("b", 1, [2.0, 4.0]), _row("a", 4, [1.0, 1.0])]
    return first, second


def test_per_call_pairs_pooled_and_between_calls():
    first, second = _calls()
    out = pool.pooled("a", "b", 1, [first, second])
    assert [p["geomean"] for p in out["per_call"]] == pytest.approx([1.0, 1.5])
    logs = [math.log(x) for x in (0.5, 2.0, 1.5, 1.5)]
    assert out["pairs"]["geomean"] == pytest.approx(math.exp(sum(logs) / 4)) and out["pairs"]["n"] == 4
    assert out["between_calls"]["geomean"] == pytest.approx(math.sqrt(1.5)) and out["between_calls"]["n"] == 2
    # the between-calls interval is a t-interval over the two calls' means (t_90(1) = 6.314)
    half = 6.314 * abs(math.log(1.5)) / math.sqrt(2) / math.sqrt(2)
    assert out["between_calls"]["high"] == pytest.approx(math.sqrt(1.5) * math.exp(half))
    # a call without both systems at the batch counts for nothing; no call at all: None
    assert pool.pooled("a", "b", 4, [first, second]) is None
    assert pool.pooled("eagle_triton@3,1,4", "b", 1, [first, second])["pairs"]["geomean"] == pytest.approx(1.5)


def test_files_and_keys(tmp_path, capsys):
    first, second = _calls()
    (tmp_path / "rows.json").write_text(json.dumps(first))
    (tmp_path / "report.json").write_text(json.dumps({"kept": {"rows": second}, "other": {"rows": first}}))
    assert len(pool.calls_in(json.loads((tmp_path / "report.json").read_text()))) == 2
    pool.main(["a", "b", str(tmp_path / "rows.json"), f"{tmp_path / 'report.json'}:kept", "--batches", "1", "4"])
    out = capsys.readouterr().out
    assert "| 1 | call 2 | 2 | 1.500 |" in out and "| 1 | between calls | 2 | 1.225 |" in out and "\n| 4 |" not in out
    with pytest.raises(SystemExit, match="no call holds both"):
        pool.main(["a", "c", str(tmp_path / "rows.json"), "--batches", "1"])
