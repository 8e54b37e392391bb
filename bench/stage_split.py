"""Where a decode step's host time goes, server by server, from logs written under
``SGLANG_EAGLE_TRITON_CYCLE_TIMING=N`` (e.g. ``bench.adaptive --server-env SGLANG_EAGLE_TRITON_CYCLE_TIMING=200``,
whose servers log to ``<workdir>/<system>.log``)::

    python -m bench.stage_split /tmp/ab/nospec.log /tmp/ab/eagle_triton_off.log [--skip 1]

Per log (rank 0): the median over its summary lines (after the first ``--skip``: start-up and warm-up) of the
scheduler's period, of each stage and of the garbage collector's time (``scheduler stages`` lines: no-spec and
speculative servers alike), and of the EAGLE worker's host time inside ``forward_batch_generation`` (``cycle timing``
lines: speculative servers only), and of each part of ``run_batch`` (``run_batch parts`` lines), as a markdown table
in ms. Medians, since one log mixes the batch sizes a sweep
ran (read such a table as shares, or give each batch its own run).
"""

from __future__ import annotations

import argparse
import statistics
from pathlib import Path

from sgl_eagle_triton.cycle_timing import (
    RUN_BATCH_PARTS,
    SCHEDULER_STAGES,
    parse_parts_summaries,
    parse_stage_summaries,
    parse_summaries,
)

COLUMNS = ("period", *SCHEDULER_STAGES, "rest", "gc", "gc_full")  # gc: inside the stages, not added to them
PART_COLUMNS = tuple(f"run_batch: {part}" for part in (*RUN_BATCH_PARTS, "other"))  # their sum is run_batch


def split(text: str, skip: int = 1) -> dict:
    """Medians (ms) of rank 0's scheduler stage lines and of its cycle timing's host time inside
    ``forward_batch_generation`` in a server log ``text``, each after its first ``skip`` lines; ``lines``: how many
    stage lines were used. Columns without lines are None."""
    stages = [line for line in parse_stage_summaries(text) if line["rank"] == 0][skip:]
    forward = [line["host_in_forward"] for line in parse_summaries(text) if line["rank"] == 0][skip:]
    parts = [line for line in parse_parts_summaries(text) if line["rank"] == 0][skip:]
    row = {key: statistics.median(line[key] for line in stages) if stages else None for key in COLUMNS}
    row |= {column: statistics.median(line[column.removeprefix("run_batch: ")] for line in parts) if parts else None
            for column in PART_COLUMNS}
    row["host_in_forward"] = statistics.median(forward) if forward else None
    row["lines"] = len(stages)
    return row


def table(rows: dict) -> str:
    """Markdown: one row per log name of :func:`split`'s medians."""
    head = ["log", "lines", *COLUMNS, "in forward_batch_generation", *PART_COLUMNS]
    out = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for name, row in rows.items():
        cells = ["-" if row[k] is None else f"{row[k]:.3f}" for k in (*COLUMNS, "host_in_forward", *PART_COLUMNS)]
        out.append(f"| {name} | {row['lines']} | " + " | ".join(cells) + " |")
    return "\n".join(out) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("logs", nargs="+", type=Path)
    parser.add_argument("--skip", type=int, default=1, help="summary lines skipped at the start of each log")
    args = parser.parse_args()
    print(table({log.stem: split(log.read_text(errors="replace"), args.skip) for log in args.logs}), end="")


if __name__ == "__main__":
    main()
