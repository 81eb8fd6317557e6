"""The deployed plan checked while training: probe blocks, the same-run A/B and the no-slowdown
guard, for one rank, with every pipeline's evidence agreed at each window's end.

Why a room of its own: the engine only asks three things of it per deployed step: whether the step
runs at the probe's clocks (``begin_step``), at which point (``reference_point``: default clocks,
or under a power cap the cap's own point, never above it), and at its end whether the job decided
anything (``end_step``). Where probes go is ``placement.py`` (seeded, so every rank computes the
same steps without a message); the test is ``sequential.py``; one rank's windows are
``job_guard.RankGuard``. At a window's end (the same step on every rank: window lengths are part of
the agreed decision) every rank's verdict row is all-gathered (``Collective.all_gather_floats``)
and every rank computes the same ``JobDecision`` from all of them: a pipeline measurably slower
than its target moves the job to a faster point, or back to default clocks at the fastest point;
a plan whose job-wide energy per step is not measurably lower than the probes' falls back
(``sequential.EnergyTest``: the row carries each rank's energy medians, and every rank runs the
same test on their sum).

What is judged is the step's instruction span and its GPU work between steps (the optimizer, the
gradient all-reduce: ``StepNumbers.judged_s``, on the GPU's clock where the GPU runs behind the
host, else the host's), not the whole step call. That work runs at default clocks in plan steps and
probes alike (``Deployment.step_ending``), so both sides carry it; a clock that slowed it would
show. The A/B figure (``figure``) compares the instructions' spans, which is what the frontier
predicts (``observe/prediction.py`` lifts it to the iteration).
"""

from __future__ import annotations

import logging
import math
from collections import deque
from dataclasses import dataclass, field
from statistics import median
from time import monotonic

from perseus.planner.stage_plan import StagePlan, StagePoint
from perseus.runtime.clocks.targeting import (
    CarbonTarget,
    GridPaced,
    PacedTarget,
    PowerCapTarget,
    SpeedUp,
    Targeting,
    TimeTarget,
)
from perseus.runtime.config import PerseusConfig
from perseus.runtime.guard.ab import ABFigure, ab_figure, step_figure
from perseus.runtime.guard.clock_reasons import ClockReasonSource, ProbeReasons
from perseus.runtime.guard.job_guard import (
    Action,
    JobDecision,
    RankGuard,
    agree,
    judging_stages,
    target_ratio,
    verdict_row,
    with_energy,
)
from perseus.runtime.guard.placement import (
    Backoff,
    ProbePlacement,
    StepRole,
    clocks_label,
    probe_seed,
)
from perseus.runtime.guard.periodicity import Period, PeriodWatch
from perseus.runtime.guard.sequential import (
    EnergySettings,
    EnergyTest,
    EnergyVerdict,
    RankEnergy,
    SequentialSettings,
    job_window,
    no_energy_row,
)
from perseus.runtime.job import PipelineJob
from perseus.runtime.plane.collective import Collective
from perseus.schedules import Schedule

log = logging.getLogger("perseus.runtime")

# Counted samples kept for the A/B: the most recent, so a long run's figure follows the point it runs.
AB_WINDOW = 400
DECISIONS_KEPT = 50  # acting decisions the summary lists (every window's is in the metrics file)
# The gathered row: the time verdict (``verdict_row``, 6), at the fastest point, probe share, probe
# extra J, judges; then the energy medians (``RankEnergy.row``), whether this rank retargeted, and
# its pipeline stage (every stage's energy and the job's saving: observe/job_saving.py).
ENERGY_AT = 10
RETARGETED_AT = ENERGY_AT + 5
STAGE_AT = RETARGETED_AT + 1


@dataclass
class Samples:
    """(time, energy) of counted steps of one kind, newest last, at most ``AB_WINDOW``; an
    unmeasured step's energy (None) is left out, its time kept."""

    time_s: deque[float] = field(default_factory=lambda: deque(maxlen=AB_WINDOW))
    energy_j: deque[float] = field(default_factory=lambda: deque(maxlen=AB_WINDOW))
    changes: int = 0  # bumped by every add and clear: what a figure computed from them depends on

    def add(self, time_s: float, energy_j: float | None) -> None:
        self.time_s.append(time_s)
        if energy_j is not None:
            self.energy_j.append(energy_j)
        self.changes += 1

    def clear(self) -> None:
        self.time_s.clear()
        self.energy_j.clear()
        self.changes += 1


