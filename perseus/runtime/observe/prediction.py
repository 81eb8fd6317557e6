"""The deployed plan's prediction checked against what the GPU measured in the same run.

Why ratios: the frontier is planned on the profile's own scale, so its absolute seconds and joules
need not match this run's; what it promises is relative to its all-max baseline (or, under a power
cap, to the point the probes run). The probes run default clocks (about all-max) in the same run,
so ``measured = median(plan steps) / median(probe steps)`` is the like-for-like figure.

Time is this rank's (a pipeline's ranks share its step time); energy is the job's where the guard's
energy test has summed every rank's medians (the frontier's energy is the job's), else this rank's
when it is the whole job, else unknown.

Both are the job's iteration, non-compute time included (``StagePlan.non_compute``: the data, the
exchanges and the optimizer outside the instructions, the same in plan and probe steps). The
prediction adds it to the point and to its baseline, energy at its power; the measured energy is
the whole step's already; the measured time is the instructions' span (what the A/B and the guard
judge), lifted to the iteration by the same constant. Without it a plan that slows the
instructions by x would be predicted to slow the job by x, which it does not.
"""

from __future__ import annotations

import logging
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from perseus.planner.stage_plan import StagePlan, StagePoint
    from perseus.runtime.guard.ab import ABFigure
    from perseus.runtime.guard.sequential import EnergyVerdict

log = logging.getLogger("perseus.runtime")

# Bounds of |measured - predicted| (ratio points) past which the profile no longer describes the
# workload: measured A100 runs put the model within 0.15-1.2 % when it does, and a step's time is
# steadier than its energy (the energy counter's update period, power noise), hence the wider bound.
TIME_BOUND = 0.03
ENERGY_BOUND = 0.05
FIELDS = ("predicted_slowdown", "measured_slowdown", "predicted_energy_ratio", "measured_energy_ratio")


@dataclass(frozen=True)
class PredictionCheck:
    """Predicted and measured ratios of the deployed point to the probes' baseline (None: unknown)."""

    predicted_slowdown: float
    measured_slowdown: float | None
    predicted_energy_ratio: float
    measured_energy_ratio: float | None

    @property
    def time_error(self) -> float | None:
        return None if self.measured_slowdown is None else self.measured_slowdown - self.predicted_slowdown

    @property
    def energy_error(self) -> float | None:
        m = self.measured_energy_ratio
        return None if m is None else m - self.predicted_energy_ratio

    def fields(self) -> dict[str, float | None]:
        """The four ``StepMetrics`` fields (``metrics.PREDICTION_FIELDS``)."""
        return asdict(self)

    def as_dict(self) -> dict[str, float | None]:
        return {**asdict(self), "time_error": self.time_error, "energy_error": self.energy_error}

    def beyond(self) -> list[str]:
        """The figures past their bound, in words (empty: within)."""
        out = []
        if (t := self.time_error) is not None and abs(t) > TIME_BOUND:
            out.append(f"time {100 * t:+.1f} points (bound {100 * TIME_BOUND:g})")
        if (e := self.energy_error) is not None and abs(e) > ENERGY_BOUND:
            out.append(f"energy {100 * e:+.1f} points (bound {100 * ENERGY_BOUND:g})")
        return out


def predict(plan: StagePlan, point: StagePoint, reference: StagePoint | None, run: ABFigure | None,
            job_energy: EnergyVerdict | None, whole_job: bool) -> PredictionCheck:
    """The check for ``point`` (``reference``: where probes run, None for default clocks ≈ all-max);
    ``run``: this rank's same-run A/B; ``job_energy``: the guard's job-wide energy test."""
    outside_s, outside_j = plan.non_compute.time_s, plan.non_compute_energy_j()
    base_t = (reference.time_s if reference is not None else plan.baseline_time_s) + outside_s
    base_e = (reference.energy_j if reference is not None else plan.baseline_energy_j) + outside_j
    measured_e = None
    if job_energy is not None and job_energy.windows > 0:
        measured_e = 1.0 - job_energy.saving
    elif whole_job and run is not None:
        measured_e = 1.0 - run.saving
    measured_t = None if run is None else 1.0 + run.time_change * (base_t - outside_s) / base_t
    return PredictionCheck((point.time_s + outside_s) / base_t, measured_t, (point.energy_j + outside_j) / base_e,
                           measured_e)


def text(check: PredictionCheck | dict[str, float | None] | None) -> str:
    """``slowdown x1.020 predicted, x1.031 measured (+1.1 pts); energy x0.880 / x0.910 (+3.0 pts)``."""
    if check is None:
        return "n/a"
    d = check.as_dict() if isinstance(check, PredictionCheck) else check

    def pair(p: str, m: str, err: str) -> str:
        measured = d.get(m)
        if measured is None:
            return f"x{d[p]:.3f} predicted, not measured yet"
        return f"x{d[p]:.3f} predicted, x{measured:.3f} measured ({100 * (d.get(err) or 0.0):+.1f} pts)"

    return (f"slowdown {pair('predicted_slowdown', 'measured_slowdown', 'time_error')}; "
            f"energy {pair('predicted_energy_ratio', 'measured_energy_ratio', 'energy_error')}")


class PredictionWatch:
    """Keeps the last check and warns once when it is past a bound (``reprofile``: what to do)."""

    def __init__(self) -> None:
        self.last: PredictionCheck | None = None
        self.warned = False
        self.windows = 0  # guard windows seen: the warning waits for a window's evidence

    def observe(self, check: PredictionCheck, windows: int, reprofile: str) -> bool:
        """Keep ``check``; after a new guard window, warn (once per run) if it is past a bound."""
        self.last = check
        new_window, self.windows = windows > self.windows, max(windows, self.windows)
        beyond = check.beyond()
        if not new_window or not beyond or self.warned:
            return new_window
        self.warned = True
        log.warning("perseus: the profile mispredicts the deployed plan (%s): %s; re-profile: %s",
                    ", ".join(beyond), text(check), reprofile)
        return new_window
