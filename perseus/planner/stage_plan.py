"""One pipeline stage's slice of a frontier: all a rank needs after planning, and its wire form.

A rank follows only its own stage's clocks, but it picks points by numbers that are the whole
pipeline's (iteration time, energy, P_blocking × stages for ``paced_lookup``). So a
``StagePlan`` keeps every point's time and energy, and the clocks of this stage's instructions
only, as indices into a small table of the clocks they use (uint8, uint16 past 256 clocks).
At 16 stages that is 1/16 of the clocks, which is what dominates a frontier's size.

One slice per stage is cut out of the whole ``Frontier`` (``encode_stage``): by the planner
process for a frontier it planned (rank 0 receives the bytes ready to send), by rank 0 for a
cached or provided one (at start-up). Rank 0 sends each rank its own stage's bytes; data-parallel
replicas of a stage receive the same bytes, and a rank owns all virtual chunks of its stage. ``decode_stage`` checks the slice against the rank's own
schedule, so a plan is never applied to another instruction order.

``lookup``, ``lookup_slowdown``, ``paced_lookup`` and ``default_point`` choose the same point as
the ``Frontier`` they were cut from, whose non-compute time each slice carries
(tests/runtime/supply/test_stage_plan.py compares them).

With a clock-switch latency to hide, a rank also needs each point's planned timeline of its
stage (when each instruction begins and ends, ``StagePlan.timeline``), because the runtime times
every switch on it (``perseus.timeline.switch_timing``). That needs the whole pipeline's plan and profile,
which only the planner process and rank 0 have, so whoever encodes the slices simulates every
point (``frontier_timing``, ``perseus.timeline.simulator.plan_timelines``) and each stage receives its own
begins and ends with the clocks: 8 more bytes per instruction and point, only when a latency is
hidden.
"""

from __future__ import annotations

import bisect
import pickle
import zlib
from dataclasses import dataclass
from functools import partial
from typing import Any, Callable

import numpy as np

from perseus.errors import FrontierError
from perseus.schedules.dag import InstructionDAG
from perseus.frontier import NO_NON_COMPUTE, Frontier, FrontierPoint, NonCompute, clock_table
from perseus.profile import Profile
from perseus.schedules import Instruction, Schedule
from perseus.planner.unlocked import with_unlocked_clock
from perseus.timeline.simulator import plan_timelines

WIRE_VERSION = 1

StageBytes = Callable[[int], bytes]  # stage -> its encoded plan


@dataclass(frozen=True, eq=False)
class StagePoint:
    """One frontier point as a stage sees it: the pipeline's time and energy, this stage's clocks."""

    time_s: float
    energy_j: float
    row: int  # row of this point's clocks in the plan's index matrix


