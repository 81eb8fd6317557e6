"""Which deployed steps run at default clocks: the probe schedule behind the same-run A/B.

The closed loop (``time_guard.py``) and the honest saving (``ab.py``) compare the deployed plan
with default clocks *of the same run*, measured now and not in a warm-up taken under other
conditions (the load of a shared machine, a throttled GPU, a planner process beside training).
So every ``every`` deployed steps a few steps run at default clocks: a probe.

Why probes come in pairs and the step after one is discarded: the first iteration after a clock
change is systematically slower (profiling saw 25–35 % on a loaded CPU; on a GPU, clock switches,
caches and the allocator settle). One default-clock step between plan steps would measure that
transient on both sides: the probe is the first default step after plan clocks, and the plan
step after it is the first plan step after default clocks. Both biases do not cancel (the plan
has many steps, the probe one). Instead each probe is ``settle`` default steps that are thrown
away followed by one counted default step, and the first ``settle`` plan steps after it are
thrown away too. Every counted sample, probe or plan, was preceded by ``settle`` steps at its own
clocks, so the transient enters neither side: the A/B compares settled steps with settled steps.
Deployed step 0 follows the planning phase (default clocks), so it is a settle step as well.

Why evenly spaced: probes interleaved with the plan see the same drift in load as the plan steps
around them; a slowly changing machine moves both sides alike. Probe blocks are never adjacent:
between two blocks at least one counted plan step runs.

Role of deployed step ``i`` (``i`` counted from the first deployed step), defaults
``every=50, first=5, settle=1``::

    i:     0      1 ... 4   5       6      7      8 ... 54  55      56     57     58 ...
    role:  plan~  plan      probe~  probe  plan~  plan      probe~  probe  plan~  plan
           (~: settle step, not counted; probe: default clocks, counted)

The first probe comes a few steps after deployment, so the first check (``time_guard.py``) comes
within a dozen steps with a few plan steps to compare, not after ``every`` steps. With the
guard's patience of 3, a plan slow at every check is acted on at the third probe (deployed step
106 with the defaults).

Pure: the role is a function of the step index and the settings.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from perseus.errors import ConfigError
from perseus.runtime.config import PerseusConfig


class StepRole(enum.Enum):
    """What a deployed step is for, and whether it is counted in the A/B."""

    PLAN = "plan"  # planned clocks, counted
    PLAN_SETTLE = "plan_settle"  # planned clocks, first step(s) after a clock change: not counted
    PROBE_SETTLE = "probe_settle"  # default clocks, first step(s) of a probe: not counted
    PROBE = "probe"  # default clocks, counted

    @property
    def default_clocks(self) -> bool:
        """Runs at default clocks (the metrics file marks it ``"clocks": "default"``)."""
        return self in (StepRole.PROBE, StepRole.PROBE_SETTLE)

    @property
    def counted(self) -> bool:
        """Its time and energy enter the A/B (it was preceded by steps at its own clocks)."""
        return self in (StepRole.PLAN, StepRole.PROBE)


def clocks_label(role: StepRole) -> str:
    """The metrics file's ``"clocks"`` field: ``"default"`` for probe steps, ``"plan"`` otherwise."""
    return "default" if role.default_clocks else "plan"


@dataclass(frozen=True)
class ProbeSchedule:
    """Probe blocks of ``settle`` + 1 default-clock steps, one every ``every`` deployed steps.

    ``every = 0`` turns probes off (every step is a plan step after the first ``settle``).
    """

    every: int = 50
    first: int = 5
    settle: int = 1

    def __post_init__(self) -> None:
        if self.settle < 0:
            raise ConfigError(f"probe settle steps must be >= 0, got {self.settle}")
        if self.every < 0:
            raise ConfigError(f"probe_every_steps must be >= 0 (0 turns probes off), got {self.every}")
        if self.every and self.every < self.min_every(self.settle):
            raise ConfigError(
                f"probe_every_steps={self.every} leaves no counted plan step between probes; use 0 (off) or "
                f">= {self.min_every(self.settle)}"
            )
        if self.first < self.settle:
            raise ConfigError(f"the first probe (step {self.first}) must come after the {self.settle} settle step(s)")

    @classmethod
    def from_config(cls, config: PerseusConfig) -> ProbeSchedule:
        """Which deployed steps run at default clocks (``probe_every_steps``; 0: none)."""
        return cls(every=config.probe_every_steps)

    @staticmethod
    def min_every(settle: int) -> int:
        """Smallest period that keeps one counted plan step between blocks: probe block, plan settle, plan."""
        return 2 * settle + 2

    @property
    def enabled(self) -> bool:
        return self.every > 0

    @property
    def block(self) -> int:
        """Default-clock steps per probe."""
        return self.settle + 1

    @property
    def default_fraction(self) -> float:
        """Long-run fraction of deployed steps at default clocks: the probes' cost is this × the saving."""
        return self.block / self.every if self.enabled else 0.0

    def role(self, step: int) -> StepRole:
        """Role of deployed step ``step`` (0 = the first deployed step)."""
        if step < 0:
            raise ValueError(f"deployed step must be >= 0, got {step}")
        if step < self.settle:
            return StepRole.PLAN_SETTLE
        if not self.enabled or step < self.first:
            return StepRole.PLAN
        offset = (step - self.first) % self.every
        if offset < self.settle:
            return StepRole.PROBE_SETTLE
        if offset == self.settle:
            return StepRole.PROBE
        if offset < self.block + self.settle:
            return StepRole.PLAN_SETTLE
        return StepRole.PLAN

    def roles(self, steps: int) -> list[StepRole]:
        """Roles of deployed steps 0 .. steps − 1."""
        return [self.role(i) for i in range(steps)]
