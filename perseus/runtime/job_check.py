"""The periodic job check: every K deployed steps, all ranks share their window's numbers.

From them every rank learns how much slower the slowest data-parallel pipeline is than its own
(the straggler policy's input), the job-wide energy per iteration, and whether any rank's
instructions diverged from the plan (then every rank falls back together).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from statistics import median
from typing import Any

from perseus.runtime.collective import Collective
from perseus.runtime.events import PipelineJob
from perseus.runtime.straggler import pipeline_times, slowdown_against_slowest

log = logging.getLogger("perseus.runtime")


@dataclass(frozen=True)
class JobCheck:
    """One check's outcome, the same on every rank of a pipeline."""

    slowdown: float  # slowest pipeline's natural time / this pipeline's (>= 1)
    diverged: bool  # some rank's instructions no longer match the plan
    numbers: dict[str, Any]  # job-wide numbers for the summary (``PerseusRuntime.job_numbers``)


def check_job(collective: Collective, job: PipelineJob, step: int, window: list[tuple[float, float]],
              diverged_here: bool) -> JobCheck:
    """Collective, every rank at the same step. ``window``: this rank's (natural time, energy)
    per step since the last check."""
    # Median, not mean: one iteration slowed by something else on the node (a checkpoint, a noisy
    # neighbour) must not look like a straggler or hide a recovery.
    natural_s = median(t for t, _ in window)
    energy = sum(e for _, e in window)
    rows = collective.all_gather_floats(
        [float(job.dp_rank), natural_s, energy, float(len(window)), 1.0 if diverged_here else 0.0]
    )
    pipelines = pipeline_times((int(r[0]), r[1]) for r in rows)
    order = sorted(pipelines)
    times = [pipelines[d] for d in order]
    slowdown = slowdown_against_slowest(times, order.index(job.dp_rank))
    numbers = {
        "step": step,
        "pipeline_natural_time_s": dict(zip(order, times)),
        "energy_per_iteration_j": sum(r[2] / max(r[3], 1) for r in rows),
        "slowdown_seen": slowdown,
    }
    if collective.is_root:
        log.info(
            "perseus: job energy %.2f J/iteration over %d GPUs; pipeline times %s",
            numbers["energy_per_iteration_j"], len(rows), ", ".join(f"{t * 1e3:.1f} ms" for t in times),
        )
    return JobCheck(slowdown, any(r[4] for r in rows), numbers)
