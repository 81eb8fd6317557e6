"""The planner as the commands run it: imported on first use, with a progress bar on stderr.

``run_planner`` is the one seam between the CLI and the planner (tests replace it to keep the
commands fast); scipy and HiGHS load only when a command plans.
"""

from __future__ import annotations

import sys
from contextlib import contextmanager
from typing import TYPE_CHECKING, Callable, Iterator

if TYPE_CHECKING:
    from perseus.frontier import Frontier
    from perseus.profile import Profile
    from perseus.schedules import Schedule


def run_planner(schedule: Schedule, profile: Profile, progress: Callable[[float], None] | None = None) -> Frontier:
    """The planner, imported on first use: it loads scipy and HiGHS, which other commands never need."""
    from perseus.planner import plan_frontier as plan

    return plan(schedule, profile, progress=progress)


def plan_with_progress(schedule: Schedule, profile: Profile, show_progress: bool | None) -> Frontier:
    """``run_planner`` behind a bar: ``show_progress=None`` shows it only when stderr is a terminal."""
    with _progress_bar(show_progress, f"planning {schedule.num_stages}x{schedule.num_microbatches}") as progress:
        return run_planner(schedule, profile, progress=progress)


@contextmanager
def _progress_bar(enabled: bool | None, label: str) -> Iterator[Callable[[float], None]]:
    """A tqdm bar on stderr driven by the planner's fraction-done callback (None: on a terminal only,
    which keeps logs clean)."""
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
