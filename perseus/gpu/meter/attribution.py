"""Average power per instruction key from a coarse energy counter, by least squares over its intervals.

Each counter interval ``i`` has a known energy ΔE_i, and

    ΔE_i = Σ_k P_k · overlap_i(k) + P_idle · idle_i

where overlap_i(k) is the time instructions of key ``k`` ran inside what the interval measured.
Keys are arbitrary (``("forward", 1410)``, the runtime's ``(chunk, kind)``, a step's work between
its instructions). Energy per instruction = P_k × its mean duration; standard errors come from the
regression covariance σ²(AᵀA)⁻¹. The error sources (boundary-instant jitter, power varying within
a key) are independent across intervals and shrink as 1/√(#intervals).

Three things keep the answer honest (docs/gpu.md):

- what an interval measured is fitted, not assumed (``counter.py``): the whole interval, or part
  of the counter's period where a part-time meter explains the energies clearly better;
- ``shared`` keys (a stage's instruction kinds) get one power unless the data identify a split
  (``power_split.py``), and identify it still with every update's time moved by the time's
  uncertainty either way (``time_uncertainty``): on a real H200 a spurious split of +11 % / -0.1 %
  against directly measured powers passed the test at the observed times and vanished with the
  updates 10 ms later, while the shared power moved by under 1 %. So a split is believed only
  where the instructions are long against the counter's timing (tens of ms and more);
- no power leaves [P_blocking, the power limit]; a clamped key is named (``clamped``).
"""

from __future__ import annotations

import math
from collections.abc import Collection, Hashable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from perseus.gpu.meter.counter import (WHOLE, CounterUpdate, CounterWindow, Intervals, MeasurementError,
                                       candidate_windows, counter_grid, counter_period_s, finer_windows, intervals)
from perseus.gpu.meter.power_split import (LinearFit, SplitTest, bounded, inliers, least_squares, merge, split_test,
                                           trimmed_sigma)
from perseus.gpu.meter.timing import TimedInstruction

IDLE = "__idle__"
# How far the time an update's energy belongs to may be from its observed time, either way, in
# counter periods: the poller sees an update up to one poll interval (a twentieth of the period)
# plus a read (3 ms, p99 15 ms on an H200) after it happened, and what span a real meter's update
# covers (its own lag, its sampling within the period) is not published: 10 ms at 100 ms.
TIME_UNCERTAINTY = 0.1
# A window other than the whole intervals is kept only where its residual σ is below this share of
# theirs: a part-time meter read as integrating misfits by a factor 3-10 (the simulated H200-hostile).
WINDOW_MARGIN = 0.7


@dataclass(frozen=True)
class KeyEnergy:
    """Attributed average power and per-instruction energy of one instruction key."""

    key: Hashable
    power_w: float
    power_stderr_w: float
    count: int
    mean_duration_s: float

    @property
    def energy_j(self) -> float:
        """Energy of one instruction of this key."""
        return self.power_w * self.mean_duration_s

    @property
    def energy_stderr_j(self) -> float:
        return self.power_stderr_w * self.mean_duration_s


@dataclass
class AttributionResult:
    keys: dict[Hashable, KeyEnergy]
    idle_power_w: float | None  # estimated (or the given one); None if there was no idle time
    n_intervals: int
    residual_rms_j: float
    extra: dict[str, Any] = field(default_factory=dict)
    window: CounterWindow = WHOLE  # what each counter interval was read to measure
    split: SplitTest | None = None  # the shared keys' test (None: fewer than two of them)
    clamped: dict[Hashable, tuple[float, float]] = field(default_factory=dict)  # key -> (fitted, held at) W

    @property
    def shared(self) -> bool:
        """Whether the shared keys got one power (their split was not identified)."""
        return self.split is not None and not self.split.identified


class _Cumulative:
    """Time one column's instructions ran before ``t`` (they do not overlap): vectorized overlaps."""

    def __init__(self, spans: list[tuple[float, float]]) -> None:
        spans.sort()
        self.start = np.array([s for s, _ in spans])
        self.dur = np.array([e - s for s, e in spans])
        self.before = np.concatenate([[0.0], np.cumsum(self.dur)])

    def at(self, t: np.ndarray) -> np.ndarray:
        j = np.searchsorted(self.start, t, side="right") - 1
        inside = np.clip(t - self.start[np.maximum(j, 0)], 0.0, self.dur[np.maximum(j, 0)])
        return np.where(j >= 0, self.before[np.maximum(j, 0)] + inside, 0.0)