class StagePlan:
    """The frontier restricted to one stage's clocks; answers the engine's point questions."""

    def __init__(
        self,
        *,
        stage: int,
        num_stages: int,
        instructions: list[Instruction],
        p_blocking_w: float,
        baseline_time_s: float,
        baseline_energy_j: float,
        clocks_mhz: np.ndarray,
        index: np.ndarray,
        points: list[tuple[float, float]],
        paced_points: list[tuple[float, float]],
        gpu_name: str = "unknown",
        solve_time_s: float = 0.0,
        timing: np.ndarray | None = None,
        non_compute: NonCompute = NO_NON_COMPUTE,
    ) -> None:
        if not points:
            raise FrontierError("a stage plan needs at least one point")
        if index.shape != (len(points) + len(paced_points), len(instructions)):
            raise FrontierError(
                f"stage {stage} plan: clock index is {index.shape}, expected "
                f"({len(points) + len(paced_points)}, {len(instructions)})"
            )
        if timing is not None and timing.shape != (index.shape[0], 2, len(instructions)):
            raise FrontierError(f"stage {stage} plan: timing is {timing.shape}, expected "
                                f"({index.shape[0]}, 2, {len(instructions)})")
        self.timing = timing  # (rows, begin/end, instructions) seconds, or None
        self.stage = stage
        self.num_stages = num_stages
        self.instructions = list(instructions)
        self.p_blocking_w = p_blocking_w
        self.baseline_time_s = baseline_time_s
        self.baseline_energy_j = baseline_energy_j
        self.clocks_mhz = clocks_mhz
        self.index = index
        self.gpu_name = gpu_name
        self.solve_time_s = solve_time_s
        self.non_compute = non_compute  # the iteration's time outside the instructions (the frontier's)
        self.points = [StagePoint(t, e, i) for i, (t, e) in enumerate(points)]
        self.paced_points = [StagePoint(t, e, len(points) + i) for i, (t, e) in enumerate(paced_points)]
        self.points.sort(key=lambda p: p.time_s)
        self.paced_points.sort(key=lambda p: p.time_s)
        self._times = [p.time_s for p in self.points]
        self._paced = _paced_order(self.points + self.paced_points, p_blocking_w * num_stages)
        self._paced_times = [p.time_s for p in self._paced]

    # The same questions as ``Frontier`` asks, with the same answers.

    @property
    def fastest(self) -> StagePoint:
        return self.points[0]

    def lookup(self, max_time_s: float) -> StagePoint:
        """Least-energy point whose time does not exceed ``max_time_s`` (fastest if none does)."""
        i = bisect.bisect_right(self._times, max_time_s * (1 + 1e-12))
        return self.points[max(i - 1, 0)]

    def paced_lookup(self, iteration_time_s: float) -> StagePoint:
        """Least-energy plan when the iteration lasts ``iteration_time_s`` whatever the plan."""
        i = bisect.bisect_right(self._paced_times, iteration_time_s * (1 + 1e-12))
        return self._paced[max(i - 1, 0)]

    def default_point(self) -> StagePoint:
        """Least energy with no slowdown against the all-max-frequency baseline."""
        return self.lookup(self.baseline_time_s)

    def lookup_slowdown(self, max_slowdown: float) -> StagePoint:
        """Least-energy point whose job slowdown, non-compute time included, is at most ``max_slowdown``."""
        return self.lookup(self.non_compute.time_budget_s(self.baseline_time_s, max_slowdown))

    def non_compute_energy_j(self) -> float:
        """The whole pipeline's non-compute energy per iteration (``Frontier.non_compute``)."""
        return self.non_compute.energy_j(self.p_blocking_w, self.num_stages)

    def clocks(self, point: StagePoint) -> np.ndarray:
        """This stage's planned clocks (MHz) of ``point``, in execution order."""
        return self.clocks_mhz[self.index[point.row]]

    def timeline(self, point: StagePoint) -> tuple[np.ndarray, np.ndarray] | None:
        """When this stage's instructions begin and end in ``point``'s planned iteration (s from its
        start), or None when rank 0 sent no timing (no switch latency to hide, or no profile)."""
        if self.timing is None:
            return None
        row = self.timing[point.row].astype(np.float64)
        return row[0], row[1]

    def stage_plan(self, point: StagePoint, stage: int) -> list[tuple[Instruction, int]]:
        """(instruction, frequency) pairs of this stage in execution order (``Frontier.stage_plan``)."""
        if stage != self.stage:
            raise FrontierError(f"this rank holds the plan of stage {self.stage}, not of stage {stage}")
        return list(zip(self.instructions, self.clocks(point).tolist()))

    def describe(self) -> dict[str, int]:
        """Its size, for the run's ``plan_received`` event."""
        return {"stage": self.stage, "instructions": len(self.instructions), "points": len(self.points),
                "paced_points": len(self.paced_points)}

    def nbytes(self) -> int:
        """Bytes of the arrays this plan holds (its clocks dominate)."""
        timing = self.timing.nbytes if self.timing is not None else 0
        return int(self.index.nbytes + self.clocks_mhz.nbytes) + 2 * 8 * (len(self.points) + len(self.paced_points)) + timing


