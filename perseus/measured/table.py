"""The measured instruction-time table: per (stage, kind, clock), every instance the runs measured.

Each entry is the median over all instances (microbatches × iterations after the first × schedules)
with what says how far it can be trusted: the instances' robust spread, the spread of the
per-schedule medians, and the stalls (instances far slower than the median: a card that paused,
not a clock effect). A clock no run measured is interpolated linearly between its measured
neighbours; below the lowest measured clock the time grows as 1/clock (compute-bound, the most a
lower clock can cost); above the highest it stays at the highest's (the card runs no faster than
it was seen to).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Mapping
from weakref import WeakKeyDictionary

import numpy as np

from perseus.measured.runs import STALL_RATIO, Workload

KINDS = ("forward", "backward")

TableKey = tuple[int, str, int]  # (stage, kind, clock MHz)


@dataclass(frozen=True)
class TimeEntry:
    """One (stage, kind, clock): median time and how far it can be trusted."""

    median_s: float
    spread: float  # 1.4826 × median absolute deviation / median, over instances
    schedule_spread: float  # the same over per-schedule medians (0 when one schedule ran it)
    instances: int
    schedules: int
    stalls: int  # instances above STALL_RATIO × median
    worst_ratio: float  # slowest instance / median


@dataclass(frozen=True)
class TimeTable:
    """Per (stage, kind, clock) measured times."""

    entries: Mapping[TableKey, TimeEntry]

    def clocks(self, stage: int, kind: str) -> tuple[int, ...]:
        """Measured clocks of one (stage, kind), ascending."""
        return tuple(sorted(c for s, k, c in self.entries if s == stage and k == kind))

    def measured(self, stage: int, kind: str, clock_mhz: int) -> bool:
        return (stage, kind, int(clock_mhz)) in self.entries

    def time_s(self, stage: int, kind: str, clock_mhz: int) -> float:
        """Measured median at the clock, or the interpolation the module docstring describes."""
        entry = self.entries.get((stage, kind, int(clock_mhz)))
        if entry is not None:
            return entry.median_s
        clocks = self.clocks(stage, kind)
        if not clocks:
            raise KeyError(f"no {kind} of stage {stage} was measured")
        times = [self.entries[(stage, kind, c)].median_s for c in clocks]
        if clock_mhz < clocks[0]:
            return times[0] * clocks[0] / clock_mhz
        return float(np.interp(clock_mhz, clocks, times))

    def fastest_s(self, stage: int, kind: str) -> float:
        return min(self.entries[(stage, kind, c)].median_s for c in self.clocks(stage, kind))

    def sustained_mhz(self, stage: int, tolerance: float) -> int:
        """The lowest clock past which the stage no longer gets faster: per kind, the lowest measured
        clock within ``tolerance`` of that kind's fastest time; the higher of the two kinds'."""
        found = []
        for kind in KINDS:
            best = self.fastest_s(stage, kind)
            found.append(min(c for c in self.clocks(stage, kind)
                             if self.entries[(stage, kind, c)].median_s <= best * (1 + tolerance)))
        return max(found)

    def stalled_share(self) -> float:
        """Share of all measured instances that stalled."""
        total = sum(e.instances for e in self.entries.values())
        return sum(e.stalls for e in self.entries.values()) / total if total else 0.0


def _relative_mad(values: np.ndarray) -> float:
    median = float(np.median(values))
    return float(1.4826 * np.median(np.abs(values - median)) / median) if median > 0 else 0.0


# per workload: (stage, kind, clock) -> [(run position, instance times, their median)], built once
_SAMPLES: WeakKeyDictionary[Workload, dict[TableKey, list[tuple[int, np.ndarray, float]]]] = WeakKeyDictionary()


def _samples(workload: Workload) -> dict[TableKey, list[tuple[int, np.ndarray, float]]]:
    found = _SAMPLES.get(workload)
    if found is None:
        found = {}
        for i, run in enumerate(workload.runs):
            for stage, rank in enumerate(run.ranks):
                for kind in KINDS:
                    clocks, times = rank.clocks(kind), rank.times(kind)[1:]
                    for clock in np.unique(clocks).tolist():
                        values = times[:, clocks == clock].ravel()
                        found.setdefault((stage, kind, int(clock)), []).append((i, values, float(np.median(values))))
        _SAMPLES[workload] = found
    return found


def build_time_table(workload: Workload, exclude: Iterable[int] = ()) -> TimeTable:
    """The table from every run of ``workload`` except the positions in ``exclude``."""
    skip = set(exclude)
    entries: dict[TableKey, TimeEntry] = {}
    for key, per_run in _samples(workload).items():
        kept = [(values, median) for i, values, median in per_run if i not in skip]
        if not kept:
            continue
        values = np.concatenate([v for v, _ in kept])
        median = float(np.median(values))
        medians = np.array([m for _, m in kept])
        entries[key] = TimeEntry(
            median_s=median,
            spread=_relative_mad(values),
            schedule_spread=_relative_mad(medians) if len(medians) > 1 else 0.0,
            instances=int(values.size),
            schedules=len(kept),
            stalls=int((values > STALL_RATIO * median).sum()),
            worst_ratio=float(values.max() / median),
        )
    return TimeTable(entries)
