"""The job's energy saving against default clocks, and every stage's, on every rank.

Why from the guard's rows: at each probe window's end every rank already all-gathers one row per
rank (its time verdict and its window's medians of plan-step and probe-step energy, beside its
stage: ``guard/closed_loop.py``). Every rank reads every stage's numbers from it, the one whose
writers log (Megatron's last rank, DeepSpeed's rank 0) included, with no message of its own and
nothing on the training thread beyond the sums.

Why the probes are the baseline: they are default-clock steps of the same run after warm-up,
interleaved with the plan's steps at random offsets and measured the same way (the GPU's time
where it runs behind the host), so start-up, a slow first iteration and a machine that drifts
over the run do not enter the comparison. A warm-up median includes them.

The accounting: a rank's plan and baseline energy per iteration are the means of its windows'
medians (over the windows it measured); a stage's are the sums over its ranks (every pipeline's
replica, every tensor-parallel rank), the job's the sums over its stages. A saving is
``1 − plan / baseline``, so the job's saving is the stages' savings weighted by their share of the
baseline energy. The job's 95 % interval: on the log ratio, the larger of the windows' own scatter
(robust: a MAD) and the ranks' step noise within a window, each over the square root of the
windows (``sequential.EnergyTest.estimate`` does the same for the guard's decision).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from statistics import median
from typing import Any, Protocol, Sequence

from perseus.output.wording import Z95
from perseus.runtime.guard.closed_loop import ENERGY_AT, STAGE_AT
from perseus.runtime.guard.sequential import MAD_TO_SD, RankEnergy, job_window

NOISE_FLOOR = 0.005  # the least relative noise of a step's energy assumed (the guard's energy test's)


class WindowSource(Protocol):
    """What the job's saving reads off the guard (``ClosedLoop``): windows ended, the last one's rows."""

    windows: int
    window_rows: list[list[float]]


@dataclass
class _Mean:
    """A running mean of a rank's window medians."""

    total: float = 0.0
    count: int = 0

    def add(self, value: float) -> None:
        self.total += value
        self.count += 1

    @property
    def value(self) -> float:
        return self.total / self.count


@dataclass
class _Rank:
    stage: int
    plan: _Mean = field(default_factory=_Mean)
    probe: _Mean = field(default_factory=_Mean)


@dataclass(frozen=True)
class StageSaving:
    """One stage over all its ranks: energy per iteration under the plan and at default clocks."""

    energy_j: float
    baseline_energy_j: float
    ranks: int

    @property
    def saving(self) -> float:
        return 1.0 - self.energy_j / self.baseline_energy_j


@dataclass(frozen=True)
class JobSavingFigure:
    """The job's saving against the probes with its 95 % interval, and every stage's numbers."""

    energy_j: float  # all GPUs' energy per plan iteration
    baseline_energy_j: float  # all GPUs' energy per default-clock (probe) iteration
    saving_low: float
    saving_high: float
    windows: int
    stages: dict[int, StageSaving]

    @property
    def saving(self) -> float:
        return 1.0 - self.energy_j / self.baseline_energy_j

    def as_dict(self) -> dict[str, Any]:
        return {"saving": self.saving, "saving_low": self.saving_low, "saving_high": self.saving_high,
                "energy_j": self.energy_j, "baseline_energy_j": self.baseline_energy_j, "windows": self.windows,
                "baseline": "default-clock probes",
                "stages": {str(s): {"energy_j": v.energy_j, "baseline_energy_j": v.baseline_energy_j,
                                    "saving": v.saving, "ranks": v.ranks} for s, v in sorted(self.stages.items())}}


class JobSaving:
    """Accumulates the guard's windows into the job's and every stage's saving (module docstring)."""

    def __init__(self) -> None:
        self._ranks: dict[int, _Rank] = {}  # by position in the gathered rows (rank order)
        self._logs: list[tuple[float, float]] = []  # per window: the job's log ratio, its standard error
        self._seen = 0  # the guard's windows taken
        self.figure: JobSavingFigure | None = None

    def follow(self, source: WindowSource) -> bool:
        """Take the guard's last window if it is new; True when the figure changed."""
        if source.windows == self._seen:
            return False
        self._seen = source.windows
        return self.add_window(source.window_rows)

    def add_window(self, rows: Sequence[Sequence[float]]) -> bool:
        """One window's gathered rows (rank order); True when the figure changed. A rank without
        energy evidence in the window (unmeasured, fallen back) adds nothing; rows without a stage
        column (a plane that does not send it) are left out."""
        measured = []
        for index, row in enumerate(rows):
            energy = RankEnergy.from_row(row[ENERGY_AT:]) if len(row) > STAGE_AT else None
            if energy is None:
                continue
            rank = self._ranks.setdefault(index, _Rank(int(row[STAGE_AT])))
            rank.plan.add(energy.plan_j)
            rank.probe.add(energy.probe_j)
            measured.append(energy)
        window = job_window(measured)
        if window is None:
            return False
        noise = max(NOISE_FLOOR, window.spread or 0.0)
        self._logs.append((window.log_ratio, noise * math.sqrt(1 / window.n_plan + 1 / window.n_probe)))
        self.figure = self._figure()
        return True

    def _figure(self) -> JobSavingFigure:
        stages: dict[int, StageSaving] = {}
        for rank in self._ranks.values():
            was = stages.get(rank.stage, StageSaving(0.0, 0.0, 0))
            stages[rank.stage] = StageSaving(was.energy_j + rank.plan.value,
                                             was.baseline_energy_j + rank.probe.value, was.ranks + 1)
        plan = sum(s.energy_j for s in stages.values())
        probe = sum(s.baseline_energy_j for s in stages.values())
        centre = math.log(plan / probe)
        m = len(self._logs)
        se = median(s for _, s in self._logs) / math.sqrt(m)
        if m >= 3:
            se = max(se, MAD_TO_SD * median(abs(x - centre) for x, _ in self._logs) / math.sqrt(m))
        low, high = 1 - math.exp(centre + Z95 * se), 1 - math.exp(centre - Z95 * se)
        return JobSavingFigure(plan, probe, low, high, m, stages)