@dataclass
class PipelineGuard:
    """One data-parallel pipeline's guard as the last window's all-gather told every rank."""

    statistic: float = 0.0  # the largest CUSUM statistic among its ranks
    probe_share: float = 0.0  # deployed steps at the probe's clocks
    probe_extra_energy_j: float = 0.0  # the probes' energy over the plan's, summed over its ranks
    windows: int = 0
    alarms: int = 0  # windows whose decision it alarmed in

    def as_dict(self) -> dict[str, float | int]:
        return {"statistic": self.statistic, "probe_share": self.probe_share,
                "probe_extra_energy_j": self.probe_extra_energy_j, "windows": self.windows, "alarms": self.alarms}


def settings_from(config: PerseusConfig) -> SequentialSettings:
    """The test's constants from the config: ``probe_every_steps`` is the first (shortest) window,
    ``probe_longest_steps`` the longest once confident."""
    first = config.probe_every_steps or Backoff.first  # 0 (probes off): the settings are unused
    return SequentialSettings(tolerance=config.guard_tolerance, threshold=config.guard_threshold,
                              backoff=Backoff(first=first, longest=max(first, config.probe_longest_steps)))


def energy_settings_from(config: PerseusConfig) -> EnergySettings:
    """The energy test alarms at the guard's threshold, as the time test does."""
    return EnergySettings(threshold=config.guard_threshold)


def job_seed_text(job: PipelineJob) -> str:
    """What every rank of the job knows alike, for the probes' seed."""
    return f"{job.schedule}:{job.num_stages}:{job.num_microbatches}:{job.num_chunks}:{job.dp_size}:{job.world_size}"