def _paced_order(points: list[StagePoint], idle_w: float) -> list[StagePoint]:
    """Candidates of ``paced_lookup``: the rule of ``perseus.frontier``'s paced order, on stage points."""
    kept: list[StagePoint] = []
    for point in sorted(points, key=lambda p: (p.time_s, p.energy_j)):
        if not kept or point.energy_j - idle_w * point.time_s < (kept[-1].energy_j - idle_w * kept[-1].time_s):
            kept.append(point)
    return kept


# ---------------------------------------------------------------- wire form


def stage_slice(frontier: Frontier, stage: int) -> slice:
    """Node ids of ``stage`` in the frontier's stage-major clock arrays."""
    stages = frontier.schedule.stages
    start = sum(len(s) for s in stages[:stage])
    return slice(start, start + len(stages[stage]))


def frontier_timing(frontier: Frontier, profile: Profile) -> np.ndarray:
    """Every point's (then every paced point's) planned begin and end of every instruction,
    ``(rows, 2, instructions)`` float32 seconds, simulated on ``profile`` (unlocked instructions at
    its unlocked points)."""
    dag = InstructionDAG.from_schedule(frontier.schedule)
    plans = np.stack([np.asarray(p.freqs_mhz) for p in frontier.points + frontier.paced_points])
    begin, end = plan_timelines(dag, with_unlocked_clock(profile), plans)
    return np.stack([begin, end], axis=1).astype(np.float32)


def encode_stage(frontier: Frontier, stage: int, timing: np.ndarray | None = None) -> bytes:
    """The bytes rank 0 sends to the ranks of ``stage``: every point's time and energy, and this
    stage's clocks as a zlib-compressed index matrix (points then paced points × instructions);
    with ``timing`` (``frontier_timing``), this stage's planned begins and ends too."""
    sched = frontier.schedule
    if not 0 <= stage < sched.num_stages:
        raise FrontierError(f"stage {stage} is not in this {sched.num_stages}-stage frontier")
    cut = stage_slice(frontier, stage)
    rows = frontier.points + frontier.paced_points
    clocks = np.stack([np.asarray(p.freqs_mhz[cut]) for p in rows]).astype(np.int64)
    table, index = clock_table(clocks)
    dtype = np.uint8 if len(table) <= 1 << 8 else np.uint16
    doc: dict[str, Any] = {
        "v": WIRE_VERSION,
        "schedule": (sched.name, sched.num_stages, sched.num_microbatches, sched.num_chunks),
        "stage": stage,
        "instructions": cut.stop - cut.start,
        "p_blocking_w": frontier.p_blocking_w,
        "baseline": (frontier.baseline_time_s, frontier.baseline_energy_j),
        "gpu_name": frontier.gpu_name,
        "solve_time_s": frontier.solve_time_s,
        "non_compute": frontier.non_compute.as_json() if frontier.non_compute else None,
        "times": np.array([p.time_s for p in rows]).tobytes(),
        "energies": np.array([p.energy_j for p in rows]).tobytes(),
        "num_points": len(frontier.points),
        "clocks_mhz": table.astype(np.int32).tobytes(),
        "dtype": np.dtype(dtype).str,
        "index": zlib.compress(index.astype(dtype).tobytes(), 6),
        "timing": (zlib.compress(np.ascontiguousarray(timing[:, :, cut], dtype=np.float32).tobytes(), 6)
                   if timing is not None else None),
    }
    return pickle.dumps(doc, protocol=pickle.HIGHEST_PROTOCOL)


