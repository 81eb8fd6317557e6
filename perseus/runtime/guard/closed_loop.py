"""The deployed plan checked while training: default-clock probe steps, the same-run A/B and the
no-slowdown guard, for one rank.

Why a room of its own: the engine only asks two things of it per deployed step, whether the step
runs at default clocks (``begin_step``) and, at its end, whether the guard decided anything
(``end_step``). Which steps are probes is ``probes.ProbeSchedule``; what to decide from them is
``time_guard.TimeGuard``; the A/B figures are ``ab.py``'s. Every rank runs the same probe steps
(the schedule counts deployed steps, and every rank deploys at the same step), so at each counted
probe rank 0's guard decides and the decision is broadcast: all ranks move to the same frontier
point, or fall back, at the same step.
"""

from __future__ import annotations

import logging
from collections import deque
from dataclasses import dataclass, field
from statistics import median

from perseus.runtime.guard.ab import ABFigure, ab_figure, step_figure
from perseus.runtime.plane.collective import Collective
from perseus.runtime.config import PerseusConfig
from perseus.runtime.guard.probes import ProbeSchedule, StepRole, clocks_label
from perseus.planner.stage_plan import StagePlan
from perseus.runtime.clocks.targeting import PacedTarget, SpeedUp, Targeting, TimeTarget
from perseus.runtime.guard.time_guard import Action, GuardDecision, GuardSettings, TimeGuard, target_ratio

log = logging.getLogger("perseus.runtime")

# Counted samples kept for the A/B: the most recent, so a long run's figure follows the point it runs.
AB_WINDOW = 400


@dataclass
class Samples:
    """(time, energy) of counted steps of one kind, newest last, at most ``AB_WINDOW``."""

    time_s: deque[float] = field(default_factory=lambda: deque(maxlen=AB_WINDOW))
    energy_j: deque[float] = field(default_factory=lambda: deque(maxlen=AB_WINDOW))
    changes: int = 0  # bumped by every add and clear: what a figure computed from them depends on

    def add(self, time_s: float, energy_j: float) -> None:
        self.time_s.append(time_s)
        self.energy_j.append(energy_j)
        self.changes += 1

    def clear(self) -> None:
        self.time_s.clear()
        self.energy_j.clear()
        self.changes += 1


