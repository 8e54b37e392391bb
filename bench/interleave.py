"""Measuring several servers alike (``--interleave`` of :mod:`bench.adaptive` and :mod:`bench.serve`): every
server up at once, then per batch each server measured ``--repeats`` times (default 2), the order of the servers
reversed from one repeat to the next and the first order alternating between batches. A host-bound cycle (a tiny
model, or small batches under ``--tp``) moves with whatever else the host does: one server after another, the same
server's rows moved by up to 40 % between calls and the second server of a call ran slower than the first (8B at
``--tp 4``, 4 x H200: stock 5.02 ms first, 5.86 ms second; ours 5.54 ms first, 7.26 ms second); interleaved, both
face the same host. Without ``--interleave`` both sweeps run their servers :func:`one_after_another`."""

from __future__ import annotations

import math
import os
import statistics
from pathlib import Path

# Several servers on the same GPUs, one serving at a time (servers of several ranks serving at once on shared cards
# stall one another: docs/gpu.md): a capped KV pool (each profiles the memory the ones before it left; with many
# large servers a late one may get less than the cap, e.g. two 70B --tp 4 servers fit H200s, not H100s) and
# schedulers that sleep while idle (rank 0 sleeps, the other ranks block in SGLang's CPU broadcast)
SHARED_GPU_FLAGS = ["--max-total-tokens", "65536", "--sleep-on-idle"]
# and SGLang's start-up check that every TP rank sees nearly the same free memory a warning, not an error: the servers
# up before leave rank 0 less (its tokenizer's CUDA IPC pool, 1 GiB, lives there), and the second 8B --tp 4 server
# on 4 x H200 stopped at start-up: "The memory capacity is unbalanced" (116.35 GB free against 0.9 x 129.3)
SHARED_GPU_ENV = {"SGLANG_ENABLE_TP_MEMORY_INBALANCE_CHECK": "0"}


def core_shares(cores: list[int], servers: int, client: int = 2) -> tuple[list[list[int]], list[int]]:
    """``--pin-cores``: disjoint shares of the host's ``cores`` (this process's affinity) for ``servers`` servers, at
    least two each, and the ``client`` cores (at least) left to this process, which streams every request. Where a
    host-bound server's processes land moves its speed: on one H200 host (16 cores) the same cost-policy code served
    6300-10800 tok/s at batch 16 across four servers up at once, and a state's measured cycle differed by 30-40 %
    between servers (bench/results/2026-11-28-NVIDIA_H200-plain-default.md); pinned, two servers of one source still
    differed by 18 % (bench/results/2026-11-28-NVIDIA_H200-probe.md). Returns ``(shares, client cores)``; ValueError
    when the cores do not go round."""
    cores = sorted(cores)
    each = (len(cores) - client) // servers if servers else 0
    if servers < 1 or each < 2:
        raise ValueError(f"{len(cores)} cores cannot give {servers} servers two each and keep {client} for the "
                         "client: start fewer servers, or drop --pin-cores")
    shares = [cores[i * each:(i + 1) * each] for i in range(servers)]
    return shares, cores[servers * each:]


def pinned(program, share: list[int]) -> tuple:
    """``program`` (a server's command prefix) run on the cores of ``share`` alone (``taskset``; the server's
    scheduler and detokenizer processes inherit the affinity)."""
    return ("taskset", "-c", ",".join(map(str, share)), *program)


def rotated(shares: list[list[int]], index: int, run: int) -> list[int]:
    """``--rotate-cores``: the share of the ``index``-th server at its ``run``-th run, the shares turned by one a run:
    within a repeat of :func:`measurement_order` every server is on its own share, and over ``len(shares)`` runs every
    server is on every share once (where a server's processes land moved its speed: :func:`core_shares`)."""
    return shares[(index + run) % len(shares)]


def repin(group: int, share: list[int], proc: Path = Path("/proc"), set_affinity=os.sched_setaffinity) -> int:
    """Every thread of every process of the process group ``group`` (a server's session: its launcher, scheduler and
    detokenizer processes, read from ``proc``) onto the cores of ``share``. Returns how many threads it moved; a
    process or thread that ended meanwhile is skipped."""
    moved = 0
    for stat in proc.glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()  # after "pid (comm)": state, ppid, pgrp, ...
            if int(fields[2]) != group:
                continue
            threads = [int(t.name) for t in (stat.parent / "task").iterdir()]
        except (OSError, IndexError, ValueError):
            continue
        for tid in threads:
            try:
                set_affinity(tid, share)
                moved += 1
            except OSError:
                pass
    return moved


def measurement_order(entries: list, batch_index: int, repeats: int = 2) -> list:
    """The order in which ``entries`` are measured at the ``batch_index``-th batch: ``repeats`` times each, the
    order reversed from one repeat to the next and the first order alternating between batches (an even
    ``repeats`` puts every entry first equally often within a batch)."""
    forward, backward = list(entries), list(entries)[::-1]
    return [e for r in range(repeats) for e in (forward if (batch_index + r) % 2 == 0 else backward)]


def combine_runs(runs: list[dict], mean: tuple[str, ...], longest: tuple[str, ...] = (), keep: str = "") -> dict:
    """One result from a server's runs of a batch: ``mean`` keys averaged, ``longest`` keys the largest, ``runs``:
    every run's ``keep`` value; any other key as the first run has it."""
    return {**runs[0], **{k: sum(r[k] for r in runs) / len(runs) for k in mean},
            **{k: max(r[k] for r in runs) for k in longest}, "runs": [r[keep] for r in runs]}


