"""``perseus plot``: the time-energy frontier, or the pipeline timeline of one of its points."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING, Callable

from perseus.cli.common import Command, UsageError, output_file
from perseus.cli.profile_args import adapt_profile, fused_profile
from perseus.examples import load_example_profile
from perseus.profile import Profile, load_profile

if TYPE_CHECKING:
    from perseus.frontier import Frontier, FrontierPoint


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("frontier", type=Path, help="frontier.json written by 'perseus plan'")
    p.add_argument("--out", type=Path, required=True, metavar="IMAGE", help="output image (.png, .pdf or .svg)")
    p.add_argument("--timeline", action="store_true", help="draw the pipeline timeline of one point (above it: all max frequency)")
    p.add_argument("--point", default="default", metavar="WHICH", help="default | fastest | slowest | INDEX as 'perseus show' numbers it (default: default)")
    p.add_argument("--profile", type=Path, metavar="P", help="profile for instruction durations (default: the one recorded in the frontier)")


def run(args: argparse.Namespace) -> int:
    from perseus.frontier import load_frontier
    from perseus.output import plot  # matplotlib is imported only by commands that draw

    out = output_file(args.out)
    plot.image_format(out)
    frontier = load_frontier(args.frontier)
    if args.timeline:
        point, label = select_point(frontier, args.point)
        profile = _timeline_profile(args.profile, frontier)
        plot.plot_timeline(frontier, point, label, profile, out)
        print(f"wrote {out}: pipeline timelines of all max frequency and {label}")
    else:
        if args.profile is not None or args.point != "default":
            raise UsageError("--point and --profile only apply with --timeline")
        plot.plot_frontier(frontier, out)
        print(f"wrote {out}: time-energy frontier of {len(frontier.points)} points")
    return 0


def select_point(frontier: Frontier, selector: str) -> tuple[FrontierPoint, str]:
    """``default`` | ``fastest`` | ``slowest`` | an index (as ``perseus show`` numbers them)."""
    named: dict[str, Callable[[], FrontierPoint]] = {
        "default": frontier.default_point, "fastest": lambda: frontier.fastest, "slowest": lambda: frontier.slowest}
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


def _timeline_profile(given: Path | None, frontier: Frontier) -> Profile:
    """The profile the timeline's durations come from: ``--profile``, or the one the frontier was
    planned from, adapted as ``perseus plan`` adapted it (chunks, split backward, fused units)."""
    if given is not None:
        return load_profile(given, frontier.p_blocking_w)
    recorded = frontier.metadata.get("profile")
    share = frontier.metadata.get("split_backward")
    example = recorded == "example"
    derive_fused = example or bool(frontier.metadata.get("fused_sum"))

    def adapted(profile: Profile) -> Profile:
        profile = adapt_profile(profile, example=example, chunks=frontier.schedule.num_chunks,
                                split_share=float(share) if share is not None else None)
        return fused_profile(frontier.schedule, profile, derive=derive_fused)

    if example:
        return adapted(load_example_profile())
    if recorded and Path(recorded).is_file():
        return adapted(load_profile(recorded, frontier.p_blocking_w))
    if recorded:
        raise UsageError(f"the frontier was planned from {recorded}, which is not there; pass --profile P")
    raise UsageError("--timeline needs --profile P (the profile the frontier was planned from)")


COMMAND = Command("plot", help="draw the frontier or a pipeline timeline",
                  description="Draw the time-energy frontier, or (--timeline) the pipeline timeline of one point colored by frequency.",
                  add_arguments=add_arguments, run=run,
                  epilog="examples:\n  perseus plot frontier.json --out frontier.png\n"
                         "  perseus plot frontier.json --timeline --point default --profile prof.csv --out timeline.png")
