"""Two servers' host profiles side by side, per decode step, function by function.

Each server's profiles are the whole cProfile files its cycle profile wrote (``SGLANG_EAGLE_TRITON_CYCLE_TIMING=N
SGLANG_EAGLE_TRITON_CYCLE_PROFILE=K SGLANG_EAGLE_TRITON_CYCLE_PROFILE_DIR=<folder>``, one folder per server). They are
summed per server and divided by the server's decode iterations (the calls of SGLang's ``Scheduler.run_batch`` or
``process_batch_result``, whichever counted more), so that a function's calls and times read per step; the table
lists the functions whose cumulative time differs most, ``--callees F`` splits one function's time into its callees'
(the call edges from F). cProfile slows every Python call, so the times are shares, not wall-clock; the call counts
per step are exact. A call edge through a wrapper that also calls itself (e.g. a decorator's ``wrapper``) can read
zero in cProfile's edges: trust the table, check the edges. A profile file holding a Triton build (a kernel compiled
or its launcher module built at its first launch in the process, ~0.1 s each: one-off work) is left out and named
(``--keep-builds`` reads it).

    python -m bench.profile_diff NOSPEC_DIR OURS_DIR [--names nospec off] [--top 40] [--callees '(run_batch)']
        [--keep-builds]
"""

from __future__ import annotations

import argparse
import glob
import os
import pstats
import re

# a decode iteration: one call of SGLang's Scheduler.run_batch, and one of process_batch_result (the previous batch's);
# the larger count is taken: a call whose return cProfile missed (seen in drafting servers) is not counted
STEP_MARKERS = (("scheduler.py", "run_batch"), ("scheduler.py", "process_batch_result"))


def label(key: tuple) -> str:
    """``(file, line, function)`` as ``<path from the package root>:<line>(<function>)``."""
    path, line, function = key
    path = re.sub(r".*/(site-packages|site|dist-packages)/", "", path)
    path = re.sub(r".*/(?=sgl_eagle_triton/)", "", path)
    return f"{path}:{line}({function})"


# a Triton build inside a profiled window (a kernel compiled, or its launcher module built, at its first launch in the
# process: ~0.1 s each): one-off work that would read as a per-step cost
BUILD_MARKERS = (("triton/runtime/build.py", "compile_module_from_src"), ("triton/compiler/compiler.py", "compile"))


def builds_in(stats: pstats.Stats) -> int:
    """The Triton builds (:data:`BUILD_MARKERS`' calls) a profile holds."""
    return sum(nc for (path, _, function), (_, nc, _, _, _) in stats.stats.items()
               if any(path.endswith(file) and function == name for file, name in BUILD_MARKERS))


def load(folder: str, leave_out_builds: bool = False) -> pstats.Stats:
    """Every ``*.prof`` in ``folder`` summed (raises when there is none); ``leave_out_builds``: without the files that
    hold a Triton build (:func:`builds_in`), raising when every file does. The result's ``left_out`` names the files
    left out."""
    paths = sorted(glob.glob(os.path.join(folder, "*.prof")))
    if not paths:
        raise SystemExit(f"no *.prof files in {folder}")
    kept, left_out = [], []
    for path in paths:
        stats = pstats.Stats(path)
        if leave_out_builds and builds_in(stats):
            left_out.append(os.path.basename(path))
        else:
            kept.append(stats)
    if not kept:
        raise SystemExit(f"every profile in {folder} holds a Triton build (--keep-builds reads them anyway)")
    total = kept[0]
    for stats in kept[1:]:
        total.add(stats)
    total.left_out = left_out
    return total


def steps_of(stats: pstats.Stats) -> int:
    """The decode iterations profiled: the calls of SGLang's ``Scheduler.run_batch`` or of its
    ``process_batch_result``, whichever counted more (:data:`STEP_MARKERS`)."""
    calls = [sum(nc for (path, _, function), (_, nc, _, _, _) in stats.stats.items()
                 if path.endswith(file) and function == name) for file, name in STEP_MARKERS]
    if not max(calls):
        raise SystemExit("no Scheduler.run_batch in the profile: was the scheduler's run_batch profiled?")
    return max(calls)


def per_step(stats: pstats.Stats) -> dict[str, tuple[float, float, float]]:
    """``{label: (calls, own ms, cumulative ms)}`` per decode iteration."""
    steps = steps_of(stats)
    return {label(key): (nc / steps, tt * 1e3 / steps, ct * 1e3 / steps)
            for key, (_, nc, tt, ct, _) in stats.stats.items()}


