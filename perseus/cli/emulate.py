"""``perseus emulate``: a large data-parallel job with one straggler pipeline under three frequency
policies, one case or a sweep (``--carbon-trace``/``--power-cap-w``: ``perseus.cli.emulate_grid``)."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING

from perseus.cli import emulate_grid
from perseus.cli.arg_types import number_list
from perseus.cli.common import Command, UsageError
from perseus.cli.job_args import add_job_args, job_size
from perseus.cli.planning import plan_with_progress
from perseus.cli.profile_args import add_profile_args, load_profile_arg, schedule_for
from perseus.errors import ConfigError

if TYPE_CHECKING:
    from perseus.frontier import Frontier

SWEEP_MICROBATCHES = (12, 24, 48, 96)
SWEEP_FACTORS = (1.0, 1.1, 1.2, 1.3, 1.4, 1.5)

EPILOG = """\
examples:
  perseus emulate --example --gpus 1024 --tp 8 --straggler-factor 1.2
  perseus emulate --frontier frontier.json --dp 16 --tp 8 --straggler-factor 1.1
  perseus emulate --profile gpt3.csv --p-blocking 83.64 --stages 8 --gpus 1024 --tp 8 --sweep --cache-dir cache/
  perseus emulate --frontier frontier.json --carbon-trace CISO.csv --time-budget 2.5 --gpus 1024 --tp 8 --json
  perseus emulate --frontier frontier.json --power-cap-w 250000 --gpus 1024 --tp 8

policies: (1) all max frequency everywhere; (2) intrinsic-only Perseus: every pipeline at the
no-slowdown point, the others then wait for the straggler; (3) Perseus with the others slowed to
the straggler's iteration time (frontier lookup). The straggler's extra time is spent blocked at
P_blocking. Savings are against (1). See docs/cli.md.
"""


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_profile_args(p, allow_frontier=True)
    p.add_argument("--microbatches", type=number_list(int), metavar="M", help="microbatches per iteration (--sweep: list, default 12,24,48,96)")
    add_job_args(p)
    p.add_argument("--straggler-factor", type=number_list(float), metavar="F", help="straggler slowdown, >= 1.0 (--sweep: list, default 1.0,1.1,...,1.5)")
    p.add_argument("--sweep", action="store_true", help="table over microbatch counts and straggler factors")
    p.add_argument("--cache-dir", type=Path, metavar="DIR", help="--sweep: reuse frontiers saved here by an earlier run")
    emulate_grid.add_arguments(p)


def run(args: argparse.Namespace) -> int:
    from perseus.frontier import load_frontier
    from perseus.output.tables import emulation_table
    from perseus.timeline.emulator import emulate

    if args.carbon_trace is not None or args.power_cap_w is not None:
        return emulate_grid.run(args)
    if args.gpus is None and args.dp is None:
        raise UsageError("give the job size: --gpus N (total GPUs) or --dp D (number of pipelines)")
    if args.sweep:
        return _sweep(args)
    if args.microbatches is not None and len(args.microbatches) != 1:
        raise UsageError("--microbatches takes one value (lists only with --sweep)")
    if args.straggler_factor is None or len(args.straggler_factor) != 1:
        raise UsageError("--straggler-factor F is required, one value (lists only with --sweep)")
    microbatches = args.microbatches[0] if args.microbatches else None
    if args.straggler_factor[0] < 1.0:  # checked before planning, which can take a while
        raise ConfigError(f"straggler factor must be >= 1.0 (1.0 = no straggler), got {args.straggler_factor[0]}")
    if args.frontier is not None:
        given = [flag for flag, value in (("--stages", args.stages), ("--microbatches", microbatches),
                 ("--p-blocking", args.p_blocking), ("--chunks", args.chunks if args.chunks != 1 else None),
                 ("--group-size", args.group_size), ("--overlap-p2p", args.overlap_p2p or None),
                 ("--schedule", args.schedule if args.schedule != "1f1b" else None)) if value is not None]
        if given:
            raise UsageError(f"{', '.join(given)}: these come from the --frontier file; leave them out")
        frontier = load_frontier(args.frontier)
    else:
        profile, _ = load_profile_arg(args)
        schedule, profile = schedule_for(args, profile, microbatches)
        job_size(args, schedule.num_stages)  # validate the job size before planning
        frontier = plan_with_progress(schedule, profile, args.progress)
    job = job_size(args, frontier.schedule.num_stages)
    result = emulate(frontier, job, args.straggler_factor[0])
    print(emulation_table(result, frontier))
    return 0


def _sweep(args: argparse.Namespace) -> int:
    from perseus.output.tables import sweep_report
    from perseus.timeline.emulator import cached_frontier, sweep

    if args.frontier is not None:
        raise UsageError("--sweep plans one frontier per microbatch count; give --profile or --example, not --frontier")
    microbatches = args.microbatches or list(SWEEP_MICROBATCHES)
    factors = args.straggler_factor or list(SWEEP_FACTORS)
    loaded, _ = load_profile_arg(args)
    built = {m: schedule_for(args, loaded, m) for m in microbatches}  # validate all before planning
    schedules = {m: schedule for m, (schedule, _) in built.items()}
    num_stages = next(iter(schedules.values())).num_stages
    job_size(args, num_stages)
    if any(f < 1.0 for f in factors):
        raise ConfigError(f"straggler factors must be >= 1.0, got {factors}")
    cache_dir = args.cache_dir

    def frontier_for(m: int) -> Frontier:
        return cached_frontier(schedules[m], built[m][1], lambda s, p: plan_with_progress(s, p, args.progress), cache_dir)

    rows = sweep(frontier_for, microbatches, factors, args.gpus, args.tp, num_stages, args.dp)
    print(sweep_report(rows))
    return 0


COMMAND = Command("emulate", help="emulate data parallelism with a straggler",
                  description="Energy of a large data-parallel job with one straggler pipeline under three frequency policies.",
                  add_arguments=add_arguments, run=run, epilog=EPILOG)