def decode_stage(data: bytes, schedule: Schedule, stage: int) -> StagePlan:
    """The ``StagePlan`` in ``data``, checked against this rank's schedule and stage."""
    try:
        doc = pickle.loads(data)
        if doc.get("v") != WIRE_VERSION:
            raise FrontierError(f"stage plan of wire version {doc.get('v')!r}, expected {WIRE_VERSION}")
        mine = (schedule.name, schedule.num_stages, schedule.num_microbatches, schedule.num_chunks)
        if tuple(doc["schedule"]) != mine or doc["stage"] != stage:
            raise FrontierError(
                f"received the plan of stage {doc['stage']} of {tuple(doc['schedule'])}, but this rank runs "
                f"stage {stage} of {mine}"
            )
        instructions = list(schedule.stages[stage])
        times = np.frombuffer(doc["times"], dtype=np.float64)
        energies = np.frombuffer(doc["energies"], dtype=np.float64)
        n_points = int(doc["num_points"])
        index = np.frombuffer(zlib.decompress(doc["index"]), dtype=np.dtype(doc["dtype"]))
        index = index.reshape(len(times), len(instructions))
        pairs = list(zip(times.tolist(), energies.tolist()))
        timing = None
        if doc.get("timing") is not None:
            timing = np.frombuffer(zlib.decompress(doc["timing"]), dtype=np.float32).reshape(len(times), 2, len(instructions))
        return StagePlan(
            stage=stage,
            num_stages=schedule.num_stages,
            instructions=instructions,
            p_blocking_w=float(doc["p_blocking_w"]),
            baseline_time_s=float(doc["baseline"][0]),
            baseline_energy_j=float(doc["baseline"][1]),
            clocks_mhz=np.frombuffer(doc["clocks_mhz"], dtype=np.int32).astype(np.int64),
            index=index,
            points=pairs[:n_points],
            paced_points=pairs[n_points:],
            gpu_name=str(doc["gpu_name"]),
            solve_time_s=float(doc["solve_time_s"]),
            timing=timing,
            non_compute=NonCompute.from_json(doc.get("non_compute")),
        )
    except FrontierError:
        raise
    except Exception as exc:  # noqa: BLE001 - a corrupt payload is one line, not a traceback
        raise FrontierError(f"stage {stage}: malformed stage plan from rank 0 ({type(exc).__name__}: {exc})") from None


def stage_plan_of(frontier: Frontier, stage: int, profile: Profile | None = None) -> StagePlan:
    """This process's own slice of a frontier it holds (rank 0, or a single process); with the
    profile, with its planned timeline (``frontier_timing``)."""
    timing = frontier_timing(frontier, profile) if profile is not None else None
    return decode_stage(encode_stage(frontier, stage, timing), frontier.schedule, stage)


def point_of(frontier: Frontier, point: StagePoint) -> FrontierPoint:
    """The frontier's point a stage point was cut from (rank 0 / tests)."""
    rows = frontier.points + frontier.paced_points
    return rows[point.row]


@dataclass(frozen=True)
class Delivery:
    """What ``distribute`` gave this rank: its stage plan and the bytes it received for it."""

    plan: StagePlan
    received_bytes: int


def slices_of(frontier: Frontier, profile: Profile | None = None) -> StageBytes:
    """Each stage's bytes, encoded from a frontier rank 0 holds (cached or provided) when asked;
    with ``profile`` (a switch latency is hidden), with each stage's planned timeline."""
    return partial(encode_stage, frontier, timing=frontier_timing(frontier, profile) if profile is not None else None)


def distribute(collective: Any, stage_bytes: StageBytes | None, schedule: Schedule, stage: int) -> Delivery:
    """Collective: rank 0 (which has ``stage_bytes``: the planner process's ``PlannedStages.bytes_of``,
    or ``slices_of`` a frontier) has every rank receive only the bytes of its own stage
    (``Collective.deliver_stage``: each stage's bytes are made once, however many data-parallel
    replicas receive them); every rank returns its own ``StagePlan``."""
    if collective.is_root and stage_bytes is None:
        raise FrontierError("perseus runtime bug: rank 0 distributes a plan it does not have")
    mine = collective.deliver_stage(stage_bytes, stage)
    return Delivery(decode_stage(mine, schedule, stage), 0 if collective.is_root else len(mine))