class ClosedLoop:
    """Probe steps, the A/B and the guard of one rank's deployment (module docstring)."""

    def __init__(self, config: PerseusConfig, collective: Collective) -> None:
        self.schedule: ProbeSchedule = ProbeSchedule.from_config(config)
        self.guard = TimeGuard(GuardSettings.from_config(config))
        self.collective = collective
        self.steps = 0  # deployed steps begun
        self.role = StepRole.PLAN
        self.plan = Samples()
        self.probes = Samples()
        self.decisions: list[GuardDecision] = []
        # the run's A/B and the samples' changes it was computed at: recomputed only when they change
        self._figure: tuple[tuple[int, int], ABFigure | None] | None = None

    @property
    def probing(self) -> bool:
        """The current step runs at default clocks."""
        return self.role.default_clocks

    @property
    def clocks(self) -> str:
        """The metrics file's ``"clocks"`` of the current step: ``"default"`` or ``"plan"``."""
        return clocks_label(self.role)

    def begin_step(self) -> StepRole:
        """The role of the deployed step that begins now."""
        self.role = self.schedule.role(self.steps)
        self.steps += 1
        return self.role

    def retarget(self) -> None:
        """The point changed for another reason (straggler, external target): the plan's samples
        so far belong to the old point."""
        self.guard.retarget()
        self.plan.clear()

    def end_step(self, time_s: float, energy_j: float, targeting: Targeting, plan: StagePlan) -> GuardDecision | None:
        """Count the step that ended; at a counted probe, the guard's decision (every rank the same:
        a collective at that step on every rank). None at other steps and with probes off."""
        role = self.role
        if role.counted:
            (self.plan if role is StepRole.PLAN else self.probes).add(time_s, energy_j)
        if not self.schedule.enabled:
            return None
        if role is not StepRole.PROBE:
            if self.collective.is_root:
                self.guard.observe(role, time_s)  # a plan step's sample; checks come at probes only
            return None
        decision = None
        if self.collective.is_root:
            at_fastest = targeting.point is not None and targeting.point.time_s <= plan.points[0].time_s
            decision = self.guard.observe(role, time_s, target_ratio=guard_target_ratio(targeting, plan),
                                          at_fastest=at_fastest)
        decision = self.collective.broadcast_object(decision)
        if decision is not None:
            self.decisions.append(decision)
            if decision.action is Action.FASTER:
                self.plan.clear()
        return decision

    def apply(self, decision: GuardDecision, targeting: Targeting, speak: bool) -> str | None:
        """Carry out a decision on the targets: a faster point from the next step (a ``SpeedUp``
        adjustment), or the problem to fall back to default clocks for; one log line when it acts."""
        if decision.action is Action.KEEP:
            return None
        if speak:
            log.warning("perseus: no-slowdown guard: %s", decision.reason)
        if decision.action is Action.FASTER:
            targeting.set_adjustment("guard", SpeedUp(1.0 - decision.target_scale))
            return None
        return f"no-slowdown guard: {decision.reason}"

    def _comparable(self) -> bool:
        """Probes to compare with: at least one, with energy measured (a step shorter than the
        energy counter's update period can read 0 J; medians of such steps say nothing)."""
        return bool(self.probes.time_s) and median(self.probes.energy_j) > 0

    def figure(self) -> ABFigure | None:
        """The run's A/B: counted plan steps against counted default-clock probes (None until both)."""
        at = (self.plan.changes, self.probes.changes)
        if self._figure is None or self._figure[0] != at:
            figure = None
            if self.plan.time_s and self._comparable():
                figure = ab_figure(self.plan.time_s, self.plan.energy_j, self.probes.time_s, self.probes.energy_j)
            self._figure = (at, figure)
        return self._figure[1]

    def step_figure(self, time_s: float, energy_j: float) -> ABFigure | None:
        """One plan step against the probes' medians (None before the first probe)."""
        if self.probing or not self._comparable():
            return None
        return step_figure(time_s, energy_j, self.probes.time_s, self.probes.energy_j)

    def summary(self) -> dict[str, object]:
        """The summary's ``"closed_loop"``: the A/B with its spread, the probes' cost, the decisions."""
        ab = self.figure()
        return {
            "probe_every_steps": self.schedule.every,
            "default_clock_fraction": self.schedule.default_fraction,
            "plan_steps": len(self.plan.time_s), "probe_steps": len(self.probes.time_s),
            "ab": None if ab is None else {"saving": ab.saving, "saving_stderr": ab.saving_stderr,
                                           "time_change": ab.time_change, "time_stderr": ab.time_stderr,
                                           "n_plan": ab.n_plan, "n_probe": ab.n_probe},
            "guard_state": self.guard.state.value,
            "guard_target_scale": self.guard.target_scale,
            "guard_moves": sum(d.action.value == "faster" for d in self.decisions),
            "guard_fell_back": any(d.action.value == "fallback" for d in self.decisions),
        }


def guard_target_ratio(targeting: Targeting, plan: StagePlan) -> float:
    """The target's iteration time in units of default clocks' (1.0: no slowdown): what the guard
    holds the measured plan to."""
    target = targeting.target()
    default_s = plan.default_point().time_s
    if isinstance(target, PacedTarget):
        return target.ratio
    if isinstance(target, TimeTarget):
        return target_ratio(target.seconds, default_s)
    if hasattr(target, "time_ratio"):  # a grid target (carbon, power cap), paced or not
        return float(target.time_ratio(default_s))
    return 1.0  # NoSlowdown, or a target with no time of its own
