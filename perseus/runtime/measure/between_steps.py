"""The GPU's work between steps as a profile bucket of its own, per profiled clock.

Why: after a step's last instruction a real trainer runs the optimizer and the gradient
all-reduce (30-40 ms at high power on an H200). Billed at P_blocking, or spread over the
instructions by the attribution, its energy landed on forward and backward, and nothing told a
planner what that work costs. During the sweep each step's between-step time and energy (what the
step clock measured after the last instruction: ``StepNumbers.non_instruction_s``) is kept per
clock here; a rank's points travel with its measurements (``RankMeasurements.extra``) and rank 0
combines them as it combines instructions (tensor-parallel ranks: the slowest time, summed energy;
data-parallel replicas: the mean) into ``Profile.between_steps``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from statistics import fmean, median
from typing import Any

from perseus.profile import InstructionProfile

EXTRA_KEY = "between_steps"  # where a rank's points go in ``RankMeasurements.extra``
Point = tuple[float, float]  # (typical seconds, joules at that time)


class BetweenSteps:
    """One rank's between-step work over the sweep: the current clock's steps, each clock's point."""

    def __init__(self) -> None:
        self._steps: list[tuple[float, float | None]] = []
        self.points: dict[int, Point] = {}

    def add(self, seconds: float, energy_j: float | None) -> None:
        """One profiled step's work between steps (``energy_j`` None: unmeasured)."""
        self._steps.append((max(seconds, 0.0), energy_j))

    def finish(self, freq_mhz: int) -> Point | None:
        """Close the clock: its median time and the energy at that time (the steps' mean power over
        the measured ones); None where no step had both (no work between steps, or no energy)."""
        steps, self._steps = self._steps, []
        measured = [(t, e) for t, e in steps if e is not None and t > 0 and e > 0]
        if not measured:
            return None
        typical = median(t for t, _ in steps)
        power = sum(e for _, e in measured) / sum(t for t, _ in measured)
        self.points[freq_mhz] = point = (typical, power * typical)
        return point

    def share(self) -> dict[str, list[float]]:
        """The points as JSON data (``RankMeasurements.extra``, the partial profile)."""
        return {str(f): [t, e] for f, (t, e) in sorted(self.points.items())}

    def restore(self, shared: Mapping[str, Sequence[float]] | None) -> None:
        """The points of an interrupted sweep (``share``'s data)."""
        self.points.update({int(f): (float(v[0]), float(v[1])) for f, v in (shared or {}).items()})


def combine(ranks: Sequence[Any]) -> dict[int, InstructionProfile]:
    """Each stage's profile entry from every rank's points (``RankMeasurements`` with ``extra``):
    tensor-parallel ranks of a replica by the slowest time and summed energy, replicas by the mean,
    at the clocks every rank of the stage has; a stage where one rank has none gets no entry."""
    replicas: dict[tuple[int, int], list[dict[int, Point]]] = {}
    for r in ranks:
        shared = (getattr(r, "extra", None) or {}).get(EXTRA_KEY)
        points = {int(f): (float(v[0]), float(v[1])) for f, v in (shared or {}).items()}
        replicas.setdefault((r.stage, r.dp_rank), []).append(points)
    stages: dict[int, list[dict[int, Point]]] = {}
    for (stage, _), members in sorted(replicas.items()):
        clocks = set.intersection(*(set(m) for m in members))
        stages.setdefault(stage, []).append({f: (max(m[f][0] for m in members), sum(m[f][1] for m in members))
                                             for f in clocks})
    out: dict[int, InstructionProfile] = {}
    for stage, per_replica in stages.items():
        common = sorted(set.intersection(*(set(p) for p in per_replica)), reverse=True)
        if common:
            out[stage] = InstructionProfile(tuple(common), tuple(fmean(p[f][0] for p in per_replica) for f in common),
                                            tuple(fmean(p[f][1] for p in per_replica) for f in common))
    return out
