"""Every pipeline's evidence, one job decision: each rank runs the test on its own steps, and at each
window's end the ranks' verdicts are gathered (one all-gather of a few floats, the control plane's
``all_gather_floats``) and every rank computes the same decision from them.

Why every rank: a data-parallel pipeline can be slower than its own default clocks while another
is not (other nodes, other cooling, another profile); a guard that judges rank 0 alone never sees
it. The job is as slow as its slowest pipeline, so it moves faster (or falls back) when any
pipeline's test alarms, by the largest excess the alarming pipelines measured.

What is judged (``StepNumbers.judged_s``, given to ``ClosedLoop.end_step``): the span of the step's
instructions, the part of the step the plan's clocks control, and the GPU's work between steps
after the last one (optimizer, gradient all-reduce), which runs at default clocks in plan steps and
probes alike. Host work before the first instruction (data loading) is reported, not judged.

Whose span decides (``judging_stages``): a pipeline's iteration runs from its first instruction to
its last, and only the stages that hold one of those (a source or a sink of the instruction DAG:
stage 0 alone in 1F1B, interleaved 1F1B and GPipe; the stages ending on weight gradients in the
zero-bubble schedules) see it in their own span. Another stage's span grows whenever the plan
slows its instructions within their slack, which slows nothing: the unpadded DeepSpeed script's
second stage, slowed within slack, measured its own span 10-15 % longer than at default clocks
while the job's steps were not slower, and the guard fell back on it. Such ranks still run the
test and report it; their verdicts do not vote.

Energy (``sequential.EnergyTest``): each rank also reports its window's plan and probe energy
medians; the job is judged on their sum over every rank (``with_energy``): a plan that measurably
saves no energy falls back, whatever the time verdicts say.

Pure: the engine feeds steps and applies decisions; no collective or clock here.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Sequence
from dataclasses import dataclass, field, replace

from perseus.runtime.guard.placement import ProbePlacement, ProbeTimeline, StepRole
from perseus.runtime.guard.sequential import (
    Confidence,
    EnergyVerdict,
    RankEnergy,
    SequentialSettings,
    SequentialTest,
    WindowVerdict,
    next_length,
    rank_energy,
)
from perseus.schedules import Schedule
from perseus.schedules.dag import InstructionDAG

CONFIDENCE_CODE = {c: float(i) for i, c in enumerate(Confidence)}


class Action(enum.Enum):
    """What the job does at a window's end."""

    KEEP = "keep"  # leave the deployed point as it is
    FASTER = "faster"  # look up the point for target time × factor
    FALLBACK = "fallback"  # default clocks for the rest of the run


def target_ratio(target_time_s: float | None, reference_time_s: float) -> float:
    """A target's time in units of the probes' reference point's (default clocks unless a power cap
    forbids them): what the plan is held to. ``None`` is the no-slowdown target, 1.0; a target faster
    than the reference is held to the reference's time (no plan is promised faster than it)."""
    if reference_time_s <= 0:
        raise ValueError(f"reference point's planned time must be positive, got {reference_time_s}")
    if target_time_s is None:
        return 1.0
    return max(1.0, target_time_s / reference_time_s)


def judging_stages(schedule: Schedule) -> frozenset[int]:
    """The stages whose span is the pipeline's iteration span: those holding a source or a sink of
    the instruction DAG (module docstring)."""
    dag = InstructionDAG.from_schedule(schedule)
    has_in = set(dag.edge_dst.tolist())
    has_out = set(dag.edge_src.tolist())
    stages = dag.node_stage.tolist()
    return frozenset(stages[v] for v in range(dag.num_nodes) if v not in has_in or v not in has_out)


def verdict_row(dp: int, verdict: WindowVerdict | None) -> list[float]:
    """One rank's contribution to the all-gather (a rank with no verdict sends NaN)."""
    if verdict is None:
        return [float(dp)] + [math.nan] * 5
    excess = math.nan if verdict.excess is None else verdict.excess
    return [float(dp), verdict.score, verdict.statistic, CONFIDENCE_CODE[verdict.confidence], verdict.ratio, excess]


def verdict_of(row: Sequence[float]) -> tuple[int, WindowVerdict | None]:
    dp = int(row[0])
    if math.isnan(row[1]):
        return dp, None
    confidence = list(Confidence)[int(row[3])]
    return dp, WindowVerdict(row[1], row[2], confidence, row[4], None if math.isnan(row[5]) else row[5], None)


@dataclass(frozen=True)
class JobDecision:
    """What every rank does at a window's end, and the one line that says why."""

    action: Action
    factor: float  # multiplies the target time (< 1 for FASTER)
    next_length: int
    slow_pipelines: tuple[int, ...]
    statistic: dict[int, float]  # per pipeline: the largest CUSUM statistic among its ranks
    reason: str
    energy: EnergyVerdict | None = None  # the job's energy test after the window (None: no evidence yet)

    @property
    def for_energy(self) -> bool:
        """The job falls back because the plan measurably saves no energy (``sequential.EnergyTest``)."""
        return self.action is Action.FALLBACK and self.energy is not None and self.energy.alarm


