"""The no-slowdown guard: a closed loop that keeps the deployed plan within its time target.

The planner promises a plan as fast as default clocks (or as slow as a straggler-matched or
external target allows), but it plans from a profile, and profiles can be wrong: taken on another
node, under another load, thermal state or driver, or simply noisy. Nothing else checks the
promise while training, so this module does: it compares the measured iteration time of counted
plan steps with counted default-clock probe steps of the same run (``probes.py``) and says what
to do. The engine feeds it every deployed step and applies its decisions; this module is pure
(no clock, no I/O, no randomness), so the same inputs give the same decisions.

A check runs at every counted probe step: the plan steps counted since the previous check
(disjoint windows, so consecutive checks are nearly independent evidence) against the last
``probe_window`` probes. With ``ratio`` = median(plan) / median(probes) (``ab.median_ratio``)
and ``target_ratio`` the target's time in units of default clocks (1.0 for the no-slowdown
target; the straggler-matched or external target's time / the default point's planned time)::

    excess = ratio / target_ratio − 1
    margin = tolerance + noise_z × stderr(ratio) / target_ratio
    slow   = excess > margin

The margin grows with the measured noise, so a correct plan on a noisy machine is not pushed
faster by chance; ``patience`` slow checks in a row are needed before anything changes (one
disturbed window decides nothing, as in ``straggler.py``).

States (one decision per check; the table is ``ALLOWED``)::

                 slow (< patience in a row)
      WATCHING ───────────────────────────► SUSPECT ◄─┐ slow
         ▲  │ within                        │  │      │
         │  ▼                       within  │  └──────┘
         │ HOLDING ◄────────────────────────┘
         │                                  │ slow, patience in a row
         └───── FASTER (not at the fastest point)
                FALLBACK (at the fastest point) ──► FALLEN_BACK (terminal: default clocks)

- WATCHING: too few samples at the current point (after deployment, a move or a new target).
- HOLDING: the last check was within the margin.
- SUSPECT: slow at the last 1 .. patience − 1 checks in a row.
- FALLEN_BACK: even the fastest frontier point was slower; default clocks for the rest of the run.

A FASTER decision multiplies ``target_scale`` (≤ 1; the engine looks up the point for its target
time × ``target_scale``) by ``1 / (1 + e)``, ``e`` the least excess of the last ``patience`` checks:
the least change the evidence supports. Plan steps before the move are dropped, and the first
``settle`` plan steps after it are not counted (the step after a clock change is slow).
"""

from __future__ import annotations

import enum
from collections import deque
from dataclasses import dataclass, field

from perseus.errors import ConfigError
from perseus.runtime.config import PerseusConfig
from perseus.runtime.guard.ab import Ratio, median_ratio
from perseus.runtime.guard.probes import StepRole


class GuardState(enum.Enum):
    WATCHING = "watching"
    HOLDING = "holding"
    SUSPECT = "suspect"
    FALLEN_BACK = "fallen_back"


ALLOWED: dict[GuardState, frozenset[GuardState]] = {
    GuardState.WATCHING: frozenset({GuardState.WATCHING, GuardState.HOLDING, GuardState.SUSPECT, GuardState.FALLEN_BACK}),
    GuardState.HOLDING: frozenset({GuardState.HOLDING, GuardState.SUSPECT, GuardState.WATCHING, GuardState.FALLEN_BACK}),
    GuardState.SUSPECT: frozenset({GuardState.SUSPECT, GuardState.HOLDING, GuardState.WATCHING, GuardState.FALLEN_BACK}),
    GuardState.FALLEN_BACK: frozenset({GuardState.FALLEN_BACK}),
}
# HOLDING/WATCHING → FALLEN_BACK or a move straight to WATCHING only with patience 1.


def target_ratio(target_time_s: float | None, default_time_s: float) -> float:
    """A target's time in units of default clocks' (planned seconds over the default point's).

    ``None`` (no straggler or external target) is the no-slowdown target, 1.0. A target faster
    than the default point is held to the default point's time: no plan is promised faster.
    """
    if default_time_s <= 0:
        raise ValueError(f"default point's planned time must be positive, got {default_time_s}")
    if target_time_s is None:
        return 1.0
    return max(1.0, target_time_s / default_time_s)


class Action(enum.Enum):
    KEEP = "keep"  # leave the deployed point as it is
    FASTER = "faster"  # look up the point for target time × target_scale
    FALLBACK = "fallback"  # default clocks for the rest of the run


@dataclass(frozen=True)
class GuardSettings:
    """Tolerance, noise allowance and hysteresis of the guard (PerseusConfig's ``guard_*``)."""

    tolerance: float = 0.01
    patience: int = 3
    noise_z: float = 2.0
    probe_window: int = 5
    min_plan_steps: int = 3
    settle: int = 1

    @classmethod
    def from_config(cls, config: PerseusConfig) -> GuardSettings:
        """The no-slowdown guard's tolerance, noise allowance and patience."""
        return cls(tolerance=config.guard_tolerance, patience=config.guard_patience, noise_z=config.guard_noise_z)

    def __post_init__(self) -> None:
        if not 0 <= self.tolerance < 0.5:
            raise ConfigError(f"guard tolerance must be in [0, 0.5), got {self.tolerance}")
        if self.patience < 1:
            raise ConfigError(f"guard patience must be >= 1, got {self.patience}")
        if self.noise_z < 0:
            raise ConfigError(f"guard noise_z must be >= 0, got {self.noise_z}")
        if self.probe_window < 1 or self.min_plan_steps < 1 or self.settle < 0:
            raise ConfigError("guard probe_window and min_plan_steps must be >= 1 and settle >= 0")


