"""Each iteration's non-compute time: the part of the job's iteration the instruction DAG leaves out.

Why: a frontier's times are critical paths of the instructions, but the job's iteration also loads
data, exchanges between stages outside the instructions and steps the optimizer. Against real
measured A100 runs the critical path ran 1.5–6.8 % short of the iteration; one constant per
iteration, taken from the all-max run, brought the time error to 0.02–1.2 % (``perseus.measured``).
The constant changes no plan's rank (every plan gets the same time and energy added) but it
changes what a slowdown and a saving mean to the job: with O seconds of it,

    slowdown = (t + O) / (T_max + O) − 1,  energy = e + O × power × stages,

so a target of "at most +X % slowdown" lets a plan's own time grow to (1 + X)(T_max + O) − O, and
a saving is a share of the iteration's energy, the non-compute energy included.

Where it comes from: the runtime takes the shortest warm-up step at default clocks less its
instructions' span (``runtime.supply.plan_supply``), the same steps the planner's hand-off is
calibrated on; ``from_measured_iteration`` takes a measured all-max iteration less the plan's
all-max time (``perseus plan --measured-iteration``, the artifact's runs in ``perseus.measured``).
Read too long it would let a slowdown target spend time the job does not have, so both take a
shortest step, never a median, and a model longer than the measurement gives none.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from perseus.errors import FrontierError


@dataclass(frozen=True)
class NonCompute:
    """``time_s`` per iteration outside the instructions, on every stage at ``power_w`` per GPU
    (None: the frontier's P_blocking); ``source`` says where it was measured."""

    time_s: float = 0.0
    power_w: float | None = None
    source: str = ""

    def __post_init__(self) -> None:
        if not (math.isfinite(self.time_s) and self.time_s >= 0):
            raise FrontierError(f"non-compute time is seconds >= 0 per iteration, got {self.time_s!r}")
        if self.power_w is not None and not (math.isfinite(self.power_w) and self.power_w >= 0):
            raise FrontierError(f"non-compute power is watts >= 0 (or null for P_blocking), got {self.power_w!r}")

    def __bool__(self) -> bool:
        return self.time_s > 0

    def energy_j(self, p_blocking_w: float, stages: int) -> float:
        """The iteration's non-compute energy, every stage's GPU at its power."""
        return self.time_s * (p_blocking_w if self.power_w is None else self.power_w) * stages

    def slowdown(self, time_s: float, baseline_time_s: float) -> float:
        """The job's slowdown of a plan of ``time_s`` against the all-max plan (a fraction)."""
        return (time_s + self.time_s) / (baseline_time_s + self.time_s) - 1.0

    def saving(self, energy_j: float, baseline_energy_j: float, p_blocking_w: float, stages: int) -> float:
        """The job's energy saving of a plan of ``energy_j`` against the all-max plan (a fraction)."""
        extra = self.energy_j(p_blocking_w, stages)
        return 1.0 - (energy_j + extra) / (baseline_energy_j + extra)

    def time_budget_s(self, baseline_time_s: float, max_slowdown: float) -> float:
        """The longest plan time whose job slowdown is at most ``max_slowdown`` (0.05: +5 %)."""
        if not (math.isfinite(max_slowdown) and max_slowdown >= 0):
            raise FrontierError(f"a slowdown target is a fraction >= 0 (0.05 for +5 %), got {max_slowdown!r}")
        return (1.0 + max_slowdown) * (baseline_time_s + self.time_s) - self.time_s

    def as_json(self) -> dict[str, Any]:
        """The frontier file's ``non_compute`` object (docs/frontier-format.md)."""
        return {"time_s": self.time_s, "power_w": self.power_w, "source": self.source}

    @classmethod
    def from_json(cls, data: Any) -> NonCompute:
        """The ``non_compute`` object of a frontier file; absent (None): none."""
        if data is None:
            return NO_NON_COMPUTE
        if not isinstance(data, dict):
            raise FrontierError(f"\"non_compute\" must be an object with time_s, power_w and source, not {data!r}")
        power = data.get("power_w")
        return cls(float(data["time_s"]), None if power is None else float(power), str(data.get("source", "")))


NO_NON_COMPUTE = NonCompute()


def from_measured_iteration(measured_s: float, baseline_time_s: float, power_w: float | None = None,
                            source: str = "") -> NonCompute:
    """The non-compute time of a job whose all-max iteration measured ``measured_s`` against a plan
    whose all-max time is ``baseline_time_s`` (none when the plan is that long or longer: a
    pessimistic profile is not non-compute time)."""
    if not (math.isfinite(measured_s) and measured_s > 0):
        raise FrontierError(f"a measured iteration is seconds > 0, got {measured_s!r}")
    return NonCompute(max(measured_s - baseline_time_s, 0.0), power_w, source)
