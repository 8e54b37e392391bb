"""Where a decode step's host time goes, server by server, from logs written under
``SGLANG_EAGLE_TRITON_CYCLE_TIMING=N`` (e.g. ``bench.adaptive --server-env SGLANG_EAGLE_TRITON_CYCLE_TIMING=200``,
whose servers log to ``<workdir>/<system>.log``)::

    python -m bench.stage_split /tmp/ab/nospec.log /tmp/ab/eagle_triton_off.log [--skip 1]

Per log (rank 0): the median over its summary lines (after the first ``--skip``: start-up and warm-up) of the
scheduler's period, of each stage and of the garbage collector's time (``scheduler stages`` lines: no-spec and
speculative servers alike), and of the EAGLE worker's host time inside ``forward_batch_generation`` (``cycle timing``
lines: speculative servers only), and of each part of ``run_batch`` (``run_batch parts`` lines) and of SGLang's
own functions inside the stages (``sglang parts`` lines: the same code in both servers, outside a speculative
server's wrappers), as a markdown table in ms. Medians, since one log mixes the batch sizes a sweep ran (read such a
table as shares, or give each batch its own run).

With ``--by-batch``: one row per log and batch size instead. A summary line goes with the batch size of SGLang's own
decode log lines (``Decode batch, #running-req: N``, every ``--decode-log-interval`` steps) since the previous one,
and is left out where they name more than one size or none (a window that spans a change of batch); a ``run_batch
parts`` or ``cycle timing`` line goes with the stage line before it.

With ``--arms`` (logs of servers running an A/B inside themselves, ``SGLANG_EAGLE_TRITON_AB_STEPS``): per log, each
arm's median host period and host time in ``forward_batch_generation``, and the ratio of the two arms line by line
(each line's arms shared that window's host, batch and requests) as a geometric mean with its 90 % t-interval.
"""

from __future__ import annotations

import argparse
import re
import statistics
from pathlib import Path

from bench.interleave import paired_ratio
from sgl_eagle_triton.config import AB_ARMS
from sgl_eagle_triton.cycle_timing import (
    RUN_BATCH_PARTS,
    SCHEDULER_STAGES,
    SGLANG_PARTS,
    parse_arm_summaries,
    parse_parts_summaries,
    parse_sglang_parts_summaries,
    parse_stage_summaries,
    parse_summaries,
)

COLUMNS = ("period", *SCHEDULER_STAGES, "rest", "gc", "gc_full")  # gc: inside the stages, not added to them
PART_COLUMNS = tuple(f"run_batch: {part}" for part in (*RUN_BATCH_PARTS, "other"))  # their sum is run_batch
SGLANG_COLUMNS = tuple(f"sglang: {part}" for part in SGLANG_PARTS)  # SGLang's own functions inside the stages


def split(text: str, skip: int = 1) -> dict:
    """Medians (ms) of rank 0's scheduler stage lines and of its cycle timing's host time inside
    ``forward_batch_generation`` in a server log ``text``, each after its first ``skip`` lines; ``lines``: how many
    stage lines were used. Columns without lines are None."""
    stages = [line for line in parse_stage_summaries(text) if line["rank"] == 0][skip:]
    forward = [line["host_in_forward"] for line in parse_summaries(text) if line["rank"] == 0][skip:]
    parts = [line for line in parse_parts_summaries(text) if line["rank"] == 0][skip:]
    sglang = [line for line in parse_sglang_parts_summaries(text) if line["rank"] == 0][skip:]
    row = {key: statistics.median(line[key] for line in stages) if stages else None for key in COLUMNS}
    row |= {column: statistics.median(line[column.removeprefix("run_batch: ")] for line in parts) if parts else None
            for column in PART_COLUMNS}
    row |= {column: statistics.median(line[column.removeprefix("sglang: ")] for line in sglang) if sglang else None
            for column in SGLANG_COLUMNS}
    row["host_in_forward"] = statistics.median(forward) if forward else None
    row["lines"] = len(stages)
    return row


_DECODE_BATCH = re.compile(r"Decode batch, #running-req: (\d+)")
_RANK0_STAGES = re.compile(r"scheduler stages, rank 0, ")


