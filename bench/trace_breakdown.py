"""Cost of each speculative stage per decode cycle, from a torch profiler trace of a live SGLang server.

SGLang 0.5.17 wraps two stages of its EAGLE V2 worker in profiler ranges (``spec_stage_span``: ``draft``,
``draft_extend``), for stock EAGLE3 and EAGLE_TRITON alike, and every model forward in ``step[<MODE> bs=N]``
(``model_runner.forward``): the target's verify forward is ``step[TARGET_VERIFY ...]`` (``verify_forward``
here; SGLang has no range around the whole verify, so the accept kernels are not in it) and a plain decode
step ``step[DECODE ...]`` (``decode``). ``POST /start_profile`` writes a Chrome trace. Per stage this module
reports, averaged over the stage's occurrences (one per cycle):

- ``gpu_busy_ms``: time during which at least one GPU kernel launched inside the stage's CPU range runs (the
  union of their intervals, matched to the range by the launch's correlation id; kernels replayed from a CUDA
  graph carry the graph launch's id). A union, not a sum: with programmatic dependent launch a kernel starts
  while its predecessor drains, and summed durations would count that overlap twice;
- ``gpu_span_ms``: the stage's GPU-side range (``gpu_user_annotation``: first kernel start to last kernel end,
  idle gaps included) where the trace has one;
- ``cpu_ms``: the CPU range itself (host time, launches included);
- ``compute_busy_ms``: ``gpu_busy_ms`` without collectives (``COLLECTIVES``: all-reduce / all-gather kernels,
  which under tensor parallelism also spin while they wait for the other ranks): a rank's own work. A kernel
  launched early under PDL still counts while it waits for its predecessor.

and ``cycle``: from one start of the ``draft`` range (``decode`` without speculation) to the next, the
host's period (``cpu_ms``, slower than unprofiled) and the GPU busy time of every kernel launched in it
(``gpu_busy_ms``): busy time outside the stages is verify's sampling / accept kernels and bookkeeping.

    python -m bench.trace_breakdown TRACE.json[.gz]
    python -m bench.trace_breakdown --kernels draft TRACE.json[.gz]   # and the stage's kernels by GPU time
"""

from __future__ import annotations

import bisect
import gzip
import json
import sys
from pathlib import Path

STAGES = {  # stage -> profiler range name (``step[...]`` ranges match on their first word)
    "draft": "draft", "draft_extend": "draft_extend",
    "verify_forward": "step[TARGET_VERIFY", "decode": "step[DECODE",
}
LAUNCH_CATEGORIES = ("cuda_runtime", "cuda_driver")  # Triton launches through the driver API
CYCLE_ANCHORS = ("draft", "decode")  # a cycle runs from one start of this stage's range to the next
# collective kernels by a part of their names (SGLang's custom all-reduce, NCCL)
COLLECTIVES = ("all_reduce", "allreduce", "all_gather", "allgather", "nccl", "cross_device")


def load_trace(path: Path) -> dict:
    opener = gzip.open if str(path).endswith(".gz") else open
    with opener(path, "rt") as f:
        return json.load(f)


def _matches(name: str, pattern: str) -> bool:
    return name == pattern or name.startswith(pattern + " ")


def busy_us(intervals: list[tuple[float, float]]) -> float:
    """Length of the union of ``(start, end)`` intervals."""
    total, reach = 0.0, float("-inf")
    for start, end in sorted(intervals):
        if end > reach:
            total += end - max(start, reach)
            reach = end
    return total


def _index(trace: dict, stages: dict) -> tuple[list, dict, list]:
    """The trace's complete events, each stage's sorted CPU ranges, and ``(launch time, kernel event)`` of every
    kernel whose launch is in the trace (a CUDA graph's replayed kernels carry the graph launch's)."""
    events = [e for e in trace.get("traceEvents", []) if e.get("ph") == "X"]
    ranges = {s: sorted((e["ts"], e["ts"] + e["dur"]) for e in events
                        if e.get("cat") == "user_annotation" and _matches(e["name"], stages[s])) for s in stages}
    launch_ts = {e["args"]["correlation"]: e["ts"] for e in events
                 if e.get("cat") in LAUNCH_CATEGORIES and "correlation" in e.get("args", {})}
    kernels = [(launch_ts[e["args"]["correlation"]], e) for e in events
               if e.get("cat") == "kernel" and e.get("args", {}).get("correlation") in launch_ts]
    return events, ranges, kernels


