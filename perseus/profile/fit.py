"""Trusting measured clocks: robust per-clock statistics, a time that never falls as the clock
drops, pessimistic planning times, and interpolation between measured clocks.

Why: profiling runs during real training, beside whatever else the node does. One slow iteration
(the first after a clock change, a descheduled process) or a noisy clock can make a lower clock
look *faster* than the max clock, and a plan built on that runs slower than default clocks. So:

- per clock, outliers are dropped by a median/MAD rule and the spread is kept (``robust_stats``);
- time is fitted non-increasing in clock (weighted isotonic regression, pool-adjacent-violators:
  ``isotonic_times``), and how far each point was from the fit is recorded;
- the planner gets a pessimistic time, the fit plus ``k`` standard errors below the max clock
  (``pessimistic_times``): noise can make a plan save a little less, never run slower; plus the
  per-instance spread a clock adds over the max clock's (``spread_k`` of it): a step waits for the
  slowest of its chains, so an instruction whose every run varies more at a low clock costs
  more slack than its mean shows (a clock that stretches host noise, as the simulated GPU does);
- clocks between measured ones come from a two-point physical model (time ``a/f + b``: a
  compute-bound part ∝ 1/f and a memory-bound part; power linear in f), used only where it
  predicts the measured neighbours within their noise (``loo_errors``).

Pure numpy, no torch: the planner side and tests use it anywhere.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

import numpy as np

MAD_SIGMA = 1.4826  # MAD → standard deviation for normal noise
MEDIAN_SE = 1.2533  # standard error of a median = 1.2533 σ / √n
OUTLIER_MADS = 3.5  # a sample further than this many robust σ from the median is an outlier
INTERP_FLOOR = 0.005  # interpolation must be within the noise, or within 0.5 % where noise is ~0


@dataclass(frozen=True)
class SampleStats:
    """One clock's samples of one instruction key after outlier removal."""

    median: float
    spread: float  # robust σ of the kept samples (1.4826 MAD)
    se: float  # standard error of the median
    n: int  # samples kept
    dropped: int  # outliers removed


def robust_stats(values: Sequence[float]) -> SampleStats:
    """Median, robust σ and standard error of ``values``, outliers (> 3.5 robust σ) dropped."""
    x = np.asarray([v for v in values if math.isfinite(v)], dtype=float)
    if x.size == 0:
        raise ValueError("no samples")
    med = float(np.median(x))
    mad = float(np.median(np.abs(x - med)))
    kept = x
    if mad > 0:
        kept = x[np.abs(x - med) <= OUTLIER_MADS * MAD_SIGMA * mad]
        med = float(np.median(kept))
        mad = float(np.median(np.abs(kept - med)))
    spread = MAD_SIGMA * mad
    if spread == 0 and kept.size > 1:
        spread = float(np.std(kept, ddof=1))
    se = MEDIAN_SE * spread / math.sqrt(kept.size)
    return SampleStats(med, spread, se, int(kept.size), int(x.size - kept.size))


def first_is_outlier(first: Sequence[float], rest: Sequence[float], min_rel: float = 0.01) -> bool:
    """The first iteration after a clock change is slow beyond the others' noise: its median is
    more than 3.5 robust σ (and ``min_rel``) above theirs."""
    if not first or not rest:
        return False
    others = robust_stats(rest)
    excess = float(np.median(first)) - others.median
    return excess > max(OUTLIER_MADS * others.spread, min_rel * others.median)


def isotonic_times(freqs_desc: Sequence[int], times: Sequence[float], weights: Sequence[float] | None = None) -> list[float]:
    """Weighted least-squares fit of ``times`` that never decreases as the clock drops
    (``freqs_desc`` fastest first): pool-adjacent-violators."""
    if list(freqs_desc) != sorted(freqs_desc, reverse=True):
        raise ValueError("clocks must be given fastest first")
    w = [1.0] * len(times) if weights is None else [max(float(v), 1e-300) for v in weights]
    blocks: list[list[float]] = []  # [mean, weight, count]
    for t, wi in zip(times, w):
        blocks.append([float(t), wi, 1])
        while len(blocks) > 1 and blocks[-2][0] > blocks[-1][0]:
            m2, w2, n2 = blocks.pop()
            m1, w1, n1 = blocks.pop()
            blocks.append([(m1 * w1 + m2 * w2) / (w1 + w2), w1 + w2, n1 + n2])
    out: list[float] = []
    for mean, _, count in blocks:
        out.extend([mean] * int(count))
    return out