def _design(rows: Intervals, columns: list[_Cumulative], idle_power_w: float | None,
            estimate_idle: bool) -> tuple[np.ndarray, np.ndarray]:
    """(A, y): each row's overlap with each column (and idle), scaled to the booked energy."""
    a = np.column_stack([c.at(rows.end_s) - c.at(rows.start_s) for c in columns])
    idle = np.clip((rows.end_s - rows.start_s) - a.sum(axis=1), 0.0, None)
    a = a * rows.scale[:, None]
    idle = idle * rows.scale
    y = rows.energy_j.astype(float).copy()
    if idle_power_w is not None:
        y -= idle_power_w * idle
    elif estimate_idle:
        a = np.column_stack([a, idle])
    return a, y


def _check(instructions: Sequence[TimedInstruction], updates: Sequence[CounterUpdate]) -> None:
    if len(updates) < 2:
        raise MeasurementError(
            f"need at least 2 energy-counter updates, got {len(updates)}; measure for longer "
            "(several counter periods) or poll faster"
        )
    ordered = sorted(instructions, key=lambda i: i.start_s)
    for prev, nxt in zip(ordered, ordered[1:]):
        if nxt.start_s < prev.end_s - 1e-9:
            raise MeasurementError(
                f"instructions overlap in time ({prev.key!r} and {nxt.key!r}); time one GPU's "
                "instructions only"
            )
    if np.any(np.diff([u.t_s for u in updates]) <= 0):
        raise MeasurementError("counter update times must be strictly increasing")
    if not instructions:
        raise MeasurementError("no instructions to attribute energy to")


def attribute_energy(
    updates: Sequence[CounterUpdate],
    instructions: Sequence[TimedInstruction],
    *,
    idle_power_w: float | None = None,
    shared: Collection[Hashable] = (),
    power_limit_w: float | None = None,
    time_uncertainty: float = TIME_UNCERTAINTY,
) -> AttributionResult:
    """Average power per instruction key by least squares over counter-update intervals.

    ``idle_power_w`` (e.g. a measured P_blocking) is subtracted when given, and is every key's
    lowest power; otherwise idle power is estimated as one more unknown. ``shared``: keys with one
    power unless the data identify a split (``power_split.py``). ``power_limit_w``: no key's power
    above it. ``time_uncertainty``: how far the time an update's energy belongs to may be from its
    observed time, in counter periods; read over whole intervals (the times as observed), a split counts as identified
    only if it is with the updates moved that far either way too (a part window's timing is fitted
    to the data instead: ``counter.py``).
    Instructions must not overlap each other (one GPU).
    """
    _check(instructions, updates)
    keys = list(dict.fromkeys(i.key for i in instructions))
    spans: dict[Hashable, list[tuple[float, float]]] = {k: [] for k in keys}
    for inst in instructions:
        spans[inst.key].append((inst.start_s, inst.end_s))
    columns = [_Cumulative(spans[k]) for k in keys]
    whole = intervals(updates, WHOLE, None)
    busy = sum(float(c.at(whole.end_s[-1:])[0] - c.at(whole.start_s[:1])[0]) for c in columns)
    span = float(whole.end_s[-1] - whole.start_s[0])
    estimate_idle = idle_power_w is None and span - busy > 1e-3 * span
    a, y = _design(whole, columns, idle_power_w, estimate_idle)
    missing = [keys[j] for j in range(len(keys)) if not a[:, j].sum() > 0]
    if missing:
        raise MeasurementError(f"instructions {missing} fall outside the measured counter updates")
    if np.linalg.matrix_rank(a) < a.shape[1]:
        raise MeasurementError(
            "instruction keys are not separable (they always occur in the same proportions in "
            "every counter interval); measure over more intervals or vary the mix"
        )
    window, a, y, fit, rows = _best_window(updates, columns, idle_power_w, estimate_idle, (a, y))
    shared = set(shared)
    members = [j for j, k in enumerate(keys) if k in shared]
    test = split_test(fit, members) if len(members) >= 2 else None
    period = counter_period_s(updates)
    if test is not None and test.identified and window.whole and period is not None and time_uncertainty > 0:
        test = _split_when_moved(test, updates, columns, idle_power_w, estimate_idle, window, members,
                                 time_uncertainty * period)
    where = list(range(a.shape[1]))
    if test is not None and not test.identified:
        a, where = merge(a, members)
        fit = least_squares(a, y)
    n_cols = a.shape[1]
    lo = np.full(n_cols, idle_power_w if idle_power_w is not None else 0.0)
    hi = np.full(n_cols, power_limit_w if power_limit_w is not None else math.inf)
    if estimate_idle:
        lo[-1] = 0.0
    p = np.clip(bounded(a, y, lo, hi, fit.power_w), lo, hi)
    # held: at a bound it was not fitted at (outside it, or moved there by another column's bound)
    held = (np.isclose(p, lo) | np.isclose(p, hi)) & ~np.isclose(p, fit.power_w)
    clamped = {k: (float(fit.power_w[where[j]]), float(p[where[j]])) for j, k in enumerate(keys) if held[where[j]]}
    resid = y - a @ p
    stderr = fit.stderr_w
    out = {k: KeyEnergy(k, float(p[where[j]]), float(stderr[where[j]]), len(spans[k]),
                        float(np.mean([e - s for s, e in spans[k]]))) for j, k in enumerate(keys)}
    idle_w = float(p[-1]) if estimate_idle else idle_power_w
    return AttributionResult(out, idle_w, len(y), float(np.sqrt(np.mean(resid ** 2))),
                             extra={"idle_power_stderr_w": float(stderr[-1]) if estimate_idle else 0.0,
                                    "intervals_left_out": rows - len(y)},
                             window=window, split=test, clamped=clamped)


