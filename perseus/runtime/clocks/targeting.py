"""Which frontier point a rank runs: the targets in force, composed into one ``StagePoint``.

Why a room of its own: every reason to run slower or faster than the no-slowdown default is a
rule for picking a point of this rank's ``StagePlan``, and more keep coming (a closed-loop time
guard, carbon and power targets). Each is a small value here, so a new one needs no change to
the engine, which only asks ``Targeting`` for the point and follows it.

A ``Target`` picks a point from the plan:

- ``NoSlowdown``: the least-energy point no slower than all-max clocks (``default_point``);
- ``TimeTarget(seconds)``: the least-energy point planned to finish within ``seconds``;
- ``PacedTarget(ratio)``: iterations last ``ratio`` × the default point's time whatever we run
  (behind a straggler), so the point of least energy when paced to that time (``paced_lookup``);
- ``CarbonTarget`` / ``PowerCapTarget``: the point rank 0 chose for the grid (``grid.py``: carbon
  intensity under a time budget, or the fastest point under a power cap), carried as its planned
  time so every rank picks the same point; behind a straggler slower than it, the straggler's
  paced point instead (``GridPaced``), which also keeps the cap (a paced iteration averages less power).

``Targeting.choose`` composes them: the external target (``set_target_time``,
``set_target_slowdown``) first, else the grid's target (``set_grid``), else the straggler policy's ratio (``straggler.py``, fed by the
periodic job check through ``observe_slowdown``) as a ``PacedTarget``, else
``NoSlowdown``; then each ``Adjustment`` in order moves the point (a guard's ``SpeedUp`` margin
picks a faster one). A change of any of these marks a new choice due (``due``); the engine makes
it at the next step begin of a deployed step (``retarget``), as every rank changes plan between
steps. Pure: no clocks, no collectives, no logging.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from perseus.errors import ConfigError
from perseus.planner.stage_plan import StagePlan, StagePoint
from perseus.runtime.clocks.straggler import StragglerPolicy


@runtime_checkable
class Target(Protocol):
    """A reason to run some frontier point: picks it from this rank's plan."""

    def choose(self, plan: StagePlan) -> StagePoint: ...


@runtime_checkable
class Adjustment(Protocol):
    """A correction applied after the target (a time guard): the point to run instead of ``point``."""

    def adjust(self, plan: StagePlan, point: StagePoint) -> StagePoint: ...


@dataclass(frozen=True)
class NoSlowdown:
    """The default: least energy with no slowdown against the all-max-clock baseline."""

    def choose(self, plan: StagePlan) -> StagePoint:
        return plan.default_point()


@dataclass(frozen=True)
class TimeTarget:
    """Run the least-energy plan finishing within ``seconds`` (planned iteration time)."""

    seconds: float

    def __post_init__(self) -> None:
        if not self.seconds > 0:
            raise ConfigError(f"target time must be a positive number of seconds, got {self.seconds!r}")
        object.__setattr__(self, "seconds", float(self.seconds))

    def choose(self, plan: StagePlan) -> StagePoint:
        return plan.lookup(self.seconds)


@dataclass(frozen=True)
class PacedTarget:
    """Iterations last ``ratio`` × the default point's time anyway: least energy when paced to it
    (a slower plan waits less at blocking power), not at our own pace."""

    ratio: float

    def __post_init__(self) -> None:
        if not self.ratio >= 1.0:
            raise ConfigError(f"target slowdown must be >= 1.0 (a ratio of iteration times), got {self.ratio!r}")
        object.__setattr__(self, "ratio", float(self.ratio))

    def choose(self, plan: StagePlan) -> StagePoint:
        return plan.paced_lookup(plan.default_point().time_s * self.ratio)


@dataclass(frozen=True)
class SpeedUp:
    """Run a point planned ``margin`` faster than the chosen one (least energy within that time;
    the fastest point if none is that fast): what a time guard asks for when the deployed plan
    measures slower than planned."""

    margin: float

    def __post_init__(self) -> None:
        if not 0.0 <= self.margin < 1.0:
            raise ConfigError(f"speed-up margin must be in [0, 1) (a fraction of the planned time), got {self.margin!r}")

    def adjust(self, plan: StagePlan, point: StagePoint) -> StagePoint:
        if self.margin == 0.0:
            return point
        faster = plan.lookup(point.time_s * (1.0 - self.margin))
        return faster if faster.time_s < point.time_s else point


@dataclass(frozen=True)
class GridPoint:
    """A point rank 0 chose from the grid's signals, by its planned time (never faster than no slowdown)."""

    time_s: float

    def choose(self, plan: StagePlan) -> StagePoint:
        return plan.lookup(self.time_s)

    def time_ratio(self, default_s: float) -> float:
        return max(self.time_s / default_s, 1.0)