def is_collective(name: str) -> bool:
    return any(c in name.lower() for c in COLLECTIVES)


def _within(ranges: list[tuple[float, float]], ts: float) -> bool:
    """Whether ``ts`` falls in one of the sorted ``ranges``."""
    i = bisect.bisect_right(ranges, (ts, float("inf"))) - 1
    return i >= 0 and ranges[i][0] <= ts <= ranges[i][1]


def stage_times(trace: dict, stages=STAGES) -> dict:
    """``{stage: {"count", "cpu_ms", "gpu_busy_ms", "compute_busy_ms", "gpu_span_ms"}}`` per occurrence (ms)."""
    events, ranges, kernels = _index(trace, stages)
    anchor = next((ranges[s] for s in CYCLE_ANCHORS if len(ranges.get(s, ())) > 1), None)
    busy = {s: [] for s in stages}
    compute = {s: [] for s in stages}
    cycle_busy, cycle_compute = [], []
    for ts, e in kernels:
        interval = (e["ts"], e["ts"] + e["dur"])
        if anchor and anchor[0][0] <= ts < anchor[-1][0]:
            cycle_busy.append(interval)
            if not is_collective(e["name"]):
                cycle_compute.append(interval)
        for s in stages:
            if _within(ranges[s], ts):
                busy[s].append(interval)
                if not is_collective(e["name"]):
                    compute[s].append(interval)
    out = {}
    for s in stages:
        n = len(ranges[s])
        if not n:
            continue
        spans = [e["dur"] for e in events if e.get("cat") == "gpu_user_annotation" and _matches(e["name"], stages[s])]
        out[s] = {
            "count": n,
            "cpu_ms": sum(b - a for a, b in ranges[s]) / n / 1e3,
            "gpu_busy_ms": busy_us(busy[s]) / n / 1e3,
            "compute_busy_ms": busy_us(compute[s]) / n / 1e3,
            "gpu_span_ms": sum(spans) / len(spans) / 1e3 if spans else None,
        }
    if anchor:
        cycles = len(anchor) - 1
        out["cycle"] = {"count": cycles, "cpu_ms": (anchor[-1][0] - anchor[0][0]) / cycles / 1e3,
                        "gpu_busy_ms": busy_us(cycle_busy) / cycles / 1e3,
                        "compute_busy_ms": busy_us(cycle_compute) / cycles / 1e3, "gpu_span_ms": None}
    return out


def kernel_table(trace: dict, stage: str, top: int = 15, stages=STAGES) -> list[tuple[str, float, float]]:
    """The ``top`` kernels by GPU time launched inside ``stage``'s CPU range (replays of a CUDA graph launched there
    included): ``(kernel name, launches per occurrence, µs per occurrence)``, most time first. What a stage's
    ``gpu_busy_ms`` is made of, e.g. two systems' draft side by side."""
    _, ranges, kernels = _index(trace, {stage: stages[stage]})
    ranges = ranges[stage]
    if not ranges:
        return []
    calls: dict[str, list[float]] = {}
    for ts, e in kernels:
        if _within(ranges, ts):
            calls.setdefault(e["name"], []).append(e["dur"])
    n = len(ranges)
    rows = [(name, len(durs) / n, sum(durs) / n) for name, durs in calls.items()]
    return sorted(rows, key=lambda r: -r[2])[:top]


def main(argv=None):
    args = list(argv or sys.argv[1:])
    stage = None
    if len(args) > 1 and args[0] == "--kernels":  # python -m bench.trace_breakdown --kernels STAGE TRACE...
        stage, args = args[1], args[2:]
    for path in args:
        trace = load_trace(Path(path))
        print(path, json.dumps(stage_times(trace), indent=1))
        if stage:
            for name, launches, us in kernel_table(trace, stage):
                print(f"  {us:9.1f} us {launches:5.1f}x  {name[:110]}")


if __name__ == "__main__":
    main()