def _split_when_moved(test: SplitTest, updates: Sequence[CounterUpdate], columns: list[_Cumulative],
                      idle_power_w: float | None, estimate_idle: bool, window: CounterWindow,
                      members: Sequence[int], shift_s: float) -> SplitTest:
    """The split test as it stands with every update's time moved by -``shift_s`` and +``shift_s``:
    the weakest of the three, so a split the counter's timing alone could make is not identified."""
    weakest = test
    for shift in (-shift_s, shift_s):
        moved = [CounterUpdate(u.t_s + shift, u.energy_j) for u in updates]
        grid = None if window.whole else counter_grid([u.t_s for u in moved])
        a, y = _design(intervals(moved, window, grid), columns, idle_power_w, estimate_idle)
        if a.shape[0] <= a.shape[1] or np.linalg.matrix_rank(a) < a.shape[1]:
            continue
        keep = inliers(a, y)
        moved_test = split_test(least_squares(a[keep], y[keep]), members)
        if moved_test.statistic - moved_test.threshold < weakest.statistic - weakest.threshold:
            weakest = moved_test
    return weakest


def _best_window(updates: Sequence[CounterUpdate], columns: list[_Cumulative], idle_power_w: float | None,
                 estimate_idle: bool, whole: tuple[np.ndarray, np.ndarray]
                 ) -> tuple[CounterWindow, np.ndarray, np.ndarray, LinearFit, int]:
    """The window whose fit explains the energies best (``counter.py``; by ``trimmed_sigma``, so a
    few glitched intervals do not choose it): the whole intervals unless another's σ is below
    ``WINDOW_MARGIN`` of theirs; the best one's offset is then refined (``finer_windows``). Its fit
    is over the intervals that fit it (``inliers``), of its ``rows``."""
    a, y = whole
    best, score = (WHOLE, a, y), trimmed_sigma(a, y, inliers(a, y))
    grid = counter_grid([u.t_s for u in updates])
    if grid is not None and math.isfinite(score):
        bar = WINDOW_MARGIN * score
        for coarse in (True, False):
            for window in candidate_windows(True)[1:] if coarse else finer_windows(best[0]):
                wa, wy = _design(intervals(updates, window, grid), columns, idle_power_w, estimate_idle)
                if wa.shape[0] <= wa.shape[1] + 2 or np.linalg.matrix_rank(wa) < wa.shape[1]:
                    continue
                wscore = trimmed_sigma(wa, wy, inliers(wa, wy))
                if wscore < bar:
                    bar, best = wscore, (window, wa, wy)
    window, a, y = best
    keep = inliers(a, y)
    return window, a[keep], y[keep], least_squares(a[keep], y[keep]), len(y)