@dataclass(frozen=True)
class CarbonTarget(GridPoint):
    """The point rank 0 chose for this carbon window (``perseus.carbon.policy``), by its planned
    time; ``intensity`` (gCO2/kWh) and the job's planned power ride along for the metrics."""

    intensity: float
    job_power_w: float
    power_cap_w: float | None = None
    cap_time_s: float | None = None  # with a cap: the planned time of the fastest point under it

    @property
    def probe_time_s(self) -> float | None:
        """Where the guard's probes run (None: default clocks): with a cap, the fastest point under
        it, what the job would run without a carbon target; the carbon point itself would compare
        the plan with itself."""
        return self.cap_time_s


@dataclass(frozen=True)
class PowerCapTarget(GridPoint):
    """The fastest point whose job power is under ``power_cap_w`` (rank 0's choice, by its time)."""

    power_cap_w: float
    job_power_w: float
    intensity: float | None = None

    @property
    def probe_time_s(self) -> float:
        """Where the guard's probes run: this point, the fastest the cap allows (never above the cap)."""
        return self.time_s


GridTarget = CarbonTarget | PowerCapTarget


@dataclass(frozen=True)
class GridPaced:
    """A grid target behind a straggler: if the straggler's pace is slower than the grid's point,
    the paced point for that pace (least energy when waiting anyway), else the grid's point."""

    grid: GridTarget
    ratio: float

    def choose(self, plan: StagePlan) -> StagePoint:
        paced_s = plan.default_point().time_s * self.ratio
        if paced_s > self.grid.time_s:
            return plan.paced_lookup(paced_s)
        return self.grid.choose(plan)

    def time_ratio(self, default_s: float) -> float:
        return max(self.ratio, self.grid.time_ratio(default_s))


NO_SLOWDOWN = NoSlowdown()


class Targeting:
    """The targets in force and the point they chose; tells when a new choice is due."""

    def __init__(self, policy: StragglerPolicy | None = None) -> None:
        self.policy = policy if policy is not None else StragglerPolicy()
        self.external: Target | None = None
        self.grid: CarbonTarget | PowerCapTarget | None = None  # the grid's target in force (grid.py)
        self._adjustments: dict[str, Adjustment] = {}
        self.point: StagePoint | None = None  # the point being run (None before deployment)
        self.slowdown = 1.0  # its planned time / the default point's: a slowdown applied on purpose
        self.due = False

    # ---------------------------------------------------------------- the targets

    def set_external(self, target: Target | None) -> None:
        """A user's target (``PerseusRuntime.set_target_*``); None goes back to the straggler / default."""
        self.external = target
        self.due = True

    def set_grid(self, target: CarbonTarget | PowerCapTarget | None) -> None:
        """The grid's decision (every rank the same, at the same step); a new choice is due only
        when it names another point or another probe point (a new intensity alone does not restart
        the A/B)."""
        before = self.grid
        self.grid = target
        if (before is None) != (target is None) or (before is not None and target is not None and (
                before.time_s, before.probe_time_s) != (target.time_s, target.probe_time_s)):
            self.due = True

    @property
    def straggler_ratio(self) -> float:
        """The slowdown the straggler policy follows (1.0: none)."""
        return self.policy.ratio

    def observe_slowdown(self, slowdown: float) -> bool:
        """One job check's slowdown of the slowest pipeline (``straggler.StragglerPolicy``); True
        when the straggler policy's ratio changed (a new choice is then due)."""
        before = self.policy.ratio
        if self.policy.observe(slowdown) == before:
            return False
        self.due = True
        return True

    def set_adjustment(self, name: str, adjustment: Adjustment | None) -> None:
        """Add, replace (same ``name``) or remove (None) a correction applied after the target."""
        if adjustment is None:
            if self._adjustments.pop(name, None) is not None:
                self.due = True
        elif self._adjustments.get(name) != adjustment:
            self._adjustments[name] = adjustment
            self.due = True

    def target(self) -> Target:
        """The target in force: external first, else the grid's (paced behind a straggler), else
        the straggler's pace, else no slowdown."""
        if self.external is not None:
            return self.external
        if self.grid is not None:
            return GridPaced(self.grid, self.straggler_ratio) if self.straggler_ratio > 1.0 else self.grid
        if self.straggler_ratio > 1.0:
            return PacedTarget(self.straggler_ratio)
        return NO_SLOWDOWN

    # ---------------------------------------------------------------- the point

    def choose(self, plan: StagePlan) -> StagePoint:
        """The point the targets in force pick from ``plan``, after every adjustment."""
        point = self.target().choose(plan)
        for adjustment in self._adjustments.values():
            point = adjustment.adjust(plan, point)
        return point

    def deploy(self, plan: StagePlan) -> tuple[StagePoint, bool]:
        """Choose and adopt a point for a (new) deployment: (point, whether it replaced another)."""
        point = self.choose(plan)
        return point, self._adopt(plan, point)

    def retarget(self, plan: StagePlan) -> StagePoint | None:
        """When a choice is due: the new point if it differs from the one run, else None."""
        self.due = False
        point = self.choose(plan)
        if point is self.point:
            return None
        self._adopt(plan, point)
        return point

    def _adopt(self, plan: StagePlan, point: StagePoint) -> bool:
        changed = self.point is not None and point is not self.point
        self.due = False
        self.point = point
        self.slowdown = point.time_s / plan.default_point().time_s
        return changed