def agree(rows: Sequence[Sequence[float]], length: int, settings: SequentialSettings, *, at_fastest: bool,
          judges: Sequence[bool] | None = None) -> JobDecision:
    """The job's decision from every rank's ``verdict_row`` (the same on every rank); ``judges``:
    per row, whether that rank's stage judges its pipeline (``judging_stages``; None: every rank)."""
    verdicts = [verdict_of(r) for i, r in enumerate(rows) if judges is None or judges[i]]
    statistic: dict[int, float] = {}
    excess: dict[int, float] = {}
    for dp, v in verdicts:
        if v is None:
            continue
        statistic[dp] = max(statistic.get(dp, 0.0), v.statistic)
        if v.confidence is Confidence.ALARM and v.excess is not None:
            excess[dp] = max(excess.get(dp, 0.0), v.excess)
    nxt = next_length(length, [v for _, v in verdicts if v is not None], settings.backoff)
    stats = ", ".join(f"pipeline {dp}: {s:.2f}" for dp, s in sorted(statistic.items()))
    if not excess:
        return JobDecision(Action.KEEP, 1.0, nxt, (), statistic,
                           f"within (CUSUM {stats}; alarm at {settings.threshold:g})")
    slow = tuple(sorted(excess))
    worst = max(excess.values())
    said = ", ".join(f"pipeline {dp} {100 * e:+.1f}%" for dp, e in sorted(excess.items()))
    if at_fastest:
        return JobDecision(Action.FALLBACK, 1.0, settings.backoff.first, slow, statistic,
                           f"measurably slower than default clocks ({said}; CUSUM {stats} >= {settings.threshold:g}) "
                           f"at the fastest frontier point: falling back to default clocks")
    return JobDecision(Action.FASTER, 1.0 / (1.0 + worst), settings.backoff.first, slow, statistic,
                       f"measurably slower than the target ({said}; CUSUM {stats} >= {settings.threshold:g}): "
                       f"moving to a faster point")


def with_energy(decision: JobDecision, energy: EnergyVerdict | None, length: int,
                settings: SequentialSettings) -> JobDecision:
    """The time decision with the job's energy verdict (``length``: the window's): a plan that
    measurably saves no energy falls back (whatever the time test says: faster points save less
    still); the windows grow only while the saving is confidently above the margin too, and a
    suspicion sends them back to the shortest, so a plan that saves nothing is settled quickly.
    No verdict (no rank measured energy yet): time alone."""
    if energy is None:
        return decision
    if energy.alarm:
        return replace(decision, action=Action.FALLBACK, factor=1.0, next_length=settings.backoff.first,
                       reason=energy.reason(), energy=energy)
    if energy.confidence is Confidence.SUSPECT:
        nxt = settings.backoff.first
    elif energy.confidence is Confidence.UNSURE:
        nxt = min(decision.next_length, length)
    else:
        nxt = decision.next_length
    return replace(decision, next_length=nxt, energy=energy)


@dataclass(frozen=True)
class WindowEnd:
    """A window closed on this rank: its length and verdict (None: no counted plan/probe pair), and
    its energy medians (None: no measured plan/probe pair)."""

    length: int
    verdict: WindowVerdict | None
    energy: RankEnergy | None = None


@dataclass
class ProbeCost:
    """What the probes cost this rank: default-clock steps, and their energy over the plan's."""

    deployed_steps: int = 0
    default_steps: int = 0
    extra_energy_j: float = 0.0  # Σ over probe steps of (probe energy − the window's median plan energy)

    @property
    def share(self) -> float:
        return self.default_steps / self.deployed_steps if self.deployed_steps else 0.0


@dataclass
class RankGuard:
    """One rank's probes, windows and test (the closed loop's per-rank part)."""

    placement: ProbePlacement
    settings: SequentialSettings = field(default_factory=SequentialSettings)

    def __post_init__(self) -> None:
        self.timeline = ProbeTimeline(self.placement, self.settings.backoff.first)
        self.test = SequentialTest(self.settings)
        self.cost = ProbeCost()
        self.step = 0
        self.role = StepRole.PLAN_SETTLE
        self._plan: list[tuple[float, float | None]] = []  # (judged time, energy; None: unmeasured)
        self._probe: list[tuple[float, float | None]] = []
        self._default_energy: list[float] = []

    def begin_step(self) -> StepRole:
        self.role = self.timeline.role(self.step)
        return self.role

    def end_step(self, judged_s: float, energy_j: float | None, target_ratio: float = 1.0) -> WindowEnd | None:
        """Count the step; at a window's last step this rank's ``WindowEnd`` (every rank closes
        windows at the same steps, so the all-gather it calls for happens on every rank), else None.
        An unmeasured step (``energy_j`` None) is judged on its time; the probes' cost leaves it out."""
        role, step = self.role, self.step
        self.step += 1
        self.cost.deployed_steps += 1
        if role.default_clocks:
            self.cost.default_steps += 1
            if energy_j is not None:
                self._default_energy.append(energy_j)
        if role.counted:
            (self._probe if role.default_clocks else self._plan).append((judged_s, energy_j))
        if step < self.placement.settle or not self.timeline.closes_window(step):
            return None
        verdict = None
        energy = rank_energy([e for _, e in self._plan], [e for _, e in self._probe])
        if self._plan and self._probe:
            verdict = self.test.observe([t for t, _ in self._plan], [t for t, _ in self._probe], target_ratio)
            measured = sorted(e for _, e in self._plan if e is not None)
            if measured:
                plan_e = measured[len(measured) // 2]
                self.cost.extra_energy_j += sum(e - plan_e for e in self._default_energy)
        self._plan, self._probe, self._default_energy = [], [], []
        return WindowEnd(self.timeline.window.length, verdict, energy)

    def apply(self, decision: JobDecision) -> None:
        """Open the next window as the job agreed; after a move the evidence starts afresh."""
        moved = decision.action is not Action.KEEP
        if moved:
            self.test.restart()
        self.timeline.next(decision.next_length, after_move=moved)

    def summary(self) -> dict[str, object]:
        return {"statistic": self.test.statistic, "threshold": self.settings.threshold, "windows": self.test.windows,
                "alarms": self.test.alarms, "probe_share": self.cost.share,
                "probe_extra_energy_j": self.cost.extra_energy_j}
