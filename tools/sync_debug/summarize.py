"""The counts ``tools/sync_debug/sitecustomize.py`` wrote: per process (its command line), the synchronizing CUDA
operations inside a scheduler's event loop and before it, and the stacks of most of them.

    python tools/sync_debug/summarize.py DIR [--top N]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path


def summary(path: Path, top: int = 5) -> list[str]:
    """Lines for one process's ``<pid>.json``: ``pid, loop and init totals, the command`` then the ``top`` stacks."""
    data = json.loads(path.read_text())
    counts = data["counts"]
    loop = sum(n for key, n in counts.items() if key.startswith("loop "))
    lines = [f"{path.stem}: loop {loop}, init {sum(counts.values()) - loop}: {' '.join(data['argv'])[:160]}"]
    for key, n in sorted(counts.items(), key=lambda kv: -kv[1])[:top]:
        lines.append(f"    {n} {key}")
    return lines


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("dir", type=Path)
    parser.add_argument("--top", type=int, default=5)
    args = parser.parse_args(argv)
    for path in sorted(args.dir.glob("*.json")):
        print("\n".join(summary(path, args.top)))


if __name__ == "__main__":
    main()
