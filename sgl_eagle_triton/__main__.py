"""``python -m sgl_eagle_triton demo [--port N] [--keep] [--model-path T --draft-model-path D]``.

See :mod:`sgl_eagle_triton.devtools.demo`.
"""

from __future__ import annotations

import argparse
import sys

from sgl_eagle_triton.devtools import demo


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m sgl_eagle_triton")
    commands = parser.add_subparsers(dest="command", required=True)
    demo_parser = commands.add_parser("demo", help="serve EAGLE_TRITON on tiny models and show what it does")
    demo.add_arguments(demo_parser)
    args = parser.parse_args(argv)
    demo.check_arguments(demo_parser, args)
    return demo.run(args)


if __name__ == "__main__":
    sys.exit(main())
