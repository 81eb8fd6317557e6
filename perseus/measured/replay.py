"""Replaying measured runs: each instruction's time and each stage's power as one workload measured them.

Why: the simulated GPU's equations have the shape of real cards, not a real run's numbers. A replay
gives the simulated GPU of stage ``s`` what the GPU of stage ``s`` measured:

- an instruction's time at a clock is one measured instance of its (stage, kind, clock), drawn at
  random (seeded by the caller): every microbatch of every iteration after the first of every
  schedule that ran it, so the spread between instances and the stalls are the measured ones. A
  clock the runs never measured for that (stage, kind) takes the table's median there (``table``:
  linear between measured clocks, 1/clock below them) and the spread of the nearest measured clock;
- the power while it computes is its stage's fitted curve (``power``), held at the curve's end
  beyond the clocks the fit saw (a quadratic extrapolated below them is not a measurement), and
  P_blocking is the fitted one;
- the clocks on offer are the measured range, on the grid the runs used.

``time_scale`` shortens every time (a demo on a CPU runs a 100 ms forward in 10 ms); power is not
scaled, so energy scales with time. Pure computation (numpy, scipy); loading one directory takes
a fraction of a second and is cached per process.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from perseus.errors import ConfigError, ProfileError
from perseus.measured.power import PowerFit, fit_power
from perseus.measured.runs import Workload, read_workload
from perseus.measured.table import KINDS, TableKey, TimeTable, _samples, build_time_table


@dataclass(frozen=True, eq=False)
class ReplaySource:
    """One workload's measured times, power curves and P_blocking, times scaled by ``time_scale``."""

    workload: Workload = field(repr=False)
    table: TimeTable = field(repr=False)
    power: PowerFit = field(repr=False)
    time_scale: float = 1.0
    _ratios: dict[TableKey, np.ndarray] = field(default_factory=dict, init=False, repr=False)  # filled as drawn

    @property
    def path(self) -> Path:
        return self.workload.path

    @property
    def model(self) -> str:
        """The model the runs trained (``gpt3-xl``)."""
        return self.workload.shape.model

    @property
    def stages(self) -> int:
        return self.workload.stages

    @property
    def p_blocking_w(self) -> float:
        return self.power.p_blocking_w

    @property
    def max_clock_mhz(self) -> int:
        return self.workload.max_clock_mhz

    @functools.cached_property
    def clocks_mhz(self) -> tuple[int, ...]:
        """Ascending: the lowest measured clock to the highest, on the grid the measured clocks share."""
        measured = sorted({c for _, _, c in self.table.entries})
        low, high = measured[0], self.max_clock_mhz
        step = math.gcd(*(c - low for c in measured + [high])) or 1
        return tuple(range(low, high + 1, step))

    def time_s(self, stage: int, kind: str, clock_mhz: int) -> float:
        """The (stage, kind, clock)'s median, scaled."""
        return self.time_scale * self.table.time_s(stage, kind, clock_mhz)

    def draw_s(self, stage: int, kind: str, clock_mhz: int, rng: np.random.Generator) -> float:
        """One instruction's time: a measured instance's ratio to its median × ``time_s``."""
        ratios = self._instance_ratios(stage, kind, clock_mhz)
        return self.time_s(stage, kind, clock_mhz) * float(ratios[rng.integers(len(ratios))])

    def slowdown(self, stage: int, clock_mhz: int) -> float:
        """The stage's time at the clock over its time at the max clock, forward and backward together."""
        top = self.max_clock_mhz
        return (sum(self.table.time_s(stage, k, clock_mhz) for k in KINDS)
                / sum(self.table.time_s(stage, k, top) for k in KINDS))

    def power_w(self, stage: int, clock_mhz: int) -> float:
        """The stage's power while computing: its curve, held at its ends beyond the clocks it was fitted on."""
        curve = self.power.curves[stage]
        return float(curve.power_w(min(max(clock_mhz, curve.low_mhz), curve.high_mhz)))

    def _instance_ratios(self, stage: int, kind: str, clock_mhz: int) -> np.ndarray:
        clocks = self.table.clocks(stage, kind)
        if not clocks:
            raise KeyError(f"no {kind} of stage {stage} was measured")
        nearest = min(clocks, key=lambda c: (abs(c - clock_mhz), c))
        key = (stage, kind, nearest)
        found = self._ratios.get(key)
        if found is None:
            values = np.concatenate([v for _, v, _ in _samples(self.workload)[key]])
            found = self._ratios[key] = values / self.table.entries[key].median_s
        return found


@functools.lru_cache(maxsize=8)
def _measured(directory: str) -> tuple[Workload, TimeTable, PowerFit]:
    workload = read_workload(directory)
    table = build_time_table(workload)
    missing = [f"stage {s} {k}" for s in range(workload.stages) for k in KINDS if not table.clocks(s, k)]
    if missing:
        raise ProfileError(f"{workload.path}: no measured time for {', '.join(missing)}; a replay needs every "
                           "stage's forward and backward")
    return workload, table, fit_power(workload, table)


def load_replay(directory: str | Path, time_scale: float = 1.0) -> ReplaySource:
    """The replay of one workload directory (the artifact's layout: ``perseus.measured.runs``).

    A malformed directory is one ``ProfileError`` line naming it and the problem."""
    if isinstance(time_scale, bool) or not (isinstance(time_scale, (int, float)) and math.isfinite(time_scale) and time_scale > 0):
        raise ConfigError(f"replay time_scale must be a positive number (0.1: ten times faster), got {time_scale!r}")
    workload, table, power = _measured(str(Path(directory).expanduser().resolve()))
    return ReplaySource(workload, table, power, float(time_scale))
