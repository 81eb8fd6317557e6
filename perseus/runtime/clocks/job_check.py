"""The periodic job check: every K deployed steps, all ranks share their window's numbers.

On the hierarchical control plane the check runs on the control thread and its answer is used at
the next check (``Deployment.end_step``): the training thread never waits on the data-parallel
all-gather, and every rank still applies the same answer at the same step.

From them every rank learns how much slower the slowest data-parallel pipeline is than its own
(the straggler policy's input), the job-wide energy per iteration, and whether any rank's
instructions diverged from the plan (then every rank falls back together).
"""

from __future__ import annotations

import logging
import math
from concurrent.futures import Future
from dataclasses import dataclass
from statistics import median
from typing import Any

from perseus.runtime.plane.collective import Collective, PipelineRow
from perseus.runtime.job import PipelineJob
from perseus.runtime.clocks.straggler import slowdown_against_slowest

log = logging.getLogger("perseus.runtime")


@dataclass(frozen=True)
class JobCheck:
    """One check's outcome, the same on every rank of a pipeline."""

    slowdown: float  # slowest pipeline's natural time / this pipeline's (>= 1)
    diverged: bool  # some rank's instructions no longer match the plan
    numbers: dict[str, Any]  # job-wide numbers for the summary (``PerseusRuntime.job_numbers``)


def window_row(window: list[tuple[float, float]]) -> tuple[float, float]:
    """This rank's (natural time, energy per iteration) over the steps since the last check.
    Median, not mean: one iteration slowed by something else on the node (a checkpoint, a noisy
    neighbour) must not look like a straggler or hide a recovery. Energy is the mean over the
    measured steps (an unmeasured one is NaN: the counter's reads failed); NaN when none was."""
    measured = [e for _, e in window if not math.isnan(e)]
    return median(t for t, _ in window), sum(measured) / len(measured) if measured else math.nan


def start_check(collective: Collective, job: PipelineJob, window: list[tuple[float, float]],
                diverged_here: bool) -> "Future[list[PipelineRow]]":
    """Collective, every rank at the same step: this rank's window into the job check. On the
    hierarchical plane the answer comes later (``Collective.overlapped``); on the flat one at once."""
    natural_s, energy = window_row(window)
    return collective.start_pipeline_rows(job.dp_rank, natural_s, energy, diverged_here)


def job_check(rows: list[PipelineRow], job: PipelineJob, step: int, is_root: bool = False,
              answered_step: int | None = None) -> JobCheck:
    """The check's outcome from every pipeline's row (``Collective.pipeline_rows``), asked at ``step``
    and used at ``answered_step`` (the same step unless the control plane overlaps the check)."""
    order = [r.dp for r in rows]
    times = [r.natural_s for r in rows]
    slowdown = slowdown_against_slowest(times, order.index(job.dp_rank))
    numbers = {
        "step": step,
        "answered_step": step if answered_step is None else answered_step,
        "pipeline_natural_time_s": dict(zip(order, times)),
        "energy_per_iteration_j": sum(r.energy_j for r in rows),
        "slowdown_seen": slowdown,
    }
    if is_root:
        log.info(
            "perseus: job energy %.2f J/iteration over %d pipelines; pipeline times %s",
            numbers["energy_per_iteration_j"], len(rows), ", ".join(f"{t * 1e3:.1f} ms" for t in times),
        )
    return JobCheck(slowdown, any(r.diverged for r in rows), numbers)


def check_job(collective: Collective, job: PipelineJob, step: int, window: list[tuple[float, float]],
              diverged_here: bool) -> JobCheck:
    """The whole check at once (every rank at the same step): ``start_check`` and its answer."""
    rows = start_check(collective, job, window, diverged_here).result()
    return job_check(rows, job, step, collective.is_root)
