"""One run-by-run ratio pooled over several calls' rows (bench.adaptive's ``--interleave`` JSON), with the spread
between calls kept in view:

    python -m bench.pool eagle_triton_off_nonspec nospec --batches 1 4 \\
        bench/results/2026-12-02-NVIDIA_H200-nonspec-default.json:held_vs_aa_twin \
        bench/results/2026-12-02-NVIDIA_H200-nonspec-route.json:held_step_trimmed_vs_d136ca7_runs

A file is a list of rows (``--out`` of bench.adaptive) or a report's JSON that holds such lists anywhere inside it
(``{"rows": [...]}`` under any key); each list is one call. ``FILE:KEY`` reads only ``KEY`` of a report (one
section: a report's other sections may hold other code). For each batch it prints, per call, ``A / B`` run by run
(:func:`bench.interleave.paired_ratio`: geometric mean and 90 % t-interval), then two pooled figures:

- **pairs pooled**: every pair of every call in one t-interval (as if the calls were one; narrower than the truth where
  the ratio moves between calls);
- **between calls**: the calls' geometric means as the samples (a t-interval over k calls: wide with few calls, but
  it holds where a host's state moves a whole call, which the side-by-side runs of one call cannot show).

A system measured from several shapes in one call (static ``eagle_triton`` rows) is named ``system@steps,topk,tokens``.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
from pathlib import Path

from bench.interleave import paired_ratio, t_90


def row_name(row: dict) -> str:
    """``system``, or ``system@steps,topk,tokens`` for a row of a static shape."""
    if row.get("steps") is None:
        return row["system"]
    return f"{row['system']}@{row['steps']},{row['topk']},{row['draft_tokens']}"


def calls_in(data) -> list[list[dict]]:
    """Every list of bench rows (dicts with ``system``, ``batch`` and ``runs``) inside ``data``, in order."""
    if isinstance(data, list) and data and all(isinstance(r, dict) and {"system", "batch", "runs"} <= r.keys()
                                               for r in data):
        return [data]
    found = []
    for value in (data.values() if isinstance(data, dict) else data if isinstance(data, list) else ()):
        found += calls_in(value)
    return found


def pooled(a: str, b: str, batch: int, calls: list[list[dict]]) -> dict | None:
    """``a`` over ``b`` at ``batch``: per call (those holding both), pairs pooled and between calls; None where no
    call holds both."""
    per_call, logs = [], []
    for rows in calls:
        runs = {(row_name(r), r["batch"]): r["runs"] for r in rows}
        p = paired_ratio(runs.get((a, batch), []), runs.get((b, batch), []))
        if p is not None:
            per_call.append(p)
            logs += [math.log(x) for x in p["ratios"]]
    if not per_call:
        return None
    out = {"per_call": per_call, "pairs": _interval(logs)}
    out["between_calls"] = _interval([math.log(p["geomean"]) for p in per_call])
    return out


def _interval(logs: list[float]) -> dict:
    """Geometric mean and 90 % t-interval of log ratios (no interval from fewer than two)."""
    mean, n = statistics.mean(logs), len(logs)
    half = t_90(n - 1) * statistics.stdev(logs) / math.sqrt(n) if n > 1 else math.inf
    return {"geomean": math.exp(mean), "low": math.exp(mean - half), "high": math.exp(mean + half), "n": n}


def markdown(a: str, b: str, results: dict[int, dict]) -> str:
    """A table: one line per call and two pooled lines per batch."""
    lines = [f"`{a}` / `{b}`, run by run", "", "| batch | source | n | geometric mean | 90 % interval |",
             "|---|---|---|---|---|"]

    def line(batch, source, r):
        return f"| {batch} | {source} | {r['n']} | {r['geomean']:.3f} | {r['low']:.3f}-{r['high']:.3f} |"

    for batch, res in results.items():
        for i, p in enumerate(res["per_call"], 1):
            lines.append(line(batch, f"call {i}", {**p, "n": p["pairs"]}))
        lines.append(line(batch, "pairs pooled", res["pairs"]))
        lines.append(line(batch, "between calls", res["between_calls"]))
    return "\n".join(lines) + "\n"


def load(spec: str):
    """``FILE`` or ``FILE:KEY`` (:data:`__doc__`): the JSON, or its ``KEY``."""
    path, _, key = spec.partition(":")
    data = json.loads(Path(path).read_text())
    return data[key] if key else data


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("a", help="numerator system (row name: system, or system@steps,topk,tokens)")
    parser.add_argument("b", help="denominator system")
    parser.add_argument("files", nargs="+", help="bench.adaptive JSON (rows, or a report holding rows), FILE[:KEY]")
    parser.add_argument("--batches", nargs="+", type=int, required=True)
    args = parser.parse_args(argv)
    calls = [rows for path in args.files for rows in calls_in(load(path))]
    results = {batch: r for batch in args.batches if (r := pooled(args.a, args.b, batch, calls)) is not None}
    if not results:
        raise SystemExit(f"bench.pool: no call holds both {args.a} and {args.b} at batch {args.batches}")
    print(markdown(args.a, args.b, results), end="")


if __name__ == "__main__":
    main()
