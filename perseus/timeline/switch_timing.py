"""When a stage's clock switches can land on a GPU whose switches take ``latency`` to land, and
when to ask for them so that they land there.

Why: a clock switch lands some time after it is requested (NVML calls take 10–20 ms). Asked for
when the instruction that needs it begins, or when the one before it ends, it lands inside that
instruction, which then runs its first ``latency`` seconds at the previous clock: slower after a
switch up (time on the critical path), faster after a switch down (energy the plan did not
count). A switch costs nothing only if it lands between its two instructions: at the boundary, or
anywhere in the wait between them (a waiting GPU draws blocking power at any clock). So the
runtime requests each switch ``latency`` before the moment it should land, measured on the
planned timeline from the nearest earlier instruction boundary (``request_schedule``), and the
planner keeps only plans in which every switch can land that way (``late_switches``).

Model of one stage (times on the planned timeline of one iteration, which starts at 0 and lasts
``period``, the plan's iteration time; the next iteration's instructions begin ``period`` later):

- a switch is a change of planned clock between consecutive instructions ``a`` and ``b``,
  cyclically: the last instruction of a step precedes the first of the next;
- it may land anywhere in ``[end(a), begin(b)]`` (for the step's first instruction, from the
  previous step's last end, so the pipeline's fill is a wait it can land in);
- the GPU applies one request at a time (a newer request replaces one still on its way), so
  consecutive landings must be at least ``latency`` apart, plus a margin (``spacing_s``) so that
  a request made a little late (a busy controller process) never replaces the one before it;
- a request is made at an instruction boundary (the runtime's hooks) plus a delay; a switch that
  must be asked for before the step's first instruction begins is asked for in the step before
  (``TimedRequest.next_step``). Between steps the host does work no plan knows (the optimizer
  step, a data-parallel all-reduce), so the runtime delays those requests by how much longer than
  planned it saw the time between steps (``perseus.runtime.clocks.deploy``).

Each switch lands as early as it can (``end(a)``, or ``latency`` after the previous landing):
for a chain of windows with a minimum spacing, earliest-first is feasible whenever any
placement is. A switch whose earliest landing is after ``begin(b)`` is *late*.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass
from typing import Sequence

import numpy as np

# one stage's planned times and clocks: lists from the runtime, array slices from the planner
Times = Sequence[float] | np.ndarray
Clocks = Sequence[int] | np.ndarray

TOLERANCE_S = 1e-9  # float noise on simulated timelines
_PASSES = 3  # cyclic chain: re-run with the wrap-around constraint (two passes settle in practice)
MARGIN = 0.1  # of the latency, plus MARGIN_S: how much later than planned a request may be made safely
MARGIN_S = 0.0005


def spacing_s(latency_s: float) -> float:
    """The least time between two landings: the latency, and a margin for requests made late."""
    return latency_s + MARGIN * latency_s + MARGIN_S if latency_s > 0 else 0.0


@dataclass(frozen=True)
class Switch:
    """One clock change of a stage's plan and where it lands on the planned timeline."""

    index: int  # the instruction whose clock it sets (first of a run of equal clocks)
    clock_mhz: int
    earliest_s: float  # the previous instruction's end
    latest_s: float  # this instruction's begin
    lands_s: float  # earliest landing that keeps ``latency`` from the previous one

    @property
    def in_time(self) -> bool:
        return self.lands_s <= self.latest_s + TOLERANCE_S


@dataclass(frozen=True)
class TimedRequest:
    """Ask for ``clock_mhz`` ``delay_s`` after a hook of instruction ``anchor`` (its begin, or its
    end when ``at_end``) of every step; it is for instruction ``index`` of the same step, or of the
    next one when ``next_step``."""

    anchor: int
    at_end: bool
    delay_s: float
    clock_mhz: int
    index: int
    next_step: bool = False


def plan_switches(begin_s: Times, end_s: Times, clocks_mhz: Clocks,
                  latency_s: float, period_s: float) -> list[Switch]:
    """Every switch of one stage's plan (by instruction, the step's first one first) with its landing;
    ``period_s``: the plan's iteration time (at least the stage's last end)."""
    begin, end = np.asarray(begin_s, dtype=float), np.asarray(end_s, dtype=float)
    clocks = [int(c) for c in clocks_mhz]
    n = len(clocks)
    if len(begin) != n or len(end) != n:
        raise ValueError(f"plan_switches: {n} clocks but {len(begin)} begins and {len(end)} ends")
    targets = [i for i in range(n) if n > 1 and clocks[i] != clocks[i - 1]]
    if not targets:
        return []
    period = max(float(period_s), float(end[-1]))
    spacing = spacing_s(max(float(latency_s), 0.0))
    windows = [(float(end[i - 1]) if i else float(end[-1]) - period, float(begin[i])) for i in targets]
    previous = -np.inf
    lands: list[float] = []
    for _ in range(_PASSES):
        lands = []
        last = previous
        for lo, _hi in windows:
            last = max(lo, last + spacing)
            lands.append(last)
        wrapped = lands[-1] - period  # the previous step's last landing, before the first one
        if lands[0] >= wrapped + spacing - TOLERANCE_S:
            break
        previous = wrapped
    return [Switch(i, clocks[i], lo, hi, at) for i, (lo, hi), at in zip(targets, windows, lands)]


def late_switches(begin_s: Times, end_s: Times, clocks_mhz: Clocks,
                  latency_s: float, period_s: float) -> list[Switch]:
    """The switches that cannot land between their two instructions (empty: the plan runs as planned)."""
    return [s for s in plan_switches(begin_s, end_s, clocks_mhz, latency_s, period_s) if not s.in_time]


def request_schedule(begin_s: Times, end_s: Times, clocks_mhz: Clocks,
                     latency_s: float, period_s: float) -> list[TimedRequest]:
    """When to ask for each switch so that it lands where ``plan_switches`` puts it: ``latency``
    before, from the latest instruction boundary (a begin or an end hook) at or before that moment:
    one of this step's, or one of the previous step's (that request is then made in every step,
    for the next one: ``next_step``).

    Anchoring on the nearest boundary rather than on the step's start keeps the error of a real
    timeline (host time, a late neighbour) to what happens between that boundary and the landing.
    """
    switches = plan_switches(begin_s, end_s, clocks_mhz, latency_s, period_s)
    if not switches:
        return []
    begin, end = np.asarray(begin_s, dtype=float), np.asarray(end_s, dtype=float)
    period = max(float(period_s), float(end[-1]))
    events = [(float(t) + shift, i, at_end) for shift in (-period, 0.0) for i in range(len(begin))
              for t, at_end in ((begin[i], False), (end[i], True))]
    times = [t for t, _, _ in events]
    out = []
    for s in switches:
        asked = s.lands_s - latency_s
        k = max(bisect.bisect_right(times, asked + TOLERANCE_S) - 1, 0)
        t, anchor, at_end = events[k]
        out.append(TimedRequest(anchor, at_end, max(asked - t, 0.0), s.clock_mhz, s.index, next_step=k < len(times) // 2))
    return out


__all__ = ["Switch", "TimedRequest", "TOLERANCE_S", "late_switches", "plan_switches", "request_schedule", "spacing_s"]
