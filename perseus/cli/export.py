"""``perseus export``: every frontier point as a frequency file of another tool (Zeus)."""

from __future__ import annotations

import argparse
from pathlib import Path

from perseus.cli.common import Command


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("frontier", type=Path, help="frontier.json written by 'perseus plan'")
    p.add_argument("--format", choices=("zeus",), default="zeus", help="output format (default: zeus)")
    p.add_argument("--out", type=Path, required=True, metavar="DIR", help="new or empty output directory")


def run(args: argparse.Namespace) -> int:
    from perseus.frontier import load_frontier
    from perseus.output.export import export_zeus

    frontier = load_frontier(args.frontier)
    files = export_zeus(frontier, args.out)
    order = f" ({files[0].name} = fastest point, {files[-1].name} = slowest)"  # files: fastest first if len(files) > 1 else ""
    print(f"wrote {len(files)} Zeus frequency file(s) to {args.out}/{order}; index: {args.out}/frontier_points.csv")
    return 0


COMMAND = Command("export", help="write the frontier's plans for other tools (Zeus)",
                  description="Export every frontier point as a frequency file of Zeus's pipeline frequency optimizer.",
                  add_arguments=add_arguments, run=run,
                  epilog="example:\n  perseus export frontier.json --format zeus --out zeus_freqs/")
