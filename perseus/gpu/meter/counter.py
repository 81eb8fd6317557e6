"""What an energy counter's updates measure: when they came, and which part of each interval.

A coarse counter (NVML on A100/H100/H200: every ~100 ms) gives the energy between two updates,
and attribution (``attribution.py``) regresses those energies on what ran in each interval. That
is only right if the counter integrated the whole interval. A100 and H100 sample power during
only about a quarter of each period ("part-time power measurements", SC'24, arXiv 2312.02741) and
book that part's mean power × the period; an update also appears a little after its period ends.
Regressed on whole intervals, such a counter splits energy between instruction kinds wrongly (the
simulated part-time H200 gave a memory-bound forward −965 W, its dense backward 1,206 W).

``CounterWindow`` is one hypothesis of what each update measured: the whole interval between the
observed updates, or a part of the counter's period (``fraction``, starting ``offset`` periods
after the boundary) on its periodic grid, fitted to the update times (``counter_grid``: a counter
that updates on a timer, seen late by a varying lag). Attribution fits each candidate window
(``candidate_windows``) and keeps a part-period one only where it explains the energies clearly
better than the whole intervals do; a counter that integrates everything keeps whole intervals.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from perseus.gpu.errors import GPUError

GRID_TOLERANCE = 0.25  # update times this far (periods) from the fitted grid: not a periodic counter
PART_FRACTIONS = (0.5, 0.25)  # sampled shares of a period tried besides the whole period
OFFSET_STEP = 0.025  # periods between the windows' tried starts
FINE_STEP = 0.005  # then around the best one: half a millisecond at 100 ms, a fifth of the poller's jitter
EARLY = 0.15  # how far before the grid's typical update a window may start (periods): the update's lag


class MeasurementError(GPUError):
    """Not enough (or degenerate) data to attribute energy; the message says what to change."""


@dataclass(frozen=True)
class CounterUpdate:
    """The energy counter reached ``energy_j`` at (about) time ``t_s``."""

    t_s: float
    energy_j: float


def counter_period_s(updates: Sequence[CounterUpdate]) -> float | None:
    """Median gap between counter updates: 100 ms on A100/H100/H200, whatever the load."""
    if len(updates) < 3:
        return None
    gaps = sorted(b.t_s - a.t_s for a, b in zip(updates, updates[1:]))
    return gaps[len(gaps) // 2]


@dataclass(frozen=True)
class CounterWindow:
    """What each update measured: ``fraction`` of the counter's period from ``offset`` periods
    after its grid boundary, booked as that part's mean power × the period; ``whole``: the whole
    interval between the observed updates (an integrating counter)."""

    fraction: float = 1.0
    offset: float = 0.0
    whole: bool = True

    def describe(self) -> str:
        if self.whole:
            return "whole intervals"
        return f"{self.fraction:.0%} of each counter period from {self.offset:+.3f} periods"


WHOLE = CounterWindow()


@dataclass(frozen=True)
class Intervals:
    """The counter's intervals under one window: each row's measured span [start, end), the
    factor from that span's energy to the booked one, and the booked energy."""

    start_s: np.ndarray
    end_s: np.ndarray
    scale: np.ndarray
    energy_j: np.ndarray


@dataclass(frozen=True)
class Grid:
    """The counter's periodic grid: each update's boundary index, its time on the grid (at the
    updates' typical lag), the period, and whether the update was seen on the grid (``on``)."""

    k: np.ndarray
    at: np.ndarray
    period: float
    on: np.ndarray


def counter_grid(times: Sequence[float]) -> Grid | None:
    """The grid the updates fall on, if they do: the period whose phases cluster most (a search
    around the median gap), so a poller stalled for several periods, seeing updates late or not at
    all, does not shift the count; then a least-squares fit over the updates within
    ``GRID_TOLERANCE`` periods of it. None with fewer than 4 updates, or fewer than 3/4 of them on
    any grid (not a periodic counter)."""
    t = np.asarray(times, dtype=float)
    if len(t) < 4:
        return None
    gaps = np.diff(t)
    period0 = float(np.median(gaps))
    if period0 <= 0:
        return None
    rel = t - t[0]
    periods = period0 * (1.0 + np.linspace(-0.1, 0.1, 2001))  # the median gap is off by the lags' pattern
    clustering = np.abs(np.exp(2j * np.pi * rel[None, :] / periods[:, None]).mean(axis=1))
    period = float(periods[int(np.argmax(clustering))])
    phase = float(np.angle(np.exp(2j * np.pi * rel / period).mean())) / (2 * np.pi) * period
    k = np.round((rel - phase) / period)
    resid, start, anchor = rel - phase - k * period, phase, 0.0
    for _ in range(2):  # the updates near the grid; a least-squares grid through them
        on = np.abs(resid - np.median(resid)) <= GRID_TOLERANCE * period
        on &= np.concatenate([[True], np.diff(k) > 0])  # one update per boundary: the first seen
        if on.sum() < max(4, 0.75 * len(t)):
            return None
        period, start = np.polyfit(k[on], rel[on], 1)
        resid = rel - (start + k * period)
        anchor = float(np.median(resid[on]))
    if period <= 0:
        return None
    return Grid(k - k[0], t[0] + start + anchor + k * period, float(period), on)


def candidate_windows(grid: bool) -> list[CounterWindow]:
    """The whole intervals, and with a ``grid`` the whole period and each part fraction at
    offsets from ``EARLY`` periods before the typical update to the period's end."""
    out = [WHOLE]
    if not grid:
        return out
    for fraction in (1.0, *PART_FRACTIONS):
        last = 1.0 - fraction if fraction < 1 else EARLY
        steps = int(round((last + EARLY) / OFFSET_STEP))
        out += [CounterWindow(fraction, -EARLY + j * OFFSET_STEP, whole=False) for j in range(steps + 1)]
    return out


def finer_windows(best: CounterWindow) -> list[CounterWindow]:
    """The windows between ``best`` and its coarse neighbours, ``FINE_STEP`` apart (none for the
    whole intervals)."""
    if best.whole:
        return []
    steps = int(round(OFFSET_STEP / FINE_STEP))
    return [CounterWindow(best.fraction, best.offset + j * FINE_STEP, whole=False)
            for j in range(-steps + 1, steps) if j != 0]


def intervals(updates: Sequence[CounterUpdate], window: CounterWindow, grid: Grid | None) -> Intervals:
    """The counter's intervals as ``window`` reads them; a part window keeps the intervals of one
    period between updates seen on the grid only (after a missed update the counter booked more
    than one sampled part; an update seen far off it may belong to another period)."""
    t = np.array([u.t_s for u in updates])
    e = np.diff([u.energy_j for u in updates])
    if window.whole or grid is None:
        return Intervals(t[:-1], t[1:], np.ones(len(e)), e)
    k, at, period = grid.k, grid.at, grid.period
    one = (np.diff(k) == 1) & grid.on[:-1] & grid.on[1:]
    start = at[:-1] + window.offset * period
    span = window.fraction * period
    return Intervals(start[one], start[one] + span, np.full(int(one.sum()), period / span), e[one])
