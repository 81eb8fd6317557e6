"""The ``perseus`` command: plan, show, plot, export, emulate (and ``demo``, from ``perseus_demo``).

Each subcommand is a thin shell over the library (planner, frontier, plot, export, emulator).
Every user error — bad arguments, unreadable or malformed files, impossible configurations — is
printed as one line ``perseus: error: ...`` on stderr with exit status 2, and nothing is written:
outputs are checked before the work starts and written atomically at the end.

Start-up stays fast: this module imports neither numpy nor the planner (scipy, HiGHS), the
emulator, matplotlib or torch; each command imports what it uses. Plugin commands (``perseus
demo``) are looked up only when the command is not a built-in one, or for the help.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Iterator, NoReturn, Sequence

from perseus import __version__
from perseus.errors import ConfigError, PerseusError
from perseus.examples import EXAMPLE_MICROBATCHES, example_profile_path, load_example_profile
from perseus.profile import Profile, fuse_forward_backward, load_profile, split_backward, split_into_chunks
from perseus.schedules import FUSED, SCHEDULES, SPLIT_BACKWARD, Schedule, build_schedule
from perseus.frontier import save_frontier

if TYPE_CHECKING:
    from perseus.timeline.emulator import DataParallelJob
    from perseus.frontier import Frontier, FrontierPoint

SWEEP_MICROBATCHES = (12, 24, 48, 96)
SWEEP_FACTORS = (1.0, 1.1, 1.2, 1.3, 1.4, 1.5)


class UsageError(PerseusError):
    """Command-line arguments are missing, malformed or contradictory."""


class _Parser(argparse.ArgumentParser):
    """ArgumentParser whose errors become one-line ``UsageError``s (no usage dump)."""

    def error(self, message: str) -> NoReturn:
        raise UsageError(f"{message} (see '{self.prog} --help')")


# ---------------------------------------------------------------- shared helpers


def _output_file(path: Path) -> Path:
    """Fail before any work if ``path`` cannot be an output file."""
    if path.is_dir():
        raise UsageError(f"{path}: is a directory; give a file name for --out")
    if not path.absolute().parent.is_dir():
        raise UsageError(f"{path.absolute().parent}: directory does not exist; create it first")
    return path


def _load_profile_arg(args: argparse.Namespace) -> tuple[Profile, str]:
    """The profile from --profile or --example, with --p-blocking / --gpu-name applied."""
    if getattr(args, "example", False):
        profile, source = load_example_profile(), f"{example_profile_path()} (shipped example)"
    else:
        profile, source = load_profile(args.profile), str(args.profile)
    profile = _adapt_profile(args, profile.with_p_blocking(args.p_blocking))
    if getattr(args, "gpu_name", None):
        profile = replace(profile, gpu_name=args.gpu_name)
    return profile, source


def _schedule_for(args: argparse.Namespace, profile: Profile, microbatches: int | None) -> tuple[Schedule, Profile]:
    """Build the schedule from --schedule/--stages/--chunks, checking it against the profile (with
    fused units derived by --fused-sum, or for --example, where the schedule has them)."""
    stages = args.stages
    if stages is None:
        if not getattr(args, "example", False):
            raise UsageError("--stages is required with --profile (the number of pipeline stages)")
        stages = profile.num_stages
    if microbatches is None:
        if not getattr(args, "example", False):
            raise UsageError("--microbatches is required with --profile (microbatches per iteration)")
        microbatches = EXAMPLE_MICROBATCHES
    schedule = build_schedule(args.schedule, stages, microbatches, args.chunks, getattr(args, "group_size", None),
                              getattr(args, "overlap_p2p", False))
    _check_split_backward(schedule, profile)
    profile = _fused_profile(args, schedule, profile)
    profile.check_matches(schedule)
    profile.require_p_blocking()
    return schedule, profile


def _fused_profile(args: argparse.Namespace, schedule: Schedule, profile: Profile) -> Profile:
    """Overlapped schedules' fused units: measured in the profile, or derived as forward + backward
    (--fused-sum; always for the synthetic --example, which measures nothing)."""
    if not any(inst.kind == FUSED for stage in schedule.stages for inst in stage):
        return profile
    if any(kind == FUSED for _, _, kind in profile.entries):
        return profile
    if not (getattr(args, "fused_sum", False) or getattr(args, "example", False)):
        raise UsageError(
            f"schedule {schedule.name!r} runs fused forward+backward units, which {profile.source} does not measure; "
            "profile them (the runtime's online profiling does) or derive each as its forward plus its backward "
            "with --fused-sum"
        )
    return fuse_forward_backward(profile, schedule)


def _adapt_profile(args: argparse.Namespace, profile: Profile) -> Profile:
    """--example with --chunks C: the example's stages split evenly into C chunks; --split-backward:
    zero-bubble's I and W derived from each backward."""
    if getattr(args, "example", False) and args.chunks > 1 and profile.num_chunks == 1:
        profile = split_into_chunks(profile, args.chunks)
    if getattr(args, "split_backward", None) is not None:
        profile = split_backward(profile, args.split_backward)
    return profile


