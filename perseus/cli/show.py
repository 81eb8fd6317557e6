"""``perseus show``: a frontier file as a table."""

from __future__ import annotations

import argparse
from pathlib import Path

from perseus.cli.arg_types import positive
from perseus.cli.common import Command


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("frontier", type=Path, help="frontier.json written by 'perseus plan'")
    p.add_argument("--all", action="store_true", help="every point instead of about 20")
    p.add_argument("--rows", type=positive(int), default=20, help=argparse.SUPPRESS)


def run(args: argparse.Namespace) -> int:
    from perseus.frontier import load_frontier
    from perseus.output.tables import frontier_table

    frontier = load_frontier(args.frontier)
    print(frontier_table(frontier, None if args.all else args.rows))
    return 0


COMMAND = Command("show", help="print a frontier file as a table",
                  description="Print a frontier: time, slowdown and energy saving against the all-max baseline.",
                  add_arguments=add_arguments, run=run,
                  epilog="examples:\n  perseus show frontier.json\n  perseus show frontier.json --all")