def callees(stats: pstats.Stats, function: str) -> dict[str, tuple[float, float]]:
    """The call edges out of every function whose label ends with ``function`` (e.g. ``tp_worker.py:558(forward_
    batch_generation)`` or just ``(forward_batch_generation)``): ``{callee label: (calls, cumulative ms)}`` per
    decode iteration."""
    steps = steps_of(stats)
    out: dict[str, tuple[float, float]] = {}
    for key, (_, _, _, _, callers) in stats.stats.items():
        for caller, edge in callers.items():
            if label(caller).endswith(function):
                nc, ct = edge[0], edge[3]  # a call edge: (calls, primitive calls, own s, cumulative s)
                calls, cumulative = out.get(label(key), (0.0, 0.0))
                out[label(key)] = (calls + nc / steps, cumulative + ct * 1e3 / steps)
    return out


def diff_table(a: dict, b: dict, names: tuple[str, str], top: int) -> str:
    """Markdown: the ``top`` functions by |cumulative b - a| per step, with both servers' calls and times."""
    rows = []
    for name in set(a) | set(b):
        ca, oa, ta = a.get(name, (0.0, 0.0, 0.0))
        cb, ob, tb = b.get(name, (0.0, 0.0, 0.0))
        rows.append((tb - ta, ob - oa, ca, cb, ta, tb, name))
    rows.sort(key=lambda r: -abs(r[0]))
    x, y = names
    lines = [f"| function | calls {x} | calls {y} | cumulative ms {x} | cumulative ms {y} | difference | own "
             "difference |", "|---|---|---|---|---|---|---|"]
    lines += [f"| `{r[6]}` | {r[2]:.2f} | {r[3]:.2f} | {r[4]:.4f} | {r[5]:.4f} | {r[0]:+.4f} | {r[1]:+.4f} |"
              for r in rows[:top]]
    return "\n".join(lines)


def callee_table(a: dict, b: dict, names: tuple[str, str], function: str) -> str:
    """Markdown: ``function``'s callees in both servers, by cumulative time of the larger."""
    x, y = names
    lines = [f"Callees of `{function}` per decode step (calls, cumulative ms under profile):", "",
             f"| callee | calls {x} | calls {y} | ms {x} | ms {y} |", "|---|---|---|---|---|"]
    for name in sorted(set(a) | set(b), key=lambda n: -max(a.get(n, (0, 0))[1], b.get(n, (0, 0))[1])):
        ca, ta = a.get(name, (0.0, 0.0))
        cb, tb = b.get(name, (0.0, 0.0))
        lines.append(f"| `{name}` | {ca:.2f} | {cb:.2f} | {ta:.4f} | {tb:.4f} |")
    return "\n".join(lines)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("a", help="the first server's profile folder (e.g. no-spec's)")
    parser.add_argument("b", help="the second server's profile folder")
    parser.add_argument("--names", nargs=2, default=("a", "b"))
    parser.add_argument("--top", type=int, default=40)
    parser.add_argument("--callees", action="append", default=[], help="a function label's end, e.g. "
                        "'(forward_batch_generation)': its callees' split (repeatable)")
    parser.add_argument("--keep-builds", action="store_true", help="read the profiles that hold a Triton build too "
                        "(left out by default: a kernel compiled or a launcher built at its first launch is one-off "
                        "work)")
    args = parser.parse_args(argv)
    sa, sb = load(args.a, not args.keep_builds), load(args.b, not args.keep_builds)
    names = tuple(args.names)
    for name, stats in zip(names, (sa, sb), strict=True):
        if stats.left_out:
            print(f"{name}: left out {len(stats.left_out)} profile(s) holding a Triton build: "
                  f"{', '.join(stats.left_out)}")
    a, b = per_step(sa), per_step(sb)
    print(f"Decode iterations profiled: {names[0]} {steps_of(sa)}, {names[1]} {steps_of(sb)}; Python calls per "
          f"iteration {sum(v[0] for v in a.values()):.0f} / {sum(v[0] for v in b.values()):.0f}; own time per "
          f"iteration (under profile) {sum(v[1] for v in a.values()):.3f} / {sum(v[1] for v in b.values()):.3f} ms\n")
    print(diff_table(a, b, names, args.top))
    for function in args.callees:
        print()
        print(callee_table(callees(sa, function), callees(sb, function), names, function))


if __name__ == "__main__":
    main()
