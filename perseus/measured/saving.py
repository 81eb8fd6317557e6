"""Energy savings: the best one the runs measured, and the one the project's own plan predicts.

Both are against the same baseline: the all-max runs measured in the workload's directory, the
mean of their medians (the artifact has two, schedules 0 and 1, which differ by up to 0.5 % in
time and 0.3 % in energy; the mean halves that noise instead of picking one).
"""

from __future__ import annotations

from dataclasses import dataclass

from perseus.errors import ProfileError
from perseus.measured.model import MeasuredModel
from perseus.measured.runs import Workload
from perseus.planner import PlannerOptions, plan_frontier


@dataclass(frozen=True)
class Baseline:
    """The all-max runs' mean time and energy, and which schedules they are."""

    time_s: float
    energy_j: float
    schedules: tuple[int, ...]  # schedule numbers N


@dataclass(frozen=True)
class PlannedSaving:
    """The frontier point at the measured all-max time against the all-max plan, both predicted."""

    saving: float
    time_s: float  # predicted, non-compute time included
    energy_j: float
    baseline_time_s: float
    baseline_energy_j: float


def measured_baseline(workload: Workload) -> Baseline:
    runs = [workload.runs[i] for i in workload.all_max]
    if not runs:
        raise ProfileError(f"{workload.path}: no run holds every instruction at the max clock: no baseline")
    return Baseline(sum(r.time_s for r in runs) / len(runs), sum(r.energy_j for r in runs) / len(runs),
                    tuple(r.index for r in runs))


def measured_best_saving(workload: Workload, max_slowdown: float = 0.005) -> float | None:
    """The largest measured energy saving (a fraction) among the schedules at most ``max_slowdown``
    slower than the baseline, the all-max schedules included; None when none is."""
    base = measured_baseline(workload)
    savings = [1 - run.energy_j / base.energy_j for run in workload.runs
               if run.time_s <= base.time_s * (1 + max_slowdown)]
    return max(savings) if savings else None


def planned_saving(model: MeasuredModel, workload: Workload, options: PlannerOptions | None = None) -> PlannedSaving:
    """``plan_frontier`` on the model's profile, looked up at the measured all-max time.

    The frontier's times are critical paths; the model adds the non-compute time (and its energy at
    P_blocking on every stage) to the point and to the all-max plan alike.
    """
    base = measured_baseline(workload)
    frontier = plan_frontier(model.dag.schedule, model.profile(), options)
    point = frontier.lookup(base.time_s - model.overhead_s)
    extra_j = model.p_blocking_w * model.stages * model.overhead_s
    energy, baseline_energy = point.energy_j + extra_j, frontier.baseline_energy_j + extra_j
    return PlannedSaving(1 - energy / baseline_energy, point.time_s + model.overhead_s, energy,
                         frontier.baseline_time_s + model.overhead_s, baseline_energy)
