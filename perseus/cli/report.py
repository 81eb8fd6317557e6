"""``perseus report``: one self-contained HTML page of a training run (perseus.output.report_page)."""

from __future__ import annotations

import argparse
from pathlib import Path

from perseus.cli.common import Command


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("run_dir", type=Path, metavar="RUN_DIR", help="directory with metrics.jsonl (or its one *.jsonl), or the metrics file itself")
    p.add_argument("--out", type=Path, metavar="REPORT.html", help="the page (default: RUN_DIR/report.html)")
    p.add_argument("--metrics", type=Path, metavar="FILE", help="the JSONL metrics file (default: the one in RUN_DIR)")
    p.add_argument("--cache", type=Path, metavar="DIR", help="runtime cache with */frontier.json (default: RUN_DIR/cache)")
    p.add_argument("--run", default="latest", metavar="ID|N|all",
                   help="which run of the metrics file: its run id, its number in the file (1, 2, ...), 'latest' "
                        "(default) or 'all' (each run, one after another)")


def run(args: argparse.Namespace) -> int:
    from perseus.output.report_page import make_report, shown_text  # matplotlib is imported only when drawing

    data, files = make_report(args.run_dir, args.out, args.metrics, args.cache, args.run)
    print(f"wrote {files[0]} ({shown_text(data)}: {len(data.steps)} iterations; "
          f"figures: {', '.join(p.name for p in files[1:])})")
    for note in data.notes:
        print(f"note: {note}")
    return 0


COMMAND = Command("report", help="one HTML page of a run: energy, time, frontier, clocks, saving",
                  description="Write a self-contained HTML report of a training run from its metrics file "
                              "(metrics_file in the Perseus config; 'perseus demo' writes one too) and the "
                              "runtime cache (frontier.json, profile.json). PNG figures are written next to "
                              "the page and embedded in it. A metrics file appended by several runs is split "
                              "by run id; the page shows the latest run unless --run says otherwise.",
                  add_arguments=add_arguments, run=run,
                  epilog="examples:\n  perseus report runs/job42 --cache ~/.cache/perseus\n"
                         "  perseus report runs/job42 --run all\n"
                         "  perseus demo --out demo && perseus report demo")