def _check_split_backward(schedule: Schedule, profile: Profile) -> None:
    needs = {inst.kind for stage in schedule.stages for inst in stage} & set(SPLIT_BACKWARD)
    has = {kind for _, _, kind in profile.entries}
    if needs and not needs <= has:
        raise UsageError(
            f"schedule {schedule.name!r} splits backwards into backward_input (I) and backward_weight (W), which "
            f"{profile.source} does not measure; profile them (perseus_torch's online profiling does) or derive "
            "them from backward with --split-backward 0.5 (I's share of B)"
        )


@contextmanager
def _progress_bar(enabled: bool | None, label: str) -> Iterator[Callable[[float], None]]:
    """A tqdm bar on stderr driven by the planner's fraction-done callback.

    ``enabled=None`` shows it only when stderr is a terminal (keeps logs clean).
    """
    from tqdm import tqdm

    disable = (not sys.stderr.isatty()) if enabled is None else not enabled
    bar = tqdm(total=100, desc=label, file=sys.stderr, disable=disable, leave=False,
               bar_format="{desc}: {percentage:3.0f}%|{bar}| {elapsed}")

    def update(fraction: float) -> None:
        bar.n = round(100 * min(max(float(fraction), 0.0), 1.0))
        bar.refresh()

    try:
        yield update
    finally:
        bar.close()


def run_planner(schedule: Schedule, profile: Profile, progress: Callable[[float], None] | None = None) -> Frontier:
    """The planner, imported on first use: it loads scipy and HiGHS, which other commands never need."""
    from perseus.planner import plan_frontier as plan

    return plan(schedule, profile, progress=progress)


def _plan(schedule: Schedule, profile: Profile, show_progress: bool | None) -> Frontier:
    s = schedule
    with _progress_bar(show_progress, f"planning {s.num_stages}x{s.num_microbatches}") as progress:
        return run_planner(schedule, profile, progress=progress)


def _number_list(kind: type) -> Callable[[str], list]:
    """argparse type: ``12,24,48`` → ``[12, 24, 48]``."""

    def parse(text: str) -> list:
        try:
            values = [kind(part) for part in text.split(",") if part.strip()]
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected comma-separated {kind.__name__}s, got {text!r}") from None
        if not values:
            raise argparse.ArgumentTypeError("expected at least one value")
        if not all(math.isfinite(v) for v in values):
            raise argparse.ArgumentTypeError(f"values must be finite, got {text!r}")
        return values

    parse.__name__ = f"{kind.__name__} list"
    return parse


