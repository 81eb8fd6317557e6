"""``perseus plan``: a profile and a schedule → the time-energy frontier file."""

from __future__ import annotations

import argparse
from pathlib import Path

from perseus import __version__
from perseus.cli.arg_types import positive
from perseus.cli.common import Command, UsageError, output_file
from perseus.cli.planning import plan_with_progress
from perseus.cli.profile_args import add_profile_args, load_profile_arg, schedule_for
from perseus.errors import PerseusError
from perseus.examples import EXAMPLE_MICROBATCHES
from perseus.frontier import save_frontier

EPILOG = """\
examples:
  perseus plan --example --out frontier.json
  perseus plan --profile prof.csv --p-blocking 83.64 --stages 8 --microbatches 12 --out frontier.json
  perseus plan --profile prof.json --stages 4 --microbatches 16 --schedule interleaved --chunks 2 --out f.json
  perseus plan --example --schedule zbv --chunks 2 --split-backward 0.5 --out zbv.json

schedules: 1f1b, gpipe, interleaved (megatron-core); torch-interleaved, zb-interleaved, zbv
(torch.distributed.pipelining's Interleaved1F1B, InterleavedZeroBubble, ZBVZeroBubble).

P_blocking is the power (W) a GPU draws while blocked on pipeline communication (A100: 83.64 W).
A perseus JSON profile may carry it; a Zeus CSV does not, so --p-blocking is required then.
"""


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_profile_args(p)
    p.add_argument("--microbatches", type=positive(int), metavar="M", help=f"microbatches per iteration (required with --profile; --example: {EXAMPLE_MICROBATCHES})")
    p.add_argument("--gpu-name", metavar="NAME", help="GPU name recorded in the frontier file")
    p.add_argument("--out", type=Path, required=True, metavar="FRONTIER.json", help="where to write the frontier")
    p.add_argument("--max-points", type=int, metavar="N", help="write at most N points (>= 2), spread evenly in time")


def run(args: argparse.Namespace) -> int:
    from perseus.output.tables import plan_summary

    if args.max_points is not None and args.max_points < 2:
        raise UsageError("--max-points must be at least 2 (the fastest and the slowest point)")
    out = output_file(args.out)
    profile, source = load_profile_arg(args)
    schedule, profile = schedule_for(args, profile, args.microbatches)
    frontier = plan_with_progress(schedule, profile, args.progress)
    frontier.metadata.update(
        {"created_by": f"perseus {__version__} plan", "profile": "example" if args.example else str(args.profile)}
    )
    if args.split_backward is not None:
        frontier.metadata["split_backward"] = args.split_backward
    if args.fused_sum:
        frontier.metadata["fused_sum"] = True
    try:
        save_frontier(frontier, out, args.max_points)
    except OSError as exc:
        raise PerseusError(f"{out}: cannot write frontier ({exc.strerror or exc})") from None
    written = len(frontier.points) if args.max_points is None else min(args.max_points, len(frontier.points))
    print(plan_summary(frontier, source, str(out), written))
    return 0


COMMAND = Command("plan", help="plan the time-energy frontier of a profiled pipeline",
                  description="Plan per-instruction frequencies: the iteration time-energy Pareto frontier.",
                  add_arguments=add_arguments, run=run, epilog=EPILOG)
