"""The runtime's phases as a small explicit state machine.

    WARMUP ──► PROFILING ──► PLANNING ──► DEPLOYED ◄──► FALLBACK
       │            │            │            │
       └────────────┴────────────┴──► STEADY ◄┘

- WARMUP: default clocks; the baseline iteration time and energy are measured.
- PROFILING: the SM clock sweep, a few iterations per frequency, while training proceeds.
- PLANNING: default clocks while rank 0 plans in a child process at lower priority.
- DEPLOYED: every instruction runs at its planned frequency.
- FALLBACK: the executed order stopped matching the plan, or a rank's clock control failed;
  default clocks until replanned.
- STEADY: default clocks, only measuring (modes ``profile``/``plan``/``measure-only``, when no
  plan can be had, or when another rank died or hung and no collective is made any more).

Transitions happen only at step boundaries, on all ranks together (the engine drives them with
the same step counts and gloo-agreed flags everywhere). Where warm-up leads is ``after_warmup``.
"""

from __future__ import annotations

import enum

from perseus.runtime.config import Mode


class Phase(enum.Enum):
    WARMUP = "warmup"
    PROFILING = "profiling"
    PLANNING = "planning"
    DEPLOYED = "deployed"
    FALLBACK = "fallback"
    STEADY = "steady"


ALLOWED: dict[Phase, frozenset[Phase]] = {
    Phase.WARMUP: frozenset({Phase.PROFILING, Phase.PLANNING, Phase.DEPLOYED, Phase.STEADY}),
    Phase.PROFILING: frozenset({Phase.PLANNING, Phase.STEADY}),
    Phase.PLANNING: frozenset({Phase.DEPLOYED, Phase.STEADY}),
    Phase.DEPLOYED: frozenset({Phase.FALLBACK, Phase.PLANNING, Phase.STEADY}),
    Phase.FALLBACK: frozenset({Phase.PLANNING, Phase.DEPLOYED, Phase.STEADY}),
    Phase.STEADY: frozenset({Phase.PLANNING}),
}


class PhaseMachine:
    """Current phase plus the step at which each phase was entered (for reports and tests)."""

    def __init__(self) -> None:
        self.phase = Phase.WARMUP
        self.history: list[tuple[int, Phase]] = [(0, Phase.WARMUP)]

    def enter(self, phase: Phase, step: int) -> None:
        if phase == self.phase:
            return
        if phase not in ALLOWED[self.phase]:
            raise RuntimeError(f"perseus runtime bug: illegal phase change {self.phase.value} -> {phase.value}")
        self.phase = phase
        self.history.append((step, phase))

    def entered_at(self, phase: Phase) -> int | None:
        """Step at which ``phase`` was first entered, or None."""
        return next((step for step, p in self.history if p == phase), None)


def after_warmup(has_plan: bool, has_profile: bool, mode: Mode) -> tuple[Phase, str | None]:
    """The phase warm-up leads to, from what the sources gave (a plan: this rank's stage of a
    frontier; a profile) and the mode; with the line saying why, for ``STEADY``."""
    if has_plan:
        if mode.deploys:
            return Phase.DEPLOYED, None
        return Phase.STEADY, "frontier available; mode %r keeps default clocks" % mode.value
    if has_profile and mode.plans:
        return Phase.PLANNING, None
    if has_profile:
        return Phase.STEADY, "profile already available (cached or provided); nothing to profile"
    if not mode.profiles:
        return Phase.STEADY, (f"{mode}: no clock control, so no frequency sweep; give profile_path or "
                              "frontier_path (or a cache from a privileged run) to get a plan. Reporting measured "
                              "time and energy only")
    return Phase.PROFILING, None