def bring_up(groups: list[list[tuple]], start, attention_of, started: list) -> list[tuple]:
    """Starts every ``(system, shape)`` of each group with :data:`SHARED_GPU_FLAGS` (``start(system, shape, flags)``
    -> a ``Server``), a group all at once and the next once the group is up (a group of one: one after another).
    Every server started goes into ``started`` (the caller stops them all in the end); one that fails to start is
    stopped at once (it would hold GPU memory while the others are measured) and left out. Returns the ready ones as
    ``(system, shape, server, attention_of(server))``; none ready ends the sweep."""
    ready = []
    for group in groups:
        launched = []
        for system, shape in group:
            launched.append((system, shape, start(system, shape, SHARED_GPU_FLAGS)))
            started.append(launched[-1][2])
        for system, shape, server in launched:
            try:
                server.wait_ready(900)
                ready.append((system, shape, server, attention_of(server)))
            except Exception as e:
                print(f"{server.name}: {e!r}", flush=True)
                server.stop()
    if not ready:
        raise SystemExit("--interleave: no server started")
    return ready


def one_after_another(servers: list[tuple], start, attention_of, measure_batch, batches: list[int], save_rows,
                      keep_going: bool) -> None:
    """Without ``--interleave``: each ``(system, shape)`` started alone (``start(system, shape)``), measured at every
    batch once ready (``measure_batch(system, shape, server, attention_of(server), batch)`` -> a row) and stopped;
    the rows so far saved (``save_rows(rows)``) after every server, failed or not, so a sweep cut short keeps what it
    measured. A server that fails to start or serve is left out (``keep_going``) or ends the sweep."""
    rows = []
    for system, shape in servers:
        server = start(system, shape)
        try:
            server.wait_ready(900)
            attention = attention_of(server)
            for batch in batches:
                rows.append(measure_batch(system, shape, server, attention, batch))
        except Exception as e:
            if not keep_going:
                raise
            print(f"{server.name}: {e!r}", flush=True)
        finally:
            server.stop()
            if rows:
                save_rows(rows)


def measure_in_turn(ready: list[tuple], batch_index: int, batch: int, repeats: int, measure_one, before=None
                    ) -> dict[str, list[dict]]:
    """Each ready server's runs of the ``batch_index``-th batch, of ``batch`` requests (``measure_one(server,
    batch, run)``, ``run`` counting that server's runs of the batch from 0), in :func:`measurement_order`, by server
    name; ``before(entry, run)`` first, where given."""
    runs: dict = {}
    for entry in measurement_order(ready, batch_index, repeats):
        run = len(runs.get(entry[2].name, ()))
        if before is not None:
            before(entry, run)
        result = measure_one(entry[2], batch, run)
        runs.setdefault(entry[2].name, []).append(result)
        print(entry[2].name, batch, result, flush=True)
    return runs


# Student's t, two-sided 90 % (the 0.95 quantile), by degrees of freedom; beyond the table the normal's 1.645
T_90 = {1: 6.314, 2: 2.920, 3: 2.353, 4: 2.132, 5: 2.015, 6: 1.943, 7: 1.895, 8: 1.860, 9: 1.833, 10: 1.812,
        11: 1.796, 12: 1.782, 13: 1.771, 14: 1.761, 15: 1.753, 16: 1.746, 17: 1.740, 18: 1.734, 19: 1.729, 20: 1.725,
        25: 1.708, 30: 1.697, 40: 1.684, 60: 1.671, 120: 1.658}


def t_90(df: int) -> float:
    """:data:`T_90` at ``df`` or the nearest tabled fewer degrees of freedom (a little wider: never too narrow)."""
    return T_90[max(d for d in T_90 if d <= df)]


def paired_ratio(a: list[float], b: list[float]) -> dict | None:
    """``a`` over ``b`` run by run (run i of both servers belongs to the same repeat of :func:`measurement_order`:
    measured next to each other, so a slow spell of the host moves both): the ratios, their geometric mean and a
    90 % t-interval of it (over the log ratios). None with fewer than two pairs, unequal run counts or a run
    that measured nothing (0 tok/s: no request of a round streamed two chunks)."""
    if len(a) != len(b) or len(a) < 2 or min(a + b) <= 0:
        return None
    ratios = [x / y for x, y in zip(a, b, strict=True)]
    logs = [math.log(x) for x in ratios]
    mean, n = statistics.mean(logs), len(logs)
    half = t_90(n - 1) * statistics.stdev(logs) / math.sqrt(n)
    return {"ratios": ratios, "geomean": math.exp(mean), "low": math.exp(mean - half), "high": math.exp(mean + half),
            "pairs": n}


def paired_section(measured: str, label_column: str, lines: list[str]) -> str:
    """The report's run-by-run table of :func:`paired_line` rows (``measured``: what the ratios compare); "" without
    rows."""
    if not lines:
        return ""
    return "\n".join(["", "Run by run (interleaved: run i of every server in the same repeat, next to each other in "
                      f"time), {measured}, the geometric mean and its 90 % t-interval:", "",
                      f"| batch | {label_column} | runs | geometric mean | 90 % interval |", "|---|---|---|---|---|",
                      *lines]) + "\n"


def paired_line(label: str, batch, p: dict) -> str:
    """One markdown row of a :func:`paired_ratio` result."""
    runs = " / ".join(f"{x:.2f}" for x in p["ratios"])
    return f"| {batch} | {label} | {runs} | {p['geomean']:.3f} | {p['low']:.3f}–{p['high']:.3f} |"