def fit_weights(se: Sequence[float], times: Sequence[float]) -> list[float]:
    """1/se² weights, with a floor (0.1 % of the time) so a noise-free point does not dominate."""
    return [1.0 / max(s, 1e-3 * t, 1e-12) ** 2 for s, t in zip(se, times)]


def pessimistic_times(fitted: Sequence[float], se: Sequence[float], k: float,
                      spread: Sequence[float] = (), spread_k: float = 0.0) -> list[float]:
    """Fitted time + k·se + spread_k·(spread − the fastest clock's spread, if more) at every
    clock but the fastest (the all-max reference), kept non-decreasing as the clock drops: an
    upper bound the plan cannot undercut by noise. ``spread``: each clock's per-instance σ
    (fastest first; empty: none)."""
    base = spread[0] if spread else 0.0
    out: list[float] = []
    for i, (t, s) in enumerate(zip(fitted, se)):
        value = t if i == 0 else t + k * s + (spread_k * max(0.0, spread[i] - base) if spread else 0.0)
        out.append(max(value, out[-1]) if out else value)
    return out


def model_between(f: float, f_hi: float, t_hi: float, e_hi: float, f_lo: float, t_lo: float, e_lo: float) -> tuple[float, float]:
    """(time, energy) at clock ``f`` from two measured neighbours: time a/f + b through both,
    power (energy / time) linear in f."""
    if f_hi == f_lo:
        return t_hi, e_hi
    a = (t_lo - t_hi) / (1.0 / f_lo - 1.0 / f_hi)
    b = t_hi - a / f_hi
    t = a / f + b
    p_hi, p_lo = e_hi / max(t_hi, 1e-30), e_lo / max(t_lo, 1e-30)
    p = p_lo + (p_hi - p_lo) * (f - f_lo) / (f_hi - f_lo)
    return t, p * t


def interpolate(freqs_desc: Sequence[int], times: Sequence[float], energies: Sequence[float],
                grid: Sequence[int]) -> dict[int, tuple[float, float]]:
    """(time, energy) at every clock of ``grid`` within the measured range (measured clocks keep
    their values; others from ``model_between`` of their two measured neighbours)."""
    known = {int(f): (float(t), float(e)) for f, t, e in zip(freqs_desc, times, energies)}
    fs = sorted(known, reverse=True)
    out: dict[int, tuple[float, float]] = {}
    for g in grid:
        if g in known:
            out[g] = known[g]
            continue
        if not fs or g > fs[0] or g < fs[-1]:
            continue
        hi = min(f for f in fs if f > g)
        lo = max(f for f in fs if f < g)
        out[g] = model_between(g, hi, *known[hi], lo, *known[lo])
    return out


def loo_errors(freqs_desc: Sequence[int], times: Sequence[float], energies: Sequence[float]) -> list[tuple[int, float, float]]:
    """For each interior measured clock: (clock, relative time error, relative energy error) of
    predicting it from its two neighbours; how well the model interpolates at this spacing."""
    out = []
    for i in range(1, len(freqs_desc) - 1):
        t, e = model_between(freqs_desc[i], freqs_desc[i - 1], times[i - 1], energies[i - 1],
                             freqs_desc[i + 1], times[i + 1], energies[i + 1])
        out.append((int(freqs_desc[i]), _rel(t, times[i]), _rel(e, energies[i])))
    return out


def _rel(predicted: float, measured: float) -> float:
    """Relative error; a zero measurement (an attribution that found no energy) is predicted
    only by zero."""
    if measured > 0:
        return abs(predicted - measured) / measured
    return 0.0 if predicted == measured else math.inf


def interpolation_ok(rel_time_err: float, rel_energy_err: float, rel_noise: float) -> bool:
    """Whether interpolating at the measured spacing is accurate, from ``loo_errors``: those
    predict across twice the spacing, and the error grows at least linearly with the span (as
    h² on a smooth curve), so half of it bounds the interpolation's. It must be within the
    measured noise (2 standard errors), or 0.5 % of time (1 % of energy) when the clock
    measured almost no noise."""
    tol = max(2.0 * rel_noise, INTERP_FLOOR)
    return rel_time_err / 2 <= tol and rel_energy_err / 2 <= 2 * tol
