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
from perseus.frontier import Frontier
from perseus.planner import PlannerOptions, plan_frontier


@dataclass(frozen=True)
class Baseline:
    """The all-max runs' mean time and energy, and which schedules they are."""

    time_s: float
    energy_j: float
    schedules: tuple[int, ...]  # schedule numbers N


@dataclass(frozen=True)
class PlannedSaving:
    """The frontier point for a slowdown target against the all-max plan, both predicted with the
    non-compute time (its time, and its energy at P_blocking on every stage)."""

    saving: float
    time_s: float  # predicted, non-compute time included
    energy_j: float
    baseline_time_s: float
    baseline_energy_j: float
    max_slowdown: float = 0.0  # the target it was looked up at

    @property
    def slowdown(self) -> float:
        return self.time_s / self.baseline_time_s - 1


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


def model_frontier(model: MeasuredModel, options: PlannerOptions | None = None) -> Frontier:
    """``plan_frontier`` on the model's profile, carrying the model's non-compute time."""
    return plan_frontier(model.dag.schedule, model.profile(), options, non_compute=model.non_compute)


def planned_saving(model: MeasuredModel, workload: Workload, options: PlannerOptions | None = None,
                   max_slowdown: float = 0.0, frontier: Frontier | None = None) -> PlannedSaving:
    """The project's plan for at most ``max_slowdown`` (the job's slowdown, non-compute time
    included: ``Frontier.lookup_slowdown``) against the all-max plan; ``frontier``: one
    ``model_frontier`` already planned."""
    if not workload.all_max:
        raise ProfileError(f"{workload.path}: no run holds every instruction at the max clock: no baseline")
    frontier = model_frontier(model, options) if frontier is None else frontier
    point = frontier.lookup_slowdown(max_slowdown)
    outside_s = frontier.non_compute.time_s
    outside_j = frontier.non_compute.energy_j(frontier.p_blocking_w, frontier.schedule.num_stages)
    return PlannedSaving(frontier.saving(point), point.time_s + outside_s, point.energy_j + outside_j,
                         frontier.baseline_time_s + outside_s, frontier.baseline_energy_j + outside_j, max_slowdown)