class ClosedLoop:
    """Probe blocks, the A/B and the guard of one rank's deployment (module docstring)."""

    def __init__(self, config: PerseusConfig, collective: Collective, job: PipelineJob | None = None,
                 reasons: ClockReasonSource | None = None, schedule: Schedule | None = None) -> None:
        self.enabled = config.probe_every_steps > 0
        self.reason_source = reasons  # the clock-event reasons the poller sampled (None: not read)
        self.clock_reasons = ProbeReasons()
        self._began_s = 0.0
        self._pair_plan = False  # the next counted plan step is sampled for reasons (after a probe)
        self.settings = settings_from(config)
        self.energy = EnergyTest(energy_settings_from(config))  # the job's: the same on every rank
        self.energy_dropped = False
        self.plan_running = True  # False once this rank fell back for another reason: no energy evidence
        self._retargeted = False  # since the last window: the energy test restarts on every rank
        self.counted_per_block = config.probe_block_steps
        self.collective = collective
        self.dp = job.dp_rank if job is not None else 0
        self.stage = job.stage if job is not None else 0
        # whether this rank's span is its pipeline's (``judging_stages``): only those vote
        self.judges = job is None or job.stage in judging_stages(schedule or job.build_schedule())
        self._seed_text = job_seed_text(job) if job is not None else "local"
        self.rank_guard: RankGuard | None = None  # made at the first deployed step (its seed needs the step)
        self.steps = 0  # deployed steps begun
        self.role = StepRole.PLAN
        self.plan = Samples()
        self.probes = Samples()
        self.target_scale = 1.0
        self.fell_back = False
        self.decisions: deque[JobDecision] = deque(maxlen=DECISIONS_KEPT)  # acting ones
        self.windows = 0
        self.pipelines: dict[int, PipelineGuard] = {}
        self.last: JobDecision | None = None
        self.window_rows: list[list[float]] = []  # the last window's gathered rows, one per rank in rank order
        self.periods = PeriodWatch(self.settings.backoff.first)  # the loop's own period, said once
        self._notes: list[tuple[str, dict[str, object]]] = []  # events for the engine to write
        # the run's A/B and the samples' changes it was computed at: recomputed only when they change
        self._figure: tuple[tuple[int, int], ABFigure | None] | None = None

    @property
    def probing(self) -> bool:
        """The current step runs at the probe's clocks."""
        return self.role.default_clocks

    @property
    def clocks(self) -> str:
        """The metrics file's ``"clocks"`` of the current step: ``"default"`` or ``"plan"``."""
        return clocks_label(self.role)

    def begin_step(self, step: int = 0) -> StepRole:
        """The role of the deployed step that begins now (``step``: the job's step, the same on every
        rank; the first deployed one seeds the probes' placement)."""
        if self.rank_guard is None and self.enabled:
            placement = ProbePlacement(probe_seed(step, self._seed_text), counted=self.counted_per_block)
            self.rank_guard = RankGuard(placement, self.settings)
        self.steps += 1
        self.role = self.rank_guard.begin_step() if self.rank_guard is not None and not self.fell_back else StepRole.PLAN
        if self.reason_source is not None and self._samples_reasons(self.role):
            self._began_s = monotonic()
        return self.role

    def _samples_reasons(self, role: StepRole) -> bool:
        """Counted probe steps, each paired with the first counted plan step after its block: the
        reasons' read scans the poller's samples on the training thread, so twice a window, not every step."""
        return role is StepRole.PROBE or (role is StepRole.PLAN and self._pair_plan)

    def reference_point(self, targeting: Targeting, plan: StagePlan) -> StagePoint | None:
        """Where a probe runs: None for default clocks; under a power cap (the grid's, alone or with a
        carbon target) the fastest point the cap allows, so a probe never draws more than the cap
        and a carbon point is compared with what the capped job would run without it."""
        grid = targeting.grid
        probe_s = None if grid is None else grid.probe_time_s
        return None if probe_s is None else plan.lookup(probe_s)

    def retarget(self) -> None:
        """The point changed for another reason (straggler, external target): the plan's samples
        so far belong to the old point, and so does the test's evidence."""
        self.plan.clear()
        self._retargeted = True
        if self.rank_guard is not None:
            self.rank_guard.test.restart()

    def point_now(self, targeting: Targeting, plan: StagePlan) -> StagePoint | None:
        """The point of a step whose clocks differ from the last one's: the plan's, or the probe's
        (None: default clocks; ``reference_point``)."""
        return self.reference_point(targeting, plan) if self.probing else targeting.point

    def end_step(self, span_s: float, energy_j: float | None, targeting: Targeting, plan: StagePlan,
                 step_s: float | None = None, running: bool = True, between_s: float = 0.0) -> JobDecision | None:
        """Count the step that ended, judged on its instructions' span (``StepNumbers.span_s``: the
        GPU's first instruction begin to last end where the GPU runs behind the host, the host's
        otherwise) and its work between steps (``between_s``: after the last instruction up to the
        step's end); host work before the first instruction is reported, not judged (``step_s``,
        the whole step, feeds the loop-period report). The A/B keeps the spans. At a window's end,
        the job's decision (a collective on every rank at that step). None at other steps, with
        probes off and after the job fell back. ``running`` False: this rank fell back for another
        reason, so its plan steps ran default clocks and its energy says nothing about the plan (it
        sends none from then on)."""
        span_s = max(span_s, 1e-9)
        judged_s = span_s + max(between_s, 0.0)
        self.plan_running = self.plan_running and running
        role = self.role
        if role.counted:
            (self.plan if role is StepRole.PLAN else self.probes).add(span_s, energy_j)
        if role is StepRole.PLAN:
            self.periods.add(self.steps, judged_s if step_s is None else step_s, judged_s)
        if self.reason_source is not None and self.rank_guard is not None and self._samples_reasons(role):
            self.clock_reasons.add(role is StepRole.PROBE, self.reason_source.clock_reasons_since(self._began_s))
            self._pair_plan = role is StepRole.PROBE
        guard = self.rank_guard
        if guard is None or not self.enabled or self.fell_back:
            return None
        reference = self.reference_point(targeting, plan)
        ratio = guard_target_ratio(targeting, plan, reference)
        end = guard.end_step(judged_s, energy_j, ratio)
        if end is None:
            return None
        at_fastest = targeting.point is not None and targeting.point.time_s <= plan.points[0].time_s
        mine = verdict_row(self.dp, end.verdict) + [float(at_fastest), guard.cost.share, guard.cost.extra_energy_j,
                                                    float(self.judges)]
        energy = end.energy if self.plan_running else None
        mine += (no_energy_row() if energy is None else energy.row()) + [float(self._retargeted), float(self.stage)]
        self._retargeted = False
        rows = self.window_rows = self.collective.all_gather_floats(mine)
        decision = agree([r[:6] for r in rows], end.length, self.settings, at_fastest=all(r[6] for r in rows),
                         judges=[bool(r[9]) for r in rows])
        decision = with_energy(decision, self._energy_verdict(rows), end.length, self.settings)
        self._count(rows, decision)
        guard.apply(decision)
        if (period := self.periods.check()) is not None:
            self._notes.append(("loop_period", dict(period.as_dict())))
        if decision.for_energy and decision.energy is not None:
            self._notes.append(("guard_energy", {"reason": decision.reason, **decision.energy.as_dict()}))
        if decision.action is not Action.KEEP:
            self.decisions.append(decision)
            self.plan.clear()
        if decision.action is Action.FASTER:
            self.energy.restart()  # a new point: its energy is another's
        return decision

    def _energy_verdict(self, rows: list[list[float]]) -> EnergyVerdict | None:
        """The job's energy test on this window's rows (the same on every rank): restarted first if
        any rank's point changed since the last window."""
        if any(len(r) > RETARGETED_AT and r[RETARGETED_AT] for r in rows):
            self.energy.restart()
        ranks = [e for r in rows if (e := RankEnergy.from_row(r[ENERGY_AT:])) is not None]
        return self.energy.observe(job_window(ranks))

    def _count(self, rows: list[list[float]], decision: JobDecision) -> None:
        """Every pipeline's statistic and probe cost, from the gathered rows (the same on every rank)."""
        self.windows += 1
        self.last = decision
        seen: dict[int, PipelineGuard] = {}
        for row in rows:
            dp = int(row[0])
            if dp not in seen:
                before = self.pipelines.get(dp, PipelineGuard())
                seen[dp] = PipelineGuard(windows=before.windows + 1,
                                         alarms=before.alarms + (dp in decision.slow_pipelines))
            p = seen[dp]
            if not math.isnan(row[2]) and row[9]:  # the pipeline's statistic: its judging stages'
                p.statistic = max(p.statistic, row[2])
            p.probe_share = max(p.probe_share, row[7])
            p.probe_extra_energy_j += row[8]
        self.pipelines = seen

    def apply(self, decision: JobDecision, targeting: Targeting, speak: bool) -> str | None:
        """Carry out a decision on the targets: a faster point from the next step (a ``SpeedUp``
        adjustment), or the problem to fall back to default clocks for; one log line when it acts."""
        if decision.action is Action.KEEP:
            return None
        which = "energy guard" if decision.for_energy else "no-slowdown guard"
        if speak:
            log.warning("perseus: %s: %s", which, decision.reason)
        if decision.action is Action.FASTER:
            self.target_scale *= decision.factor
            targeting.set_adjustment("guard", SpeedUp(1.0 - self.target_scale))
            return None
        self.fell_back = True
        self.energy_dropped = decision.for_energy
        return f"{which}: {decision.reason}"

    def notes(self, speak: bool) -> list[tuple[str, dict[str, object]]]:
        """Events found since the last call (a training loop's own period, once per run), each said
        once in the log where ``speak``."""
        notes, self._notes = self._notes, []
        if speak and self.periods.found is not None and any(what == "loop_period" for what, _ in notes):
            log.info("perseus: %s", self.periods.found.describe())
        return notes

    @property
    def period(self) -> Period | None:
        """The training loop's own period in plan-step times, once found."""
        return self.periods.found

    def event(self, decision: JobDecision) -> dict[str, object]:
        """The metrics file's ``guard`` event: the decision, every pipeline's statistic and probe cost."""
        return {"action": decision.action.value, "reason": decision.reason, "next_window": decision.next_length,
                "slow_pipelines": list(decision.slow_pipelines), "threshold": self.settings.threshold,
                "target_scale": self.target_scale,
                "pipelines": {str(dp): p.as_dict() for dp, p in sorted(self.pipelines.items())},
                "energy": None if decision.energy is None else decision.energy.as_dict(),
                **self._reasons()}

    def _energy_summary(self) -> dict[str, object]:
        """The job's energy test: where it stands, the saving it measured, whether it dropped the plan."""
        last = None if self.last is None else self.last.energy
        return {"threshold": self.energy.settings.threshold, "margin": self.energy.settings.margin,
                "statistic": self.energy.statistic, "alarms": self.energy.alarms, "dropped": self.energy_dropped,
                **({} if last is None else {k: v for k, v in last.as_dict().items()
                                            if k in ("windows", "saving", "saving_low", "saving_high")})}

    def _reasons(self) -> dict[str, object]:
        """This rank's clock-event reasons during probes and plan steps, where they are read."""
        if self.reason_source is None:
            return {}
        return {"clock_reasons": {"pipeline": self.dp, **self.clock_reasons.as_dict()}}

    def _comparable(self) -> bool:
        """Probes to compare with: at least one, with energy measured (a step shorter than the
        energy counter's update period can read 0 J; medians of such steps say nothing)."""
        return bool(self.probes.energy_j) and median(self.probes.energy_j) > 0

    def figure(self) -> ABFigure | None:
        """The run's A/B: counted plan steps against counted probes (None until both)."""
        at = (self.plan.changes, self.probes.changes)
        if self._figure is None or self._figure[0] != at:
            figure = None
            if self.plan.energy_j and self._comparable():
                figure = ab_figure(self.plan.time_s, self.plan.energy_j, self.probes.time_s, self.probes.energy_j)
            self._figure = (at, figure)
        return self._figure[1]

    def step_figure(self, time_s: float, energy_j: float | None) -> ABFigure | None:
        """One plan step against the probes' medians (None before the first probe, or unmeasured)."""
        if self.probing or energy_j is None or not self._comparable():
            return None
        return step_figure(time_s, energy_j, self.probes.time_s, self.probes.energy_j)

    def summary(self) -> dict[str, object]:
        """The summary's ``"closed_loop"``: the A/B with its spread, every pipeline's guard and probe
        cost, the decisions that acted."""
        ab = self.figure()
        guard = self.rank_guard
        return {
            "probe_first_window": self.settings.backoff.first, "probe_longest_window": self.settings.backoff.longest,
            "threshold": self.settings.threshold, "tolerance": self.settings.tolerance,
            "plan_steps": len(self.plan.time_s), "probe_steps": len(self.probes.time_s),
            "default_clock_fraction": guard.cost.share if guard is not None else 0.0,
            "ab": None if ab is None else {"saving": ab.saving, "saving_stderr": ab.saving_stderr,
                                           "time_change": ab.time_change, "time_stderr": ab.time_stderr,
                                           "n_plan": ab.n_plan, "n_probe": ab.n_probe},
            "windows": self.windows,
            "pipelines": {str(dp): p.as_dict() for dp, p in sorted(self.pipelines.items())},
            "guard_target_scale": self.target_scale,
            "guard_moves": sum(d.action is Action.FASTER for d in self.decisions),
            "guard_fell_back": self.fell_back,
            "energy": self._energy_summary(),
            "loop_period": None if self.period is None else self.period.as_dict(),
            **self._reasons(),
            "decisions": [{"action": d.action.value, "slow_pipelines": list(d.slow_pipelines), "reason": d.reason}
                          for d in self.decisions],
        }


def guard_target_ratio(targeting: Targeting, plan: StagePlan, reference: StagePoint | None = None) -> float:
    """The target's iteration time in units of the probes' reference point's (default clocks unless
    a power cap; 1.0: no slowdown): what the measured plan is held to. Under a straggler target it is
    the straggler's time, so a plan paced behind it is not called slow."""
    target = targeting.target()
    default_s = plan.default_point().time_s
    reference_s = reference.time_s if reference is not None else default_s
    if isinstance(target, PacedTarget):
        return target_ratio(target.ratio * default_s, reference_s)
    if isinstance(target, TimeTarget):
        return target_ratio(target.seconds, reference_s)
    if isinstance(target, (CarbonTarget, PowerCapTarget, GridPaced)):  # a grid target, paced or not
        return target_ratio(target.time_ratio(default_s) * default_s, reference_s)
    return target_ratio(None, reference_s)  # NoSlowdown, or a target with no time of its own
