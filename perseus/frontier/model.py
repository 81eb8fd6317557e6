"""The iteration time–energy Pareto frontier: the planner's output, the runtime's input.

A ``Frontier`` is the planner's output and the runtime's input: points ordered fastest first,
each an iteration time, its energy (both simulated on measured profile values) and the
per-instruction frequency plan.

Two questions, two answers:

- ``lookup(T)``: least energy of an iteration that runs at its own pace and ends by T (the
  no-slowdown default). Only ``points`` matter: each has less energy than every faster plan.
- ``paced_lookup(T)``: least energy of an iteration that lasts T whatever the plan, because the
  pipeline then waits (for a straggling data-parallel replica). A plan of time t ≤ T then costs
  its energy plus P_blocking × stages × (T − t), so a slower plan can win even though it has
  more energy at its own pace. Those plans are kept in ``paced_points``.

Times and energies are the instructions' (critical path, P_blocking while waiting). The job's
iteration adds ``non_compute`` (``perseus.frontier.non_compute``): ``slowdown``, ``saving`` and
``lookup_slowdown`` count it, so a slowdown target is the one the job will see.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from perseus.errors import FrontierError
from perseus.frontier.non_compute import NO_NON_COMPUTE, NonCompute
from perseus.schedules import Instruction, Schedule


@dataclass(frozen=True)
class FrontierPoint:
    """One Pareto-optimal plan: per-node frequencies in the DAG's stage-major node order."""

    time_s: float
    energy_j: float
    freqs_mhz: np.ndarray


@dataclass
class Frontier:
    """Pareto frontier of a pipeline iteration, fastest point first."""

    schedule: Schedule
    p_blocking_w: float
    baseline_time_s: float
    baseline_energy_j: float
    points: list[FrontierPoint]
    gpu_name: str = "unknown"
    solve_time_s: float = 0.0
    metadata: dict[str, Any] = field(default_factory=dict)
    # Plans not in `points` (a faster plan has less energy at its own pace) that have less energy
    # than every faster plan when the iteration is stretched to their time: see paced_lookup.
    paced_points: list[FrontierPoint] = field(default_factory=list)
    # Each iteration's time outside the instructions (data, exchanges, the optimizer): not in the
    # points' numbers, counted in the job's slowdown and saving (perseus.frontier.non_compute).
    non_compute: NonCompute = NO_NON_COMPUTE

    def __post_init__(self) -> None:
        if not self.points:
            raise FrontierError("a frontier needs at least one point")
        self.points.sort(key=lambda p: p.time_s)
        self._times = [p.time_s for p in self.points]
        self.paced_points.sort(key=lambda p: p.time_s)
        self._paced = _paced_order(self.points + self.paced_points, self.p_blocking_w * self.schedule.num_stages)
        self._paced_times = [p.time_s for p in self._paced]

    @property
    def fastest(self) -> FrontierPoint:
        return self.points[0]

    @property
    def slowest(self) -> FrontierPoint:
        return self.points[-1]

    def lookup(self, max_time_s: float) -> FrontierPoint:
        """Least-energy point whose time does not exceed ``max_time_s`` (fastest if none does)."""
        i = bisect.bisect_right(self._times, max_time_s * (1 + 1e-12))
        return self.points[max(i - 1, 0)]

    def paced_lookup(self, iteration_time_s: float) -> FrontierPoint:
        """Least-energy plan when the iteration lasts ``iteration_time_s`` regardless of the plan
        (the pipeline waits for a slower one): among plans no slower than that, the one with the
        least energy plus blocking power over its wait (fastest point if none fits)."""
        i = bisect.bisect_right(self._paced_times, iteration_time_s * (1 + 1e-12))
        return self._paced[max(i - 1, 0)]

    def paced_energy_j(self, point: FrontierPoint, iteration_time_s: float) -> float:
        """Energy of ``point`` when the iteration is stretched to ``iteration_time_s`` (≥ its time)."""
        wait = max(iteration_time_s - point.time_s, 0.0)
        return point.energy_j + self.p_blocking_w * self.schedule.num_stages * wait

    def default_point(self) -> FrontierPoint:
        """Least energy with no slowdown against the all-max-frequency baseline."""
        return self.lookup(self.baseline_time_s)

    def lookup_slowdown(self, max_slowdown: float) -> FrontierPoint:
        """Least-energy point whose job slowdown, non-compute time included, is at most
        ``max_slowdown`` (0.05: +5 %) against the all-max baseline."""
        return self.lookup(self.non_compute.time_budget_s(self.baseline_time_s, max_slowdown))

    def slowdown(self, point: FrontierPoint) -> float:
        """The job's slowdown of ``point`` against the all-max baseline, non-compute time included."""
        return self.non_compute.slowdown(point.time_s, self.baseline_time_s)

    def saving(self, point: FrontierPoint) -> float:
        """The job's energy saving of ``point`` against the all-max baseline, non-compute energy included."""
        return self.non_compute.saving(point.energy_j, self.baseline_energy_j, self.p_blocking_w,
                                       self.schedule.num_stages)

    def stage_plan(self, point: FrontierPoint, stage: int) -> list[tuple[Instruction, int]]:
        """(instruction, frequency) pairs of one stage in execution order."""
        start = sum(len(s) for s in self.schedule.stages[:stage])
        insts = self.schedule.stages[stage]
        return list(zip(insts, point.freqs_mhz[start : start + len(insts)].tolist()))


def thin_points(points: list[FrontierPoint], max_points: int | None) -> list[FrontierPoint]:
    """At most ``max_points`` points spread evenly in time, always keeping both ends."""
    if max_points is None or len(points) <= max_points:
        return list(points)
    if max_points < 2:
        raise FrontierError("max_points must be at least 2")
    times = np.array([p.time_s for p in points])
    targets = np.linspace(times[0], times[-1], max_points)
    keep = sorted({int(np.searchsorted(times, t, side="right") - 1) for t in targets} | {0, len(points) - 1})
    return [points[i] for i in keep]


def _paced_order(points: list[FrontierPoint], idle_w: float) -> list[FrontierPoint]:
    """Plans by time whose energy minus ``idle_w`` × time (what a wait to a common iteration time
    does not change) is below every faster plan's: the candidates of ``paced_lookup``."""
    kept: list[FrontierPoint] = []
    for point in sorted(points, key=lambda p: (p.time_s, p.energy_j)):
        if not kept or point.energy_j - idle_w * point.time_s < (kept[-1].energy_j - idle_w * kept[-1].time_s):
            kept.append(point)
    return kept
