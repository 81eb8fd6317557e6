"""``perseus emulate --carbon-trace`` / ``--power-cap-w``: a trace of hours through the carbon policy
and its forecaster, or a job-wide power cap, replayed on the frontier (docs/carbon.md)."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from perseus.cli.arg_types import positive
from perseus.cli.common import UsageError
from perseus.cli.job_args import job_size
from perseus.cli.planning import plan_with_progress
from perseus.cli.profile_args import load_profile_arg, schedule_for


def add_arguments(p: argparse.ArgumentParser) -> None:
    grid = p.add_argument_group("carbon and power (docs/carbon.md)")
    grid.add_argument("--carbon-trace", type=Path, metavar="CSV", help="hourly carbon-intensity trace to replay through "
                      "the carbon policy and its forecaster")
    grid.add_argument("--carbon-column", metavar="NAME", help="the trace's intensity column (default: found by name)")
    grid.add_argument("--time-budget", type=float, default=2.5, metavar="PCT",
                      help="average slowdown allowed, percent of the no-slowdown time (default 2.5)")
    grid.add_argument("--power-cap-w", type=positive(float), metavar="W", help="job-wide power cap in watts")
    grid.add_argument("--figure", type=Path, metavar="IMAGE", help="a week of intensity, chosen point and power")
    grid.add_argument("--json", action="store_true", help="print one JSON object instead of the table")


def run(args: argparse.Namespace) -> int:
    import json

    import numpy as np

    from perseus.carbon.policy import PointMenu
    from perseus.carbon.replay import replay_carbon, replay_power_cap
    from perseus.carbon.signals import load_trace
    from perseus.frontier import load_frontier

    if args.sweep or args.straggler_factor is not None:
        raise UsageError("--carbon-trace / --power-cap-w replay a job without a straggler; leave out --sweep and "
                         "--straggler-factor")
    if args.carbon_trace is None and args.figure is not None:
        raise UsageError("--figure draws the carbon replay; give --carbon-trace")
    if args.carbon_trace is not None and not 0.0 <= args.time_budget <= 100.0:
        raise UsageError(f"--time-budget is a percentage in [0, 100], got {args.time_budget}")
    trace = load_trace(args.carbon_trace, args.carbon_column) if args.carbon_trace is not None else None
    if args.frontier is not None:
        frontier = load_frontier(args.frontier)
    else:
        profile, _ = load_profile_arg(args)
        microbatches = args.microbatches[0] if args.microbatches else None
        schedule, profile = schedule_for(args, profile, microbatches)
        frontier = plan_with_progress(schedule, profile, args.progress)
    stages = frontier.schedule.num_stages
    job = job_size(args, stages) if (args.gpus is not None or args.dp is not None) else None
    gpus = job.num_gpus if job is not None else stages * args.tp
    scale = gpus / stages  # pipelines x TP: job power = scale x one pipeline's power
    menu = PointMenu.from_frontier(frontier)
    carbon: dict[str, Any] | None = None
    power_cap: dict[str, Any] | None = None
    if trace is not None:
        hour0 = int((trace.times[0] // 3600) % 24)
        replay = replay_carbon(menu, trace.hourly(), hour0, args.time_budget / 100.0, scale)
        carbon = {"trace": str(args.carbon_trace), "column": trace.column, "missing_hours": trace.missing,
                  **replay.summary()}
        if args.figure is not None:
            from perseus.output.carbon_plot import carbon_week_figure

            carbon_week_figure(replay, args.figure)
    if args.power_cap_w is not None:
        windows = len(trace.hourly()) if trace is not None else 1
        power_cap = replay_power_cap(menu, np.full(windows, args.power_cap_w), scale).summary()
    if args.json:
        flat: dict[str, Any] = {**(carbon or {}), "gpus": gpus, "stages": stages, "tensor_parallel": args.tp}
        if power_cap is not None:
            flat["power_cap"] = power_cap
        print(json.dumps(flat, indent=2, sort_keys=True))
        return 0
    print(f"perseus emulate: {gpus} GPUs ({stages} stages x TP {args.tp}), frontier of {len(frontier.points)} points")
    if carbon is not None:
        _print_carbon(carbon, args.time_budget)
    if power_cap is not None:
        _print_power_cap(power_cap, args.power_cap_w)
    return 0


def _print_carbon(c: dict[str, Any], time_budget: float) -> None:
    print(f"carbon trace {c['trace']} ({c['column']}, {c['hours']} h, mean {c['mean_ci']:.1f} gCO2/kWh), "
          f"time budget +{time_budget:g} %")
    rows = [("no slowdown", c["no_slowdown_carbon_saving"], 0.0),
            (f"uniform +{time_budget:g} %", c["uniform_carbon_saving"], c["uniform_time_change"]),
            ("carbon-aware (forecast)", c["carbon_saving"], c["time_change"]),
            ("carbon-aware (hindsight)", c["hindsight_carbon_saving"], c["hindsight_time_change"])]
    print(f"{'policy':<26}{'carbon saving':>14}{'time':>10}")
    for name, saving, time_change in rows:
        print(f"{name:<26}{100 * saving:>13.2f}%{100 * time_change:>+9.2f}%")
    print(f"forecast MAE {c['forecast_mae']:.1f} gCO2/kWh (persistence {c['persistence_mae']:.1f}); "
          f"{c['carbon_t']:.1f} t CO2, {c['energy_kwh'] / 1000:.1f} MWh over the trace")


def _print_power_cap(p: dict[str, Any], cap_w: float) -> None:
    print(f"power cap {cap_w:g} W (all-max clocks: {p['all_max_power_w']:.0f} W): "
          f"runs at {p['max_power_w']:.0f} W, throughput loss {100 * p['throughput_loss']:.2f} % "
          f"(hindsight bound {100 * p['hindsight_throughput_loss']:.2f} %)"
          + ("; no point is under the cap, the least-power point runs" if p["unreachable_windows"] else ""))
