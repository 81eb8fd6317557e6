"""How far a counter regression's powers can be believed: one power for a stage's instructions
unless the data identify a split, and none outside what the card can draw.

Why: from the energy of 1F1B steps the forward/backward split is usually not identifiable. The
measured A100 runs of the Perseus artifact fit iteration energy no better with separate forward
and backward power curves than with one per stage, and the separate ones came out negative or
above 2 kW; on a real H200 the regression gave forward +23 %. So the instruction kinds of a stage
(``members``) share one power, fitted with their columns merged (the time-proportional split of
their energy), unless a Wald test rejects "one power" at ``SPLIT_LEVEL`` (two kinds: their powers
differ by more than ~2 standard errors of the difference); then each keeps its own. All or
nothing, not a partial shrink, so the stage's fitted energy is the same either way.

Intervals far off the fit (``inliers``) are left out first: a counter's glitch, or an instruction
span that held GPU idle, would otherwise move every power. Then no power may leave [P_blocking, the power limit]: a GPU running work draws at least its idle
power and at most its limit. The fit is redone under those bounds (a bounded least squares: the
other columns take up what a clamped one cannot), and each clamped column is reported.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

SPLIT_LEVEL = 0.95  # the confidence at which a split of the members' powers counts as identified
# An interval this many robust σ off the fit is left out: the counter's glitch, or an instruction
# whose span held GPU idle (a host stalled mid-instruction), not noise to average over.
OUTLIER_SIGMAS = 5.0
MAD_SIGMA = 1.4826
TRIM = 0.05  # the share of intervals a window's score leaves out (``trimmed_sigma``)


@dataclass(frozen=True)
class LinearFit:
    """Unconstrained least squares: each column's power, their covariance, and σ of one interval's
    residual (J; NaN without degrees of freedom)."""

    power_w: np.ndarray
    cov: np.ndarray
    sigma_j: float

    @property
    def stderr_w(self) -> np.ndarray:
        return np.sqrt(np.clip(np.diag(self.cov), 0.0, None))


@dataclass(frozen=True)
class SplitTest:
    """The Wald test of "the members share one power": its statistic and the threshold it beat
    (``identified``) or not."""

    statistic: float
    threshold: float

    @property
    def identified(self) -> bool:
        return self.statistic > self.threshold


def inliers(a: np.ndarray, y: np.ndarray) -> np.ndarray:
    """The rows within ``OUTLIER_SIGMAS`` robust σ (1.4826 × the residuals' MAD) of the least-squares
    fit (all of them where leaving some out would leave too few to fit, or a column without rows)."""
    p, *_ = np.linalg.lstsq(a, y, rcond=None)
    resid = y - a @ p
    floor = 1e-6 * float(np.median(np.abs(y))) if len(y) else 0.0
    sigma = max(MAD_SIGMA * float(np.median(np.abs(resid - np.median(resid)))), floor)
    keep = np.abs(resid) <= OUTLIER_SIGMAS * sigma
    enough = keep.sum() > a.shape[1] + 1 and np.all((a[keep] != 0).any(axis=0) | ~(a != 0).any(axis=0))
    return keep if enough else np.ones(len(y), dtype=bool)


def trimmed_sigma(a: np.ndarray, y: np.ndarray, keep: np.ndarray) -> float:
    """σ of one row's residual from the fit over ``keep``, all rows but the ``TRIM`` share (at least
    one) furthest off: a score that compares designs of the same rows fairly, whatever each one's
    outliers (NaN without degrees of freedom)."""
    p, *_ = np.linalg.lstsq(a[keep], y[keep], rcond=None)
    resid = np.sort(np.abs(y - a @ p))
    n = len(resid) - max(1, math.ceil(TRIM * len(resid)))
    dof = n - a.shape[1]
    return math.sqrt(float(resid[:n] @ resid[:n]) / dof) if dof > 0 else math.nan


def least_squares(a: np.ndarray, y: np.ndarray) -> LinearFit:
    p, *_ = np.linalg.lstsq(a, y, rcond=None)
    resid = y - a @ p
    dof = a.shape[0] - a.shape[1]
    sigma2 = float(resid @ resid) / dof if dof > 0 else math.nan
    return LinearFit(p, sigma2 * np.linalg.pinv(a.T @ a), math.sqrt(sigma2) if dof > 0 else math.nan)


def split_test(fit: LinearFit, members: Sequence[int]) -> SplitTest:
    """Wald test that the ``members`` columns have one power: d = (p_m − p_m0 for the others),
    W = dᵀ cov(d)⁻¹ d against the χ² quantile at ``SPLIT_LEVEL`` (m − 1 degrees of freedom).
    An unknown covariance (no degrees of freedom left) identifies nothing."""
    from scipy.stats import chi2

    m = len(members)
    threshold = float(chi2.ppf(SPLIT_LEVEL, max(m - 1, 1)))
    if m < 2 or not np.all(np.isfinite(fit.cov)):
        return SplitTest(0.0, threshold)
    c = np.zeros((m - 1, len(fit.power_w)))
    for row, j in enumerate(members[1:]):
        c[row, members[0]], c[row, j] = -1.0, 1.0
    d = c @ fit.power_w
    stat = float(d @ np.linalg.pinv(c @ fit.cov @ c.T) @ d)
    return SplitTest(stat, threshold)


def merge(a: np.ndarray, members: Sequence[int]) -> tuple[np.ndarray, list[int]]:
    """``a`` with the ``members`` columns summed into the first of them and the others dropped;
    and, for each original column, its column in the merged matrix."""
    keep = [j for j in range(a.shape[1]) if j not in members[1:]]
    merged = a[:, keep].copy()
    first = keep.index(members[0])
    merged[:, first] = a[:, list(members)].sum(axis=1)
    where = [first if j in members else keep.index(j) for j in range(a.shape[1])]
    return merged, where


def bounded(a: np.ndarray, y: np.ndarray, lo: np.ndarray, hi: np.ndarray, start: np.ndarray) -> np.ndarray:
    """Least squares with each power in [lo, hi]; ``start`` (the unconstrained fit) where it is
    already inside."""
    if np.all((start >= lo) & (start <= hi)):
        return start
    from scipy.optimize import lsq_linear

    return np.asarray(lsq_linear(a, y, bounds=(lo, hi), method="bvls").x)
