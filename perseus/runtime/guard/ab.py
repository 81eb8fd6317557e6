"""The same-run A/B: plan steps against default-clock probe steps, with its spread; and how a
per-step log line says which figure it shows.

Why medians and a robust spread: on a shared machine (or a node with a noisy neighbour) a few
steps are much slower than the rest; a mean would move with them, a median does not. The spread
is a robust standard error of the ratio of the two medians: each side's deviations from its own
median, relative to it, are pooled (plan and probe steps see the same noise; probes are few, so
their own spread alone would be a poor estimate), their MAD scaled to a standard deviation
(× 1.4826, exact for normal noise) and combined as ``s · sqrt(1/n_plan + 1/n_probe)``. With one
probe the spread comes from the plan steps alone; with one sample in all it is unknown (None).

Log wording: the line shows the *run's* figure (median of the counted plan steps so far against
the probes' median) with its 95 % interval, and says "not yet measurable" while the interval spans
zero. A negative saving reads "X % more energy", never "saving −X %" (the wording is
``perseus.output.wording``'s, shared with ``perseus report``). ``step_figure`` (one step against
the probes) stays in the metrics file's ``saving_vs_probes``, not in the log.
"""

from __future__ import annotations

from dataclasses import dataclass
from math import sqrt
from statistics import median
from typing import Sequence

from perseus.output.wording import measured_saving_phrase, measured_time_phrase

MAD_TO_SD = 1.4826  # MAD × this = standard deviation, for normal noise


@dataclass(frozen=True)
class Ratio:
    """median(plan) / median(probe), with a robust standard error (None when unknown)."""

    value: float
    stderr: float | None
    n_plan: int
    n_probe: int


def relative_spread(*samples: Sequence[float]) -> float | None:
    """Pooled robust relative standard deviation of samples, each about its own median.

    Only samples of two or more values count: one value is its own median and would pull the
    pooled spread towards zero."""
    deviations = [abs(x / m - 1.0) for s in samples if len(s) >= 2 and (m := median(s)) > 0 for x in s]
    if len(deviations) < 2:
        return None
    return MAD_TO_SD * median(deviations)


def median_ratio(plan: Sequence[float], probe: Sequence[float]) -> Ratio:
    """Ratio of medians plan / probe with its robust standard error (module docstring)."""
    if not plan or not probe:
        raise ValueError("median_ratio needs at least one plan and one probe sample")
    base = median(probe)
    if base <= 0:
        raise ValueError(f"probe median must be positive, got {base}")
    value = median(plan) / base
    spread = relative_spread(plan, probe)
    stderr = None if spread is None else value * spread * sqrt(1 / len(plan) + 1 / len(probe))
    return Ratio(value, stderr, len(plan), len(probe))


@dataclass(frozen=True)
class ABFigure:
    """Energy saving and time change of the plan against the same run's default-clock probes."""

    saving: float  # 1 − plan energy / probe energy (negative: more energy)
    saving_stderr: float | None
    time_change: float  # plan time / probe time − 1 (positive: slower)
    time_stderr: float | None
    n_plan: int
    n_probe: int


def ab_figure(plan_time_s: Sequence[float], plan_energy_j: Sequence[float],
              probe_time_s: Sequence[float], probe_energy_j: Sequence[float]) -> ABFigure:
    """The run's A/B from counted plan and probe steps (medians, robust spread)."""
    energy = median_ratio(plan_energy_j, probe_energy_j)
    time = median_ratio(plan_time_s, probe_time_s)
    return ABFigure(1.0 - energy.value, energy.stderr, time.value - 1.0, time.stderr, energy.n_plan, energy.n_probe)


def step_figure(time_s: float, energy_j: float, probe_time_s: Sequence[float], probe_energy_j: Sequence[float]) -> ABFigure:
    """One step against the probes' medians (its spread is the probes' own, when there are two or more)."""
    return ab_figure([time_s], [energy_j], probe_time_s, probe_energy_j)


def energy_text(energy_j: float | None) -> str:
    """A step's energy in a log line: ``energy 780.00 J``, or ``energy unmeasured`` (the counter's
    reads failed over the step: no number rather than a wrong one)."""
    return "energy unmeasured" if energy_j is None else f"energy {energy_j:.2f} J"


def step_line(step: int, phase: str, time_s: float, energy_j: float | None, clocks: str, run: ABFigure | None) -> str:
    """The rank-0 per-step log line: the step's own time and energy, and the run's A/B with its 95 %
    interval ("not yet measurable" while it spans zero). One step is never compared with one probe
    in a log line: on a loaded machine that figure is mostly noise (issue 34).

    ``perseus step 60 [deployed, plan clocks], time 1869.0 ms, energy 780.00 J; run (median of 40
    plan steps vs 4 probes): saves 5.1% ± 0.8% energy (95 % interval +3.5..+6.7% saved), time change
    not yet measurable (-0.8..+1.2% time, 95 % interval)``
    """
    line = f"perseus step {step} [{phase}, {clocks} clocks], time {1e3 * time_s:.1f} ms, {energy_text(energy_j)}"
    if run is not None:
        line += (f"; run (median of {run.n_plan} plan steps vs {run.n_probe} probe"
                 f"{'s' if run.n_probe != 1 else ''}): {measured_saving_phrase(run.saving, run.saving_stderr)}, "
                 f"{measured_time_phrase(run.time_change, run.time_stderr)}")
    return line
