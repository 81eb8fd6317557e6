"""The model checked against the runs, leave-one-schedule-out, and whether it describes a workload.

Each schedule is predicted by a model fitted without it (``fit_model(exclude=...)``) and compared
with what it measured: iteration time (the slowest rank's) and energy (summed over ranks), medians
over the iterations after the first. Errors are signed fractions, predicted / measured − 1.

A workload is *describable* when all of these hold, each with its reason:

- the all-max runs and the default run (the fastest planned run: the plan Perseus deploys by
  default is the least-energy one no slower than all-max) are predicted within ``RUN_BOUND`` in
  time and in energy. 2 %: a single run carries its own noise on top of the model's error (two
  runs of the identical all-max schedule differ by up to 0.5 % in time and 0.3 % in energy in the
  artifact), so it is held to the 1 % the median over all runs is held to plus twice that noise;
- computation fills at least ``MIN_COMPUTE_FILL`` of every run: the critical path of the run's own
  measured instruction times over its measured iteration time. The model adds the rest as one
  constant; at 90 % that constant is at most a tenth of the iteration, so it can vary by a tenth of
  itself before the prediction is off by the 1 % the medians are held to;
- that rest really is constant: the non-compute time of the planned runs (measured iteration minus
  that critical path, no model involved) stays, in the median run, within ``MAX_OVERHEAD_DRIFT`` of
  the iteration from the all-max runs'. 0.5 %, half the 1 % the model's median errors are held to:
  where the non-compute time itself drifts more, a constant cannot describe the iteration.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from perseus.measured.model import MeasuredModel, Prediction, fit_model, workload_dag
from perseus.measured.runs import ScheduleRun, Workload
from perseus.schedules.dag import InstructionDAG
from perseus.timeline.simulator import longest_path_finish

RUN_BOUND = 0.02
MIN_COMPUTE_FILL = 0.90
MAX_OVERHEAD_DRIFT = 0.005


@dataclass(frozen=True)
class ScheduleCheck:
    """One schedule, measured and predicted by a model that never saw it."""

    index: int  # the schedule's number N (N.sched.json)
    all_max: bool
    measured_time_s: float
    measured_energy_j: float
    predicted: Prediction
    critical_path_s: float  # of the run's own measured instruction times
    non_compute_s: float  # measured iteration − that critical path

    @property
    def time_error(self) -> float:
        return self.predicted.time_s / self.measured_time_s - 1

    @property
    def energy_error(self) -> float:
        return self.predicted.energy_j / self.measured_energy_j - 1

    @property
    def compute_fill(self) -> float:
        return self.critical_path_s / self.measured_time_s


@dataclass(frozen=True)
class WorkloadCheck:
    """Every schedule of one workload checked, and the verdict."""

    workload: str
    schedules: tuple[ScheduleCheck, ...]
    default: int  # position in ``schedules`` of the default (fastest planned) run
    describable: bool
    reasons: tuple[str, ...]  # why (not), one line each
    model: MeasuredModel  # fitted on every run

    def _abs(self, attr: str) -> np.ndarray:
        return np.abs([getattr(c, attr) for c in self.schedules])

    @property
    def time_error_median(self) -> float:
        return float(np.median(self._abs("time_error")))

    @property
    def time_error_max(self) -> float:
        return float(self._abs("time_error").max())

    @property
    def energy_error_median(self) -> float:
        return float(np.median(self._abs("energy_error")))

    @property
    def energy_error_max(self) -> float:
        return float(self._abs("energy_error").max())


def own_critical_path_s(dag: InstructionDAG, run: ScheduleRun) -> float:
    """Critical path of a run's own per-instance median times: what its computation alone takes."""
    durations = np.array([run.ranks[stage].instance_medians(inst.kind)[inst.microbatch]
                          for stage, inst in zip(dag.node_stage.tolist(), dag.instructions)])
    return float(longest_path_finish(dag, durations).max())


def leave_one_out(workload: Workload) -> WorkloadCheck:
    """Predict every schedule from the others and judge whether the model describes the workload."""
    dag = workload_dag(workload)
    all_max = set(workload.all_max)
    checks = []
    for i, run in enumerate(workload.runs):
        if i in all_max and len(all_max) < 2:
            continue  # the only all-max run: nothing left to take the non-compute time from
        predicted = fit_model(workload, {i}, dag).predict(run)
        path = own_critical_path_s(dag, run)
        checks.append(ScheduleCheck(run.index, i in all_max, run.time_s, run.energy_j, predicted, path,
                                    run.time_s - path))
    schedules = tuple(checks)
    planned = [j for j, c in enumerate(schedules) if not c.all_max]
    default = min(planned, key=lambda j: schedules[j].measured_time_s) if planned else 0
    describable, reasons = _verdict(schedules, default)
    return WorkloadCheck(workload.name, schedules, default, describable, reasons, fit_model(workload, (), dag))


def _verdict(schedules: tuple[ScheduleCheck, ...], default: int) -> tuple[bool, tuple[str, ...]]:
    reasons: list[str] = []
    ok = True
    anchors = [c for c in schedules if c.all_max] + [schedules[default]]
    worst = max(max(abs(c.time_error), abs(c.energy_error)) for c in anchors)
    if worst > RUN_BOUND:
        ok = False
        reasons.append(f"all-max and default runs: time or energy off by {worst:.2%}, more than {RUN_BOUND:.0%}")
    else:
        reasons.append(f"all-max and default runs: time and energy within {worst:.2%} (bound {RUN_BOUND:.0%})")
    fill = min(c.compute_fill for c in schedules)
    if fill < MIN_COMPUTE_FILL:
        ok = False
        reasons.append(f"computation fills only {fill:.1%} of some run's iteration, less than {MIN_COMPUTE_FILL:.0%}")
    else:
        reasons.append(f"computation fills at least {fill:.1%} of every run's iteration (bound {MIN_COMPUTE_FILL:.0%})")
    base = [c.non_compute_s for c in schedules if c.all_max]
    planned = [c for c in schedules if not c.all_max]
    if base and planned:
        reference = float(np.mean(base))
        drift = float(np.median([abs(c.non_compute_s - reference) / c.measured_time_s for c in planned]))
        if drift > MAX_OVERHEAD_DRIFT:
            ok = False
            reasons.append(f"non-compute time drifts {drift:.2%} of the iteration from the all-max runs' "
                           f"in the median run, more than {MAX_OVERHEAD_DRIFT:.1%}: not a constant")
        else:
            reasons.append(f"non-compute time drifts {drift:.2%} of the iteration in the median run "
                           f"(bound {MAX_OVERHEAD_DRIFT:.1%})")
    else:
        ok = False
        reasons.append("needs all-max and planned runs to judge the non-compute time")
    return ok, tuple(reasons)