@dataclass(frozen=True)
class GuardDecision:
    """One check's outcome; ``reason`` is the one log line that explains it."""

    action: Action
    state: GuardState
    excess: float | None  # measured time / target time − 1 (None: too few samples)
    margin: float | None  # tolerance + noise allowance
    target_scale: float  # cumulative factor on the target time (1.0 = as planned)
    ratio: Ratio | None
    reason: str

    def as_dict(self) -> dict[str, object]:
        """The metrics-file event's data."""
        return {"action": self.action.value, "state": self.state.value, "excess": self.excess, "margin": self.margin,
                "target_scale": self.target_scale, "n_plan": self.ratio.n_plan if self.ratio else 0,
                "n_probe": self.ratio.n_probe if self.ratio else 0, "reason": self.reason}


@dataclass
class TimeGuard:
    """Closed-loop policy over one run's deployed steps (module docstring)."""

    settings: GuardSettings = field(default_factory=GuardSettings)

    def __post_init__(self) -> None:
        self.state = GuardState.WATCHING
        self.target_scale = 1.0
        self._plan: list[float] = []
        self._probes: deque[float] = deque(maxlen=self.settings.probe_window)
        self._slow: list[float] = []  # excess of the slow checks in a row
        self._discard = 0  # plan steps still to drop after a move

    @property
    def probes(self) -> tuple[float, ...]:
        """The default-clock probe times the next check compares with."""
        return tuple(self._probes)

    def observe(self, role: StepRole, time_s: float, *, target_ratio: float = 1.0,
                at_fastest: bool = False) -> GuardDecision | None:
        """Feed one deployed step; returns a decision at each counted probe step, else None.

        ``target_ratio``: the current target's time over default clocks' (1.0: no slowdown).
        ``at_fastest``: the deployed point is the frontier's fastest, so FASTER is impossible.
        """
        if self.state is GuardState.FALLEN_BACK:
            return None
        if role is StepRole.PLAN:
            if self._discard:
                self._discard -= 1
            else:
                self._plan.append(time_s)
            return None
        if role is not StepRole.PROBE:
            return None
        self._probes.append(time_s)
        return self._check(target_ratio, at_fastest)

    def retarget(self) -> None:
        """The target changed (straggler policy, external call): measure the new point afresh."""
        if self.state is not GuardState.FALLEN_BACK:
            self._restart()

    def _restart(self) -> None:
        self._enter(GuardState.WATCHING)
        self._plan, self._slow, self._discard = [], [], self.settings.settle

    def _enter(self, state: GuardState) -> None:
        if state not in ALLOWED[self.state]:
            raise RuntimeError(f"perseus guard bug: illegal change {self.state.value} -> {state.value}")
        self.state = state

    def _check(self, target_ratio: float, at_fastest: bool) -> GuardDecision:
        s = self.settings
        if target_ratio <= 0:
            raise ValueError(f"target_ratio must be positive, got {target_ratio}")
        if len(self._plan) < s.min_plan_steps:
            return self._decide(Action.KEEP, None, None, None,
                                f"{len(self._plan)} plan step(s) since the last check, need {s.min_plan_steps}")
        ratio = median_ratio(self._plan, list(self._probes))
        self._plan = []
        if ratio.stderr is None:
            return self._decide(Action.KEEP, None, None, ratio, "noise unknown yet")
        excess = ratio.value / target_ratio - 1.0
        margin = s.tolerance + s.noise_z * ratio.stderr / target_ratio
        against = "default clocks" if target_ratio == 1.0 else f"its target ({target_ratio:.3f}x default clocks)"
        measured = (f"median of {ratio.n_plan} plan steps vs {ratio.n_probe} default-clock probe(s): "
                    f"{100 * excess:+.1f}% against {against}, margin {100 * margin:.1f}% "
                    f"(tolerance {100 * s.tolerance:.1f}% + noise {100 * (margin - s.tolerance):.1f}%)")
        if excess <= margin:
            self._slow = []
            self._enter(GuardState.HOLDING)
            return self._decide(Action.KEEP, excess, margin, ratio, f"within: {measured}")
        self._slow.append(excess)
        if len(self._slow) < s.patience:
            self._enter(GuardState.SUSPECT)
            return self._decide(Action.KEEP, excess, margin, ratio,
                                f"slow check {len(self._slow)} of {s.patience}: {measured}")
        least = min(self._slow[-s.patience:])
        if at_fastest:
            self._enter(GuardState.FALLEN_BACK)
            return self._decide(Action.FALLBACK, excess, margin, ratio,
                                f"even the fastest frontier point is slower for {s.patience} checks in a row "
                                f"({measured}): falling back to default clocks")
        self.target_scale /= 1.0 + least
        self._restart()
        return self._decide(Action.FASTER, excess, margin, ratio,
                            f"slower for {s.patience} checks in a row ({measured}): moving to a faster point, "
                            f"target x{self.target_scale:.3f}")

    def _decide(self, action: Action, excess: float | None, margin: float | None, ratio: Ratio | None,
                reason: str) -> GuardDecision:
        return GuardDecision(action, self.state, excess, margin, self.target_scale, ratio, reason)
