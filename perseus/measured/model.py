"""The model of one workload, built from its measured runs, as the project's timeline sees it.

An iteration's time is the critical path of the 1F1B instruction DAG over the measured
per-(stage, kind, clock) times (``table``), plus one constant: the non-compute time per iteration
(loading, point-to-point exchanges, the optimizer step; none of it is in the DAG), taken from the
all-max runs as their measured time minus their critical path. Its energy is, per stage, each
instruction's time × the stage's power at its clock (``power``) plus P_blocking × the time the
stage is not computing, the non-compute time included. ``profile`` is that model as a ``Profile``,
so the simulator and the planner run on it unchanged.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterable

import numpy as np

from perseus.errors import ProfileError
from perseus.frontier import NonCompute
from perseus.measured.power import PowerFit, fit_power
from perseus.measured.runs import ScheduleRun, Workload
from perseus.measured.table import KINDS, TimeTable, build_time_table
from perseus.profile import InstructionProfile, Profile
from perseus.profile.model import ProfileKey
from perseus.schedules import build_schedule
from perseus.schedules.dag import InstructionDAG
from perseus.timeline.simulator import simulate_plan


@dataclass(frozen=True)
class Prediction:
    """What the model says one schedule measures."""

    time_s: float  # critical path + the non-compute time
    energy_j: float  # summed over stages, waiting and non-compute time at P_blocking
    critical_path_s: float
    interpolated: int  # instructions whose clock the model had not measured for their (stage, kind)


@dataclass(frozen=True, eq=False)
class MeasuredModel:
    """Time table, power curves, P_blocking and non-compute time of one workload."""

    workload: str
    dag: InstructionDAG = field(repr=False)
    table: TimeTable = field(repr=False)
    power: PowerFit
    overhead_s: float  # non-compute time per iteration, from the all-max runs
    fitted_on: tuple[int, ...]  # positions in the workload's runs

    @property
    def stages(self) -> int:
        return self.dag.schedule.num_stages

    @property
    def p_blocking_w(self) -> float:
        return self.power.p_blocking_w

    @property
    def non_compute(self) -> NonCompute:
        """The non-compute time as a frontier carries it (at P_blocking, as ``predict`` charges it)."""
        return NonCompute(max(self.overhead_s, 0.0), None, "the all-max runs less their critical path")

    def profile(self, extra: dict[tuple[int, str], set[int]] | None = None) -> Profile:
        """The model as a profile: every measured clock, plus the ``extra`` clocks per (stage, kind)
        (interpolated times). Energy per instruction = time × the stage's power at the clock."""
        entries: dict[ProfileKey, InstructionProfile] = {}
        for stage in range(self.stages):
            for kind in KINDS:
                clocks = sorted(set(self.table.clocks(stage, kind)) | (extra or {}).get((stage, kind), set()))
                times = np.array([self.table.time_s(stage, kind, c) for c in clocks])
                energies = times * self.power.power_w(stage, np.array(clocks, dtype=float))
                entries[(stage, 0, kind)] = InstructionProfile(tuple(clocks), tuple(times), tuple(energies))
        return Profile(entries, self.p_blocking_w, "measured", source=f"measured runs of {self.workload}")

    def node_clocks(self, run: ScheduleRun) -> np.ndarray:
        """A run's clock for every node of the DAG (stage-major, execution order)."""
        return np.array([run.ranks[stage].clocks(inst.kind)[inst.microbatch]
                         for stage, inst in zip(self.dag.node_stage.tolist(), self.dag.instructions)], dtype=np.int64)

    def critical_path_s(self, clocks: np.ndarray) -> float:
        """Critical path of a per-node clock plan on the model's times."""
        return self.simulate(clocks)[0]

    def simulate(self, clocks: np.ndarray) -> tuple[float, float, int]:
        """(critical path, energy without the non-compute time, unmeasured clocks) of a per-node plan."""
        extra: dict[tuple[int, str], set[int]] = {}
        unmeasured = 0
        for stage, inst, clock in zip(self.dag.node_stage.tolist(), self.dag.instructions, clocks.tolist()):
            if not self.table.measured(stage, inst.kind, clock):
                extra.setdefault((stage, inst.kind), set()).add(int(clock))
                unmeasured += 1
        timeline = simulate_plan(self.dag, self.profile(extra), clocks)
        return timeline.time_s, timeline.energy_j, unmeasured

    def predict(self, run: ScheduleRun) -> Prediction:
        """The run's iteration time and energy (all ranks) as the model predicts them."""
        path, energy, unmeasured = self.simulate(self.node_clocks(run))
        return Prediction(
            time_s=path + self.overhead_s,
            energy_j=energy + self.p_blocking_w * self.stages * self.overhead_s,
            critical_path_s=path,
            interpolated=unmeasured,
        )


def workload_dag(workload: Workload) -> InstructionDAG:
    """The 1F1B DAG of the workload's shape (Merak runs 1F1B: ``perseus.measured.commands``)."""
    return InstructionDAG.from_schedule(build_schedule("1f1b", workload.stages, workload.microbatches))


def fit_model(workload: Workload, exclude: Iterable[int] = (), dag: InstructionDAG | None = None) -> MeasuredModel:
    """The model from every run of ``workload`` except the positions in ``exclude``."""
    skip = set(exclude)
    kept = tuple(i for i in range(len(workload.runs)) if i not in skip)
    all_max = [i for i in workload.all_max if i not in skip]
    if not all_max:
        raise ProfileError(f"{workload.path}: no all-max run left to take the non-compute time from")
    dag = dag if dag is not None else workload_dag(workload)
    table = build_time_table(workload, skip)
    power = fit_power(workload, table, skip)
    model = MeasuredModel(workload.name, dag, table, power, 0.0, kept)
    path = model.critical_path_s(np.full(dag.num_nodes, workload.max_clock_mhz, dtype=np.int64))
    overhead = float(np.mean([workload.runs[i].time_s for i in all_max])) - path
    return MeasuredModel(workload.name, dag, table, power, overhead, kept)
