"""One power curve per stage, and P_blocking, fitted on measured iteration energy.

No run measured an instruction's energy, only each rank's energy counter over an iteration. So per
rank: iteration energy = Σ over its forwards and backwards of P_stage(clock) × time + P_blocking ×
(iteration time − compute time). With P_stage quadratic in the clock that is linear in the unknowns
(three per stage, one P_blocking per workload), fitted by least squares over every (schedule, rank).

Why one curve shared by forward and backward: on the artifact's A100 runs separate curves fit the
energies no better and come out negative or above 2 kW: iteration energy does not identify the split.

Why constrained: a stage that ran mostly at two clocks leaves the middle of a free quadratic
unpinned, and a free fit dips to a few tens of watts there, which a planner then exploits. So the
curve may not fall below P_blocking anywhere in the measured range (a computing GPU draws at least
what a waiting one does) and must rise with the clock up to the stage's sustained clock (the
lowest clock past which its instructions run no more than ``SUSTAIN_TOLERANCE`` faster): above it
the card is at its power cap, no faster, and its power may level off or ease.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable

import numpy as np
from scipy.optimize import minimize

from perseus.errors import ProfileError
from perseus.measured.runs import Workload
from perseus.measured.table import KINDS, TimeTable

CENTER_GHZ = 1.2  # the curve is a + b·x + c·x², x = clock (GHz) − CENTER_GHZ: keeps the fit well scaled
SUSTAIN_TOLERANCE = 0.01  # a clock still buys speed while its instructions run > 1 % slower than the fastest
GRID = 9  # clocks across the measured range at which the floor is enforced


@dataclass(frozen=True)
class PowerCurve:
    """One stage's power while computing, as a function of the SM clock."""

    coefficients: tuple[float, float, float]  # a, b, c of a + b·x + c·x², x = clock GHz − CENTER_GHZ
    low_mhz: int  # the measured range the fit saw
    high_mhz: int
    sustained_mhz: int

    def power_w(self, clock_mhz: float | np.ndarray) -> np.ndarray:
        x = np.asarray(clock_mhz, dtype=float) / 1000.0 - CENTER_GHZ
        a, b, c = self.coefficients
        return np.asarray(a + b * x + c * x * x)


@dataclass(frozen=True)
class PowerFit:
    """Every stage's curve, P_blocking, and the fit's own relative residual per (schedule, rank)."""

    curves: tuple[PowerCurve, ...]
    p_blocking_w: float
    residuals: np.ndarray  # (rows,) fitted / measured − 1, in-sample

    def power_w(self, stage: int, clock_mhz: float | np.ndarray) -> np.ndarray:
        return self.curves[stage].power_w(clock_mhz)


def _features(times: np.ndarray, clocks: np.ndarray) -> np.ndarray:
    x = clocks / 1000.0 - CENTER_GHZ
    return np.array([times.sum(), (times * x).sum(), (times * x * x).sum()])


def fit_power(workload: Workload, table: TimeTable, exclude: Iterable[int] = ()) -> PowerFit:
    """Fit on every run of ``workload`` except the positions in ``exclude``; ``table`` built likewise."""
    skip = set(exclude)
    stages = workload.stages
    rows, targets = [], []
    for i, run in enumerate(workload.runs):
        if i in skip:
            continue
        for stage, rank in enumerate(run.ranks):
            row = np.zeros(3 * stages + 1)
            busy = 0.0
            for kind in KINDS:
                times = rank.instance_medians(kind)
                row[3 * stage: 3 * stage + 3] += _features(times, rank.clocks(kind).astype(float))
                busy += float(times.sum())
            row[-1] = float(np.median(rank.iter_time_s[1:])) - busy
            rows.append(row)
            targets.append(float(np.median(rank.iter_energy_j[1:])))
    A, y = np.array(rows), np.array(targets)
    if len(rows) < A.shape[1]:
        raise ProfileError(f"{workload.path}: {len(rows) // stages} schedules are too few to fit "
                           f"{stages} power curves and P_blocking")

    curves_range = []
    constraints = []
    for stage in range(stages):
        clocks = sorted({c for kind in KINDS for c in table.clocks(stage, kind)})
        low, high, sustained = clocks[0], clocks[-1], table.sustained_mhz(stage, SUSTAIN_TOLERANCE)
        curves_range.append((low, high, sustained))
        for clock in np.linspace(low, high, GRID):  # P(clock) − P_blocking ≥ 0
            x = clock / 1000.0 - CENTER_GHZ
            g = np.zeros(A.shape[1])
            g[3 * stage: 3 * stage + 3] = (1.0, x, x * x)
            g[-1] = -1.0
            constraints.append(g)
        for clock in (low, sustained):  # P'(clock) ≥ 0 at both ends: rising on [low, sustained]
            x = clock / 1000.0 - CENTER_GHZ
            g = np.zeros(A.shape[1])
            g[3 * stage + 1: 3 * stage + 3] = (1.0, 2 * x)
            constraints.append(g)
    floor = np.zeros(A.shape[1])
    floor[-1] = 1.0  # P_blocking ≥ 0
    constraints.append(floor)

    scale = np.abs(A).max(axis=0)
    scale[scale == 0] = 1.0
    y_scale = float(np.abs(y).max())
    As, ys, G = A / scale, y / y_scale, np.array(constraints) / scale
    start = np.linalg.lstsq(As, ys, rcond=None)[0]
    result = minimize(
        lambda p: 0.5 * float(np.sum((As @ p - ys) ** 2)), start, jac=lambda p: As.T @ (As @ p - ys),
        constraints=[{"type": "ineq", "fun": lambda p: G @ p, "jac": lambda p: G}],
        method="SLSQP", options={"maxiter": 1000, "ftol": 1e-15},
    )
    if not result.success:
        raise ProfileError(f"{workload.path}: the power fit did not converge ({result.message})")
    params = result.x / scale * y_scale
    curves = tuple(
        PowerCurve((float(params[3 * s]), float(params[3 * s + 1]), float(params[3 * s + 2])), lo, hi, sus)
        for s, (lo, hi, sus) in enumerate(curves_range)
    )
    return PowerFit(curves, float(params[-1]), A @ params / y - 1)