def by_batch(text: str) -> dict[int, str]:
    """A server log ``text`` as one text per batch size (ascending) of its summary lines (the module's docstring:
    ``--by-batch``), each for :func:`split`; lines of windows without one batch size are left out."""
    texts: dict[int, list[str]] = {}
    seen: set[int] = set()
    label = None  # the batch of the last rank-0 stage line (None: left out)
    for line in text.splitlines(keepends=True):
        if m := _DECODE_BATCH.search(line):
            seen.add(int(m.group(1)))
        elif _RANK0_STAGES.search(line):
            label = next(iter(seen)) if len(seen) == 1 else None
            seen = set()
            if label is not None:
                texts.setdefault(label, []).append(line)
        elif label is not None and any(kind in line for kind in (" run_batch parts, ", " sglang parts, ",
                                                                  " cycle timing, ")):
            texts[label].append(line)
    return {batch: "".join(texts[batch]) for batch in sorted(texts)}


def table(rows: dict) -> str:
    """Markdown: one row per log name of :func:`split`'s medians."""
    head = ["log", "lines", *COLUMNS, "in forward_batch_generation", *PART_COLUMNS, *SGLANG_COLUMNS]
    out = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for name, row in rows.items():
        cells = ["-" if row[k] is None else f"{row[k]:.3f}"
                 for k in (*COLUMNS, "host_in_forward", *PART_COLUMNS, *SGLANG_COLUMNS)]
        out.append(f"| {name} | {row['lines']} | " + " | ".join(cells) + " |")
    return "\n".join(out) + "\n"


ARM_KEYS = ("host_period", "host_in_forward")


def arm_names(text: str) -> tuple[str, str]:
    """The (on, off) arms of config.AB_ARMS whose names rank 0's arm lines in ``text`` carry (the first feature's when
    none do)."""
    seen = {arm for line in parse_arm_summaries(text) if line["rank"] == 0 for arm in line["arms"]}
    return next((pair for pair in AB_ARMS.values() if set(pair) <= seen), next(iter(AB_ARMS.values())))


def arms(text: str, skip: int = 1, first: str | None = None, second: str | None = None) -> dict:
    """Rank 0's arm lines of an A/B inside one server (after the first ``skip``; arms ``first`` / ``second``, by
    default :func:`arm_names`'): ``names``: the two arms; per arm and key of
    :data:`ARM_KEYS` the median (ms), and per key the ratios ``first`` / ``second`` of each line with both arms
    (:func:`bench.interleave.paired_ratio`: geometric mean, 90 % t-interval; None below two lines); ``lines``: how
    many lines had both arms."""
    if first is None or second is None:
        first, second = arm_names(text)
    lines = [line["arms"] for line in parse_arm_summaries(text) if line["rank"] == 0][skip:]
    both = [line for line in lines if first in line and second in line]
    row = {"lines": len(both), "names": (first, second)}
    for arm in (first, second):
        for key in ARM_KEYS:
            values = [line[arm][key] for line in both if line[arm][key] is not None]
            row[arm, key] = statistics.median(values) if values else None
    for key in ARM_KEYS:
        pairs = [(line[first][key], line[second][key]) for line in both
                 if line[first][key] is not None and line[second][key] is not None]
        row["ratio", key] = paired_ratio([a for a, _ in pairs], [b for _, b in pairs])
    return row


def arms_table(rows: dict) -> str:
    """Markdown: one row per log name of :func:`arms` (arms named in each row: on, then off)."""
    head = ["log", "lines", "arms (on / off)", *(f"{arm} {key} (ms)" for arm in ("on", "off") for key in ARM_KEYS),
            *(f"on / off {key}" for key in ARM_KEYS)]
    out = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for name, row in rows.items():
        first, second = row["names"]
        cells = ["-" if row[arm, key] is None else f"{row[arm, key]:.3f}" for arm in (first, second)
                 for key in ARM_KEYS]
        cells += ["-" if (p := row["ratio", key]) is None else f"{p['geomean']:.3f} ({p['low']:.3f}-{p['high']:.3f})"
                  for key in ARM_KEYS]
        out.append(f"| {name} | {row['lines']} | {first} / {second} | " + " | ".join(cells) + " |")
    return "\n".join(out) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("logs", nargs="+", type=Path)
    parser.add_argument("--skip", type=int, default=1, help="summary lines skipped at the start of each log")
    parser.add_argument("--arms", action="store_true", help="the arms of an A/B inside each server instead")
    parser.add_argument("--by-batch", action="store_true",
                        help="one row per log and batch size (SGLang's decode log lines of each window)")
    args = parser.parse_args()
    texts = {log.stem: log.read_text(errors="replace") for log in args.logs}
    if args.by_batch:
        texts = {f"{name} (batch {batch})": part for name, text in texts.items()
                 for batch, part in by_batch(text).items()}
    if args.arms:
        print(arms_table({name: arms(text, args.skip) for name, text in texts.items()}), end="")
    else:
        print(table({name: split(text, args.skip) for name, text in texts.items()}), end="")


if __name__ == "__main__":
    main()
