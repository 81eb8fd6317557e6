"""Where the profiling sweep starts: the clock each stage's unlocked GPU sustained in warm-up.

Why: a card under a power cap runs below its top clock whatever clock is locked above that (a real
H200: a dense bf16 stage at 1,530 MHz, ``sw_power_cap``; a memory-bound loop at 1,980 MHz on the
same card), so profiling the clocks above measures the same point again and makes the profile's
"max" a clock the card never runs at. Each rank found its own sustained clock in warm-up
(``GPUPort.end_warmup_clocks``: the poller thread's busy samples); the ranks share them here, as
the sweep is walked by every rank together: it starts at the highest, and visits every rank's
(``ClockSweep`` anchors). A rank records every candidate clock above its own as equal to its
own's point (``equal_above``), flagged in the profile (``Profile.clock_notes``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

from perseus.gpu.meter.clock_samples import SustainedClock
from perseus.runtime.plane.collective import Collective


@dataclass(frozen=True)
class SweepStart:
    """The job's first clock, every rank's sustained clock, and this rank's (None: unknown)."""

    start_mhz: int
    anchors: tuple[int, ...]
    own_mhz: int | None


def agree_start(collective: Collective, own: SustainedClock, candidates: Sequence[int]) -> SweepStart:
    """Collective: the sweep starts at the highest rank's sustained clock (kept within the
    candidates' range); at the top candidate when a rank does not know its own."""
    lo, hi = min(candidates), max(candidates)
    mine = None if own.mhz is None else max(min(own.mhz, hi), lo)
    known = [int(row[0]) for row in collective.all_gather_floats([float(mine or 0)])]
    anchors = tuple(sorted({f for f in known if f > 0}, reverse=True))
    start = hi if not anchors or any(f <= 0 for f in known) else anchors[0]
    return SweepStart(start, anchors, mine)


def equal_above(measurements: dict[Any, dict[int, Any]], own_mhz: int | None,
                grid: Sequence[int]) -> dict[Any, dict[int, Any]]:
    """A copy of ``measurements`` whose clocks of ``grid`` above ``own_mhz`` hold its point there
    (what a locked clock above the sustained one runs at): those measured are replaced too."""
    if own_mhz is None:
        return {key: dict(per_freq) for key, per_freq in measurements.items()}
    out: dict[Any, dict[int, Any]] = {}
    for key, per_freq in measurements.items():
        kept = dict(per_freq)
        if own_mhz in per_freq:  # else (not measured there) what was measured stays
            kept = {f: p for f, p in per_freq.items() if f <= own_mhz}
            kept.update({f: per_freq[own_mhz] for f in grid if f > own_mhz})
        out[key] = kept
    return out
