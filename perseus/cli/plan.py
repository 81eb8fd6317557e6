"""``perseus plan``: a profile and a schedule → the time-energy frontier file."""

from __future__ import annotations

import argparse
import math
from pathlib import Path

from perseus import __version__
from perseus.cli.arg_types import positive
from perseus.cli.common import Command, UsageError, output_file
from perseus.cli.planning import plan_with_progress
from perseus.cli.profile_args import add_profile_args, load_profile_arg, schedule_for
from perseus.errors import PerseusError
from perseus.examples import EXAMPLE_MICROBATCHES
from perseus.frontier import NO_NON_COMPUTE, Frontier, NonCompute, from_measured_iteration, save_frontier

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

Non-compute time: the job's iteration also loads data, exchanges outside the instructions and steps
the optimizer, none of which the profile's instructions hold. Give it per iteration
(--non-compute S), or give the all-max iteration the job measured (--measured-iteration S: the
non-compute time is its excess over the planned all-max iteration). The frontier file records it,
and the slowdowns and savings printed for the job count it (docs/planner.md, "How far to trust a
predicted saving").
"""


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_profile_args(p)
    p.add_argument("--microbatches", type=positive(int), metavar="M", help=f"microbatches per iteration (required with --profile; --example: {EXAMPLE_MICROBATCHES})")
    p.add_argument("--gpu-name", metavar="NAME", help="GPU name recorded in the frontier file")
    p.add_argument("--out", type=Path, required=True, metavar="FRONTIER.json", help="where to write the frontier")
    p.add_argument("--max-points", type=int, metavar="N", help="write at most N points (>= 2), spread evenly in time")
    outside = p.add_mutually_exclusive_group()
    outside.add_argument("--non-compute", type=non_negative, metavar="S",
                         help="seconds per iteration outside the instructions (data, exchanges, optimizer)")
    outside.add_argument("--measured-iteration", type=positive(float), metavar="S",
                         help="the job's measured iteration at all-max (default) clocks, seconds: the non-compute "
                              "time is its excess over the planned all-max iteration")
    p.add_argument("--non-compute-power", type=non_negative, metavar="W",
                   help="power per GPU during the non-compute time, watts (default: P_blocking)")


def run(args: argparse.Namespace) -> int:
    from perseus.output.tables import plan_summary

    if args.max_points is not None and args.max_points < 2:
        raise UsageError("--max-points must be at least 2 (the fastest and the slowest point)")
    if args.non_compute_power is not None and args.non_compute is None and args.measured_iteration is None:
        raise UsageError("--non-compute-power needs --non-compute or --measured-iteration")
    out = output_file(args.out)
    profile, source = load_profile_arg(args)
    schedule, profile = schedule_for(args, profile, args.microbatches)
    frontier = plan_with_progress(schedule, profile, args.progress)
    frontier.non_compute = non_compute_arg(args, frontier.baseline_time_s)
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
    if frontier.non_compute:
        print(job_summary(frontier))
    elif args.measured_iteration is not None:
        print(f"measured iteration {args.measured_iteration:g} s is no longer than the planned all-max "
              f"{frontier.baseline_time_s:.4f} s: no non-compute time (was it measured at other clocks?)")
    return 0


def non_negative(text: str) -> float:
    """A finite number >= 0."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not (value >= 0 and math.isfinite(value)):
        raise argparse.ArgumentTypeError(f"must be a number >= 0, got {text!r}")
    return value


def non_compute_arg(args: argparse.Namespace, baseline_time_s: float) -> NonCompute:
    """--non-compute or --measured-iteration (with --non-compute-power) as the frontier carries it."""
    power = args.non_compute_power
    if args.measured_iteration is not None:
        return from_measured_iteration(args.measured_iteration, baseline_time_s, power,
                                       f"--measured-iteration {args.measured_iteration:g} s less the planned all-max")
    if args.non_compute is not None:
        return NonCompute(args.non_compute, power, "--non-compute")
    return NO_NON_COMPUTE


def job_summary(frontier: Frontier) -> str:
    """The job's iteration, non-compute time included: what a slowdown target and a saving mean to it."""
    from perseus.output.tables import render_table

    nc = frontier.non_compute
    power = frontier.p_blocking_w if nc.power_w is None else nc.power_w
    extra_j = nc.energy_j(frontier.p_blocking_w, frontier.schedule.num_stages)
    rows = [["all max frequency (baseline)", f"{frontier.baseline_time_s + nc.time_s:.4f}", "-",
             f"{frontier.baseline_energy_j + extra_j:.2f}", "-"]]
    for label, target in (("no slowdown (default)", 0.0), ("at most +1 %", 0.01), ("at most +5 %", 0.05)):
        point = frontier.lookup_slowdown(target)
        rows.append([f"{label} [{frontier.points.index(point)}]", f"{point.time_s + nc.time_s:.4f}",
                     f"{frontier.slowdown(point):+.2%}", f"{point.energy_j + extra_j:.2f}", f"{frontier.saving(point):.2%}"])
    return "\n".join([
        f"non-compute time {nc.time_s:.4f} s per iteration at {power:g} W per GPU ({nc.source});",
        "the job's iteration counts it (the table above is the instructions alone):",
        render_table(["point [index]", "iteration (s)", "slowdown", "energy (J)", "saving"], rows, left_first=True),
    ])


COMMAND = Command("plan", help="plan the time-energy frontier of a profiled pipeline",
                  description="Plan per-instruction frequencies: the iteration time-energy Pareto frontier.",
                  add_arguments=add_arguments, run=run, epilog=EPILOG)
