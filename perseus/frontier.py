"""The iteration time–energy Pareto frontier and its JSON file.

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
"""

from __future__ import annotations

import bisect
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from perseus.atomic import write_atomic
from perseus.errors import FrontierError
from perseus.schedule import Instruction, Schedule, build_schedule

FRONTIER_FORMAT = "perseus-frontier"
FRONTIER_VERSION = 1


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

    def stage_plan(self, point: FrontierPoint, stage: int) -> list[tuple[Instruction, int]]:
        """(instruction, frequency) pairs of one stage in execution order."""
        start = sum(len(s) for s in self.schedule.stages[:stage])
        insts = self.schedule.stages[stage]
        return list(zip(insts, point.freqs_mhz[start : start + len(insts)].tolist()))

    # ---------------------------------------------------------------- JSON

    def to_json_dict(self, max_points: int | None = None) -> dict[str, Any]:
        sched = self.schedule

        def encode(point: FrontierPoint) -> dict[str, Any]:
            return {
                "time_s": point.time_s,
                "energy_j": point.energy_j,
                "plan": [
                    [
                        {"kind": inst.kind, "microbatch": inst.microbatch, "chunk": inst.chunk, "freq_mhz": f}
                        for inst, f in self.stage_plan(point, s)
                    ]
                    for s in range(sched.num_stages)
                ],
            }

        return {
            "format": FRONTIER_FORMAT,
            "version": FRONTIER_VERSION,
            "order": "fastest_first",
            "schedule": sched.name,
            "stages": sched.num_stages,
            "microbatches": sched.num_microbatches,
            "chunks": sched.num_chunks,
            "p_blocking_w": self.p_blocking_w,
            "gpu_name": self.gpu_name,
            "baseline": {"time_s": self.baseline_time_s, "energy_j": self.baseline_energy_j},
            "solve_time_s": self.solve_time_s,
            "metadata": self.metadata,
            "points": [encode(p) for p in thin_points(self.points, max_points)],
            "paced_points": [encode(p) for p in thin_points(self.paced_points, max_points)],
        }

    def save(self, path: str | Path, max_points: int | None = None) -> None:
        """Write atomically (temp file + rename) so a crash never leaves half a frontier."""
        write_atomic(path, json.dumps(self.to_json_dict(max_points), separators=(",", ":")))


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


def frontier_from_json_dict(data: Any, source: str = "<json>") -> Frontier:
    if not isinstance(data, dict) or data.get("format") != FRONTIER_FORMAT:
        raise FrontierError(f"{source}: not a perseus frontier file (missing \"format\": \"{FRONTIER_FORMAT}\")")
    if data.get("version") != FRONTIER_VERSION:
        raise FrontierError(f"{source}: frontier version {data.get('version')!r} is not supported")
    try:
        schedule = build_schedule(str(data["schedule"]), int(data["stages"]), int(data["microbatches"]), int(data["chunks"]))
        baseline = data["baseline"]
        points = _decode_points(data["points"], "points", schedule, source)
        paced = _decode_points(data.get("paced_points") or [], "paced_points", schedule, source)
        return Frontier(
            schedule=schedule,
            p_blocking_w=float(data["p_blocking_w"]),
            baseline_time_s=float(baseline["time_s"]),
            baseline_energy_j=float(baseline["energy_j"]),
            points=points,
            gpu_name=str(data.get("gpu_name", "unknown")),
            solve_time_s=float(data.get("solve_time_s", 0.0)),
            metadata=dict(data.get("metadata") or {}),
            paced_points=paced,
        )
    except FrontierError:
        raise
    except KeyError as exc:
        raise FrontierError(f"{source}: malformed frontier file (missing field {exc.args[0]!r})") from None
    except Exception as exc:  # malformed structure: report where, not a deep traceback
        raise FrontierError(f"{source}: malformed frontier file ({type(exc).__name__}: {exc})") from None


def _decode_points(items: Any, name: str, schedule: Schedule, source: str) -> list[FrontierPoint]:
    points = []
    for n, item in enumerate(items):
        freqs: list[int] = []
        plan = item["plan"]
        if len(plan) != schedule.num_stages:
            raise FrontierError(f"{source}: {name}[{n}] has {len(plan)} stages, expected {schedule.num_stages}")
        for s, (stage_plan, stage_insts) in enumerate(zip(plan, schedule.stages)):
            got = [Instruction(e["kind"], int(e["microbatch"]), int(e.get("chunk", 0))) for e in stage_plan]
            if got != list(stage_insts):
                raise FrontierError(f"{source}: {name}[{n}] stage {s} does not follow the {schedule.name} order")
            freqs.extend(int(e["freq_mhz"]) for e in stage_plan)
        points.append(FrontierPoint(float(item["time_s"]), float(item["energy_j"]), np.array(freqs, dtype=np.int64)))
    return points


def load_frontier(path: str | Path) -> Frontier:
    path = Path(path)
    try:
        data = json.loads(path.read_text())
    except OSError as exc:
        raise FrontierError(f"{path}: cannot read frontier ({exc.strerror or exc})") from None
    except json.JSONDecodeError as exc:
        raise FrontierError(f"{path}: invalid JSON at line {exc.lineno}: {exc.msg}") from None
    return frontier_from_json_dict(data, str(path))