def _share(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not 0.0 < value < 1.0:
        raise argparse.ArgumentTypeError(f"must be between 0 and 1, got {text!r}")
    return value


def _positive(kind: type) -> Callable[[str], int | float]:
    def parse(text: str) -> int | float:
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a {kind.__name__}, got {text!r}") from None
        if not (value > 0 and math.isfinite(value)):
            raise argparse.ArgumentTypeError(f"must be positive, got {text!r}")
        return value

    parse.__name__ = kind.__name__
    return parse


def select_point(frontier: Frontier, selector: str) -> tuple[FrontierPoint, str]:
    """``default`` | ``fastest`` | ``slowest`` | an index (as ``perseus show`` numbers them)."""
    named = {"default": frontier.default_point, "fastest": lambda: frontier.fastest, "slowest": lambda: frontier.slowest}
    if selector in named:
        point = named[selector]()
        return point, f"the {selector} point [{frontier.points.index(point)}]"
    try:
        index = int(selector)
    except ValueError:
        raise UsageError(f"--point must be default, fastest, slowest or a point index, got {selector!r}") from None
    if not 0 <= index < len(frontier.points):
        raise UsageError(f"--point {index} is out of range; the frontier has points 0..{len(frontier.points) - 1}")
    return frontier.points[index], f"point [{index}]"


# ---------------------------------------------------------------- subcommands


def cmd_plan(args: argparse.Namespace) -> int:
    from perseus.output.tables import plan_summary

    out = _output_file(args.out)
    profile, source = _load_profile_arg(args)
    schedule, profile = _schedule_for(args, profile, args.microbatches)
    frontier = _plan(schedule, profile, args.progress)
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


def cmd_show(args: argparse.Namespace) -> int:
    from perseus.frontier import load_frontier
    from perseus.output.tables import frontier_table

    frontier = load_frontier(args.frontier)
    print(frontier_table(frontier, None if args.all else args.rows))
    return 0


def _timeline_profile(args: argparse.Namespace, frontier: Frontier) -> Profile:
    if args.profile is not None:
        return load_profile(args.profile, frontier.p_blocking_w)
    recorded = frontier.metadata.get("profile")
    share = frontier.metadata.get("split_backward")
    adapt = argparse.Namespace(example=recorded == "example", chunks=frontier.schedule.num_chunks,
                               split_backward=float(share) if share is not None else None)
    fused = argparse.Namespace(example=recorded == "example", fused_sum=bool(frontier.metadata.get("fused_sum")))
    if recorded == "example":
        return _fused_profile(fused, frontier.schedule, _adapt_profile(adapt, load_example_profile()))
    if recorded and Path(recorded).is_file():
        return _fused_profile(fused, frontier.schedule, _adapt_profile(adapt, load_profile(recorded, frontier.p_blocking_w)))
    if recorded:
        raise UsageError(f"the frontier was planned from {recorded}, which is not there; pass --profile P")
    raise UsageError("--timeline needs --profile P (the profile the frontier was planned from)")


def cmd_plot(args: argparse.Namespace) -> int:
    from perseus.output import plot  # matplotlib is imported only by commands that draw
    from perseus.frontier import load_frontier

    out = _output_file(args.out)
    plot.image_format(out)
    frontier = load_frontier(args.frontier)
    if args.timeline:
        point, label = select_point(frontier, args.point)
        profile = _timeline_profile(args, frontier)
        plot.plot_timeline(frontier, point, label, profile, out)
        print(f"wrote {out}: pipeline timelines of all max frequency and {label}")
    else:
        if args.profile is not None or args.point != "default":
            raise UsageError("--point and --profile only apply with --timeline")
        plot.plot_frontier(frontier, out)
        print(f"wrote {out}: time-energy frontier of {len(frontier.points)} points")
    return 0


def cmd_export(args: argparse.Namespace) -> int:
    from perseus.output.export import export_zeus
    from perseus.frontier import load_frontier

    frontier = load_frontier(args.frontier)
    files = export_zeus(frontier, args.out)
    order = f" ({files[-1].name} = fastest point, {files[0].name} = slowest)" if len(files) > 1 else ""
    print(f"wrote {len(files)} Zeus frequency file(s) to {args.out}/{order}; index: {args.out}/frontier_points.csv")
    return 0


def _job(args: argparse.Namespace, num_stages: int) -> DataParallelJob:
    from perseus.timeline.emulator import DataParallelJob

    if args.dp is not None:
        return DataParallelJob.from_gpus(args.dp * args.tp * num_stages, args.tp, num_stages)
    return DataParallelJob.from_gpus(args.gpus, args.tp, num_stages)


def cmd_emulate(args: argparse.Namespace) -> int:
    from perseus.timeline.emulator import emulate
    from perseus.frontier import load_frontier
    from perseus.output.tables import emulation_table

    if args.carbon_trace is not None or args.power_cap_w is not None:
        return _emulate_grid(args)
    if args.gpus is None and args.dp is None:
        raise UsageError("give the job size: --gpus N (total GPUs) or --dp D (number of pipelines)")
    if args.sweep:
        return _emulate_sweep(args)
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
        profile, _ = _load_profile_arg(args)
        schedule, profile = _schedule_for(args, profile, microbatches)
        _job(args, schedule.num_stages)  # validate the job size before planning
        frontier = _plan(schedule, profile, args.progress)
    job = _job(args, frontier.schedule.num_stages)
    result = emulate(frontier, job, args.straggler_factor[0])
    print(emulation_table(result, frontier))
    return 0


def _emulate_grid(args: argparse.Namespace) -> int:
    """``--carbon-trace`` / ``--power-cap-w``: a trace of hours through the carbon policy, or a cap."""
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
        profile, _ = _load_profile_arg(args)
        microbatches = args.microbatches[0] if args.microbatches else None
        schedule, profile = _schedule_for(args, profile, microbatches)
        frontier = _plan(schedule, profile, args.progress)
    stages = frontier.schedule.num_stages
    job = _job(args, stages) if (args.gpus is not None or args.dp is not None) else None
    gpus = job.num_gpus if job is not None else stages * args.tp
    scale = gpus / stages  # pipelines x TP: job power = scale x one pipeline's power
    menu = PointMenu.from_frontier(frontier)
    out: dict[str, object] = {"gpus": gpus, "stages": stages, "tensor_parallel": args.tp}
    if trace is not None:
        hour0 = int((trace.times[0] // 3600) % 24)
        replay = replay_carbon(menu, trace.hourly(), hour0, args.time_budget / 100.0, scale)
        out["carbon"] = {"trace": str(args.carbon_trace), "column": trace.column, "missing_hours": trace.missing,
                         **replay.summary()}
        if args.figure is not None:
            from perseus.output.carbon_plot import carbon_week_figure

            carbon_week_figure(replay, args.figure)
    if args.power_cap_w is not None:
        windows = len(trace.hourly()) if trace is not None else 1
        out["power_cap"] = replay_power_cap(menu, np.full(windows, args.power_cap_w), scale).summary()
    if args.json:
        flat = dict(out.get("carbon", {}))  # type: ignore[arg-type]
        flat.update({k: v for k, v in out.items() if k != "carbon"})
        print(json.dumps(flat, indent=2, sort_keys=True))
        return 0
    print(f"perseus emulate: {gpus} GPUs ({stages} stages x TP {args.tp}), frontier of {len(frontier.points)} points")
    if "carbon" in out:
        c = out["carbon"]  # type: ignore[assignment]
        print(f"carbon trace {c['trace']} ({c['column']}, {c['hours']} h, mean {c['mean_ci']:.1f} gCO2/kWh), "
              f"time budget +{args.time_budget:g} %")
        rows = [("no slowdown", c["no_slowdown_carbon_saving"], 0.0),
                (f"uniform +{args.time_budget:g} %", c["uniform_carbon_saving"], c["uniform_time_change"]),
                ("carbon-aware (forecast)", c["carbon_saving"], c["time_change"]),
                ("carbon-aware (hindsight)", c["hindsight_carbon_saving"], c["hindsight_time_change"])]
        print(f"{'policy':<26}{'carbon saving':>14}{'time':>10}")
        for name, saving, time_change in rows:
            print(f"{name:<26}{100 * saving:>13.2f}%{100 * time_change:>+9.2f}%")
        print(f"forecast MAE {c['forecast_mae']:.1f} gCO2/kWh (persistence {c['persistence_mae']:.1f}); "
              f"{c['carbon_t']:.1f} t CO2, {c['energy_kwh'] / 1000:.1f} MWh over the trace")
    if "power_cap" in out:
        p = out["power_cap"]  # type: ignore[assignment]
        print(f"power cap {args.power_cap_w:g} W (all-max clocks: {p['all_max_power_w']:.0f} W): "
              f"runs at {p['max_power_w']:.0f} W, throughput loss {100 * p['throughput_loss']:.2f} % "
              f"(hindsight bound {100 * p['hindsight_throughput_loss']:.2f} %)"
              + ("; no point is under the cap, the least-power point runs" if p["unreachable_windows"] else ""))
    return 0


def _emulate_sweep(args: argparse.Namespace) -> int:
    from perseus.timeline.emulator import cached_frontier, sweep
    from perseus.output.tables import sweep_report

    if args.frontier is not None:
        raise UsageError("--sweep plans one frontier per microbatch count; give --profile or --example, not --frontier")
    microbatches = args.microbatches or list(SWEEP_MICROBATCHES)
    factors = args.straggler_factor or list(SWEEP_FACTORS)
    loaded, _ = _load_profile_arg(args)
    built = {m: _schedule_for(args, loaded, m) for m in microbatches}  # validate all before planning
    schedules = {m: schedule for m, (schedule, _) in built.items()}
    num_stages = next(iter(schedules.values())).num_stages
    _job(args, num_stages)
    if any(f < 1.0 for f in factors):
        raise ConfigError(f"straggler factors must be >= 1.0, got {factors}")
    cache_dir = args.cache_dir

    def frontier_for(m: int) -> Frontier:
        return cached_frontier(schedules[m], built[m][1], lambda s, p: _plan(s, p, args.progress), cache_dir)

    rows = sweep(frontier_for, microbatches, factors, args.gpus, args.tp, num_stages, args.dp)
    print(sweep_report(rows))
    return 0


def cmd_clockd(args: argparse.Namespace) -> int:
    from perseus.gpu.clockd import DaemonOptions, run

    options = DaemonOptions(args.socket, frozenset(args.allow_uid), frozenset(args.allow_gid), rate_hz=args.rate,
                            burst=args.burst, max_clients=args.max_clients, socket_mode=args.socket_mode,
                            verify_environ=args.verify_environ, require_open_device=args.require_open_device,
                            min_clock_check_s=args.min_clock_check_s)
    return run(args.gpu, args.gpus, args.sim_dir, options)


# ---------------------------------------------------------------- parser

MAIN_EPILOG = """\
typical workflow:
  perseus plan --example --out frontier.json          # plan on the shipped example profile
  perseus show frontier.json                          # the time-energy frontier as a table
  perseus plot frontier.json --out frontier.png       # ... as a figure
  perseus plot frontier.json --timeline --out timeline.png
  perseus export frontier.json --format zeus --out zeus_freqs/
  perseus emulate --example --gpus 1024 --tp 8 --straggler-factor 1.2

your own profile (Zeus CSV: stage,instruction,frequency,time,energy):
  perseus plan --profile prof.csv --p-blocking 83.64 --stages 8 --microbatches 12 --out frontier.json

Run 'perseus COMMAND --help' for the options of each command.
"""

PLAN_EPILOG = """\
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

EMULATE_EPILOG = """\
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


def _add_profile_args(p: argparse.ArgumentParser, *, allow_frontier: bool = False) -> None:
    source = p.add_mutually_exclusive_group(required=True)
    source.add_argument("--profile", type=Path, metavar="P", help="profile file: Zeus CSV (.csv) or perseus JSON (.json)")
    source.add_argument("--example", action="store_true", help="use the shipped example profile (4 stages, A100-like, synthetic)")
    if allow_frontier:
        source.add_argument("--frontier", type=Path, metavar="F", help="use an existing frontier.json instead of planning")
    p.add_argument("--stages", type=_positive(int), metavar="S", help="pipeline stages (required with --profile)")
    p.add_argument("--schedule", choices=SCHEDULES, default="1f1b", help="pipeline schedule (default: 1f1b)")
    p.add_argument("--chunks", type=_positive(int), default=1, metavar="C",
                   help="virtual chunks per stage: interleaved, torch-interleaved, zb-interleaved, megatron-combined-1f1b; 2 for zbv and dualpipev "
                        "(--example: its stages split evenly into C chunks)")
    p.add_argument("--group-size", type=_positive(int), metavar="G",
                   help="interleaved: megatron-core's microbatch_group_size_per_vp_stage (default: --stages)")
    p.add_argument("--overlap-p2p", action="store_true",
                   help="interleaved: megatron-core's overlap_p2p_comm is on (Megatron-LM's default for interleaved "
                        "runs; off with --no-overlap-p2p-communication): the exchanges' waits differ, not the order")
    p.add_argument("--split-backward", type=_share, metavar="SHARE",
                   help="zero-bubble schedules (zb-interleaved, zbv) on a profile without I/W: derive backward_input "
                        "as SHARE of each backward's time and energy and backward_weight as the rest (e.g. 0.5)")
    p.add_argument("--fused-sum", action="store_true",
                   help="overlapped schedules (dualpipev, megatron-combined-1f1b) on a profile without fused units: "
                        "derive each forward+backward unit as its forward plus its backward (as torch 2.13 runs "
                        "DualPipeV's; an upper bound where the overlap hides communication). --example always does")
    p.add_argument("--p-blocking", type=_positive(float), metavar="W", help="power while blocked on communication, watts (overrides the profile's)")
    p.add_argument("--progress", action=argparse.BooleanOptionalAction, default=None,
                   help="planner progress bar on stderr (default: only on a terminal)")


# ---------------------------------------------------------------- report (perseus.output.report_page)


def cmd_report(args: argparse.Namespace) -> int:
    from perseus.output.report_page import make_report, shown_text  # matplotlib is imported only when drawing

    data, files = make_report(args.run_dir, args.out, args.metrics, args.cache, args.run)
    print(f"wrote {files[0]} ({shown_text(data)}: {len(data.steps)} iterations; "
          f"figures: {', '.join(p.name for p in files[1:])})")
    for note in data.notes:
        print(f"note: {note}")
    return 0


def _add_report_command(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("report", help="one HTML page of a run: energy, time, frontier, clocks, saving",
                       formatter_class=argparse.RawDescriptionHelpFormatter,
                       description="Write a self-contained HTML report of a training run from its metrics file "
                                   "(metrics_file in the Perseus config; 'perseus demo' writes one too) and the "
                                   "runtime cache (frontier.json, profile.json). PNG figures are written next to "
                                   "the page and embedded in it. A metrics file appended by several runs is split "
                                   "by run id; the page shows the latest run unless --run says otherwise.",
                       epilog="examples:\n  perseus report runs/job42 --cache ~/.cache/perseus\n"
                              "  perseus report runs/job42 --run all\n"
                              "  perseus demo --out demo && perseus report demo")
    p.add_argument("run_dir", type=Path, metavar="RUN_DIR", help="directory with metrics.jsonl (or its one *.jsonl), or the metrics file itself")
    p.add_argument("--out", type=Path, metavar="REPORT.html", help="the page (default: RUN_DIR/report.html)")
    p.add_argument("--metrics", type=Path, metavar="FILE", help="the JSONL metrics file (default: the one in RUN_DIR)")
    p.add_argument("--cache", type=Path, metavar="DIR", help="runtime cache with */frontier.json (default: RUN_DIR/cache)")
    p.add_argument("--run", default="latest", metavar="ID|N|all",
                   help="which run of the metrics file: its run id, its number in the file (1, 2, ...), 'latest' "
                        "(default) or 'all' (each run, one after another)")
    p.set_defaults(handler=cmd_report)


BUILTIN_COMMANDS = ("plan", "show", "plot", "export", "emulate", "clockd", "report")


def build_parser(plugins: bool = True) -> argparse.ArgumentParser:
    """The ``perseus`` parser; ``plugins=False`` leaves out the entry-point commands (no lookup)."""
    parser = _Parser(
        prog="perseus",
        description="Perseus: remove energy bloat from pipeline-parallel training by planning per-instruction GPU frequencies.",
        epilog=MAIN_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"perseus {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    fmt = argparse.RawDescriptionHelpFormatter

    p = sub.add_parser("plan", help="plan the time-energy frontier of a profiled pipeline", epilog=PLAN_EPILOG, formatter_class=fmt,
                       description="Plan per-instruction frequencies: the iteration time-energy Pareto frontier.")
    _add_profile_args(p)
    p.add_argument("--microbatches", type=_positive(int), metavar="M", help=f"microbatches per iteration (required with --profile; --example: {EXAMPLE_MICROBATCHES})")
    p.add_argument("--gpu-name", metavar="NAME", help="GPU name recorded in the frontier file")
    p.add_argument("--out", type=Path, required=True, metavar="FRONTIER.json", help="where to write the frontier")
    p.add_argument("--max-points", type=int, metavar="N", help="write at most N points (>= 2), spread evenly in time")
    p.set_defaults(handler=cmd_plan)

    p = sub.add_parser("show", help="print a frontier file as a table", formatter_class=fmt,
                       description="Print a frontier: time, slowdown and energy saving against the all-max baseline.",
                       epilog="examples:\n  perseus show frontier.json\n  perseus show frontier.json --all")
    p.add_argument("frontier", type=Path, help="frontier.json written by 'perseus plan'")
    p.add_argument("--all", action="store_true", help="every point instead of about 20")
    p.add_argument("--rows", type=_positive(int), default=20, help=argparse.SUPPRESS)
    p.set_defaults(handler=cmd_show)

    p = sub.add_parser("plot", help="draw the frontier or a pipeline timeline", formatter_class=fmt,
                       description="Draw the time-energy frontier, or (--timeline) the pipeline timeline of one point colored by frequency.",
                       epilog="examples:\n  perseus plot frontier.json --out frontier.png\n"
                              "  perseus plot frontier.json --timeline --point default --profile prof.csv --out timeline.png")
    p.add_argument("frontier", type=Path, help="frontier.json written by 'perseus plan'")
    p.add_argument("--out", type=Path, required=True, metavar="IMAGE", help="output image (.png, .pdf or .svg)")
    p.add_argument("--timeline", action="store_true", help="draw the pipeline timeline of one point (above it: all max frequency)")
    p.add_argument("--point", default="default", metavar="WHICH", help="default | fastest | slowest | INDEX as 'perseus show' numbers it (default: default)")
    p.add_argument("--profile", type=Path, metavar="P", help="profile for instruction durations (default: the one recorded in the frontier)")
    p.set_defaults(handler=cmd_plot)

    p = sub.add_parser("export", help="write the frontier's plans for other tools (Zeus)", formatter_class=fmt,
                       description="Export every frontier point as a frequency file of Zeus's pipeline frequency optimizer.",
                       epilog="example:\n  perseus export frontier.json --format zeus --out zeus_freqs/")
    p.add_argument("frontier", type=Path, help="frontier.json written by 'perseus plan'")
    p.add_argument("--format", choices=("zeus",), default="zeus", help="output format (default: zeus)")
    p.add_argument("--out", type=Path, required=True, metavar="DIR", help="new or empty output directory")
    p.set_defaults(handler=cmd_export)

    p = sub.add_parser("emulate", help="emulate data parallelism with a straggler", epilog=EMULATE_EPILOG, formatter_class=fmt,
                       description="Energy of a large data-parallel job with one straggler pipeline under three frequency policies.")
    _add_profile_args(p, allow_frontier=True)
    p.add_argument("--microbatches", type=_number_list(int), metavar="M", help="microbatches per iteration (--sweep: list, default 12,24,48,96)")
    size = p.add_mutually_exclusive_group()
    size.add_argument("--gpus", type=_positive(int), metavar="N", help="total GPUs (pipelines = N / (TP x stages))")
    size.add_argument("--dp", type=_positive(int), metavar="D", help="number of data-parallel pipelines (instead of --gpus)")
    p.add_argument("--tp", type=_positive(int), default=1, metavar="T", help="tensor-parallel GPUs per stage (default 1)")
    p.add_argument("--straggler-factor", type=_number_list(float), metavar="F", help="straggler slowdown, >= 1.0 (--sweep: list, default 1.0,1.1,...,1.5)")
    p.add_argument("--sweep", action="store_true", help="table over microbatch counts and straggler factors")
    p.add_argument("--cache-dir", type=Path, metavar="DIR", help="--sweep: reuse frontiers saved here by an earlier run")
    grid = p.add_argument_group("carbon and power (docs/carbon.md)")
    grid.add_argument("--carbon-trace", type=Path, metavar="CSV", help="hourly carbon-intensity trace to replay through "
                      "the carbon policy and its forecaster")
    grid.add_argument("--carbon-column", metavar="NAME", help="the trace's intensity column (default: found by name)")
    grid.add_argument("--time-budget", type=float, default=2.5, metavar="PCT",
                      help="average slowdown allowed, percent of the no-slowdown time (default 2.5)")
    grid.add_argument("--power-cap-w", type=_positive(float), metavar="W", help="job-wide power cap in watts")
    grid.add_argument("--figure", type=Path, metavar="IMAGE", help="a week of intensity, chosen point and power")
    grid.add_argument("--json", action="store_true", help="print one JSON object instead of the table")
    p.set_defaults(handler=cmd_emulate, gpu_name=None)

    p = sub.add_parser("clockd", help="per-node GPU clock daemon, so trainers need no privileges", formatter_class=fmt,
                       description="Serve GPU clock changes on a Unix socket to allowlisted unprivileged trainers "
                                   "(they set PERSEUS_CLOCKD_SOCKET). Run once per node with CAP_SYS_ADMIN; see docs/gpu.md.",
                       epilog="example:\n  sudo perseus clockd --socket /run/perseus/clockd.sock --allow-gid 1000")
    p.add_argument("--socket", required=True, metavar="PATH", help="Unix socket to serve")
    p.add_argument("--allow-uid", type=int, action="append", default=[], metavar="N", help="uid allowed to change clocks (repeatable)")
    p.add_argument("--allow-gid", type=int, action="append", default=[], metavar="N", help="gid allowed to change clocks (repeatable)")
    p.add_argument("--gpu", choices=("nvml", "sim"), default="nvml", help="GPU backend (default: nvml)")
    p.add_argument("--gpus", type=_number_list(int), metavar="LIST", help="physical GPU indices to manage (default: all; sim: 0)")
    p.add_argument("--sim-dir", metavar="DIR", help="simulated GPUs' state directory (default: $PERSEUS_SIM_GPU_DIR)")
    p.add_argument("--rate", type=_positive(float), default=500.0, metavar="HZ", help="clock changes per second per client (default 500)")
    p.add_argument("--burst", type=_positive(int), default=50, metavar="N", help="back-to-back changes allowed (default 50)")
    p.add_argument("--max-clients", type=_positive(int), default=64, metavar="N", help="simultaneous connections (default 64)")
    p.add_argument("--socket-mode", type=lambda v: int(v, 8), default=0o666, metavar="OCTAL", help="socket file mode (default 666)")
    p.add_argument("--verify-environ", action="store_true",
                   help="require the CUDA_VISIBLE_DEVICES a client sends to match its /proc/PID/environ")
    p.add_argument("--require-open-device", action="store_true",
                   help="require a client to hold each GPU's /dev/nvidiaN open (proof the scheduler gave it that GPU)")
    p.add_argument("--min-clock-check-s", type=_positive(float), default=0.05, metavar="S",
                   help="shortest period at which a client may have its held clock read back (default 0.05)")
    p.set_defaults(handler=cmd_clockd)

    _add_report_command(sub)
    if plugins:
        _add_plugin_commands(sub)
    return parser


def _add_plugin_commands(sub: argparse._SubParsersAction) -> None:
    """Subcommands that other installed packages add through the ``perseus.commands`` entry points.

    ``perseus demo`` comes this way from ``perseus_demo``, so the library never imports the demo.
    """
    from importlib.metadata import entry_points

    for entry in sorted(entry_points(group="perseus.commands"), key=lambda e: e.name):
        entry.load()(sub)


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``perseus`` console script; returns the exit status."""
    argv = sys.argv[1:] if argv is None else list(argv)
    # Looking up installed plugins scans every distribution's metadata: only worth it when the
    # command may be one of theirs, or for the help that lists them.
    parser = build_parser(plugins=not argv or argv[0] not in BUILTIN_COMMANDS)
    try:
        args = parser.parse_args(argv)
        if getattr(args, "max_points", None) is not None and args.max_points < 2:
            raise UsageError("--max-points must be at least 2 (the fastest and the slowest point)")
        return args.handler(args)
    except PerseusError as exc:
        message = " ".join(str(exc).split())  # always one line
        print(f"perseus: error: {message}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("perseus: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # e.g. 'perseus show f.json | head': stop quietly
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0


if __name__ == "__main__":
    sys.exit(main())
