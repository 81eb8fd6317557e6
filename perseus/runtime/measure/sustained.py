"""Where the profiling sweep starts: the clocks each stage's unlocked GPU sustained in warm-up.

Why: a card under a power cap runs below its top clock whatever clock is locked above that (a real
H200: a dense bf16 stage at 1,530 MHz, ``sw_power_cap``; a memory-bound loop at 1,980 MHz on the
same card), so profiling the clocks above measures the same point again and makes the profile's
"max" a clock the card never runs at. Each rank found its own sustained clock in warm-up
(``GPUPort.end_warmup_clocks``: the poller thread's busy samples); the ranks share them here, as
the sweep is walked by every rank together: it starts at the highest, and visits every rank's
(``ClockSweep`` anchors). A rank records every candidate clock above its own as equal to its
own's point (``equal_above``), flagged in the profile (``Profile.clock_notes``).

The card sustains a clock per kind of work (the H200 above, one card: 1,530 and 1,980 MHz), so a
rank's clock is per instruction key where warm-up attributed one (``SustainedClock.by_key``): the
sweep starts at the highest key's clock of any rank, every key's clock is an anchor, and each
key's clocks above its own are recorded equal to its own's point. A key warm-up could not
attribute (too few samples inside its instructions) takes the card's clock.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Sequence

from perseus.gpu.meter.clock_samples import SustainedClock
from perseus.profile.aggregate import ClockPoint, KindWarmup
from perseus.profile.fit import robust_stats
from perseus.runtime.plane.collective import Collective

# A rank's sustained clocks the others learn (its highest first): one fixed-length row per rank. A
# stage has a handful of instruction kinds; a clock past these is measured only if the sweep visits it.
ANCHORS_PER_RANK = 8


@dataclass(frozen=True)
class SweepStart:
    """The job's first clock, every rank's sustained clocks, and this rank's: its highest
    (``own_mhz``, None: unknown) and each instruction key's (``own_by_key``, where attributed)."""

    start_mhz: int
    anchors: tuple[int, ...]
    own_mhz: int | None
    own_by_key: Mapping[Hashable, int] = field(default_factory=dict)

    def own_for(self, key: Hashable) -> int | None:
        """The clock this rank's card sustained under ``key``, else its highest (None: unknown)."""
        return self.own_by_key.get(key, self.own_mhz)


def agree_start(collective: Collective, own: SustainedClock, candidates: Sequence[int]) -> SweepStart:
    """Collective: the sweep starts at the highest sustained clock of any rank's keys (kept within
    the candidates' range); at the top candidate when a rank does not know its own. Every rank's
    clocks (its keys', and its card's where a key has none) are the anchors."""
    lo, hi = min(candidates), max(candidates)

    def within(f: int) -> int:
        return max(min(f, hi), lo)

    by_key = {key: within(load.clock.mhz) for key, load in own.by_key.items() if load.clock.mhz is not None}
    card = None if own.mhz is None else within(own.mhz)
    mine = None if card is None else max([card, *by_key.values()])
    sources = set(by_key.values())  # the clocks this rank's points are copied from
    if card is not None and len(by_key) < max(len(own.by_key), 1):  # a key (or every key) takes the card's
        sources.add(card)
    clocks = sorted(sources, reverse=True)
    shared = clocks[:ANCHORS_PER_RANK]
    padding = [0.0] * (ANCHORS_PER_RANK - len(shared))
    rows = collective.all_gather_floats([float(mine or 0), *map(float, shared), *padding])
    known = [int(row[0]) for row in rows]
    anchors = tuple(sorted({int(f) for row in rows for f in row[1:] if f > 0} | {f for f in known if f > 0},
                           reverse=True))
    start = hi if not anchors or any(f <= 0 for f in known) else max(known)
    return SweepStart(start, anchors, mine, by_key if mine is not None else {})


def equal_above(measurements: dict[Any, dict[int, Any]], own_mhz: int | None, grid: Sequence[int],
                by_key: Mapping[Hashable, int] | None = None) -> dict[Any, dict[int, Any]]:
    """A copy of ``measurements`` whose clocks of ``grid`` above the key's sustained clock
    (``by_key``'s, else ``own_mhz``) hold its point there (what a locked clock above the
    sustained one runs at): those measured are replaced too."""
    out: dict[Any, dict[int, Any]] = {}
    for key, per_freq in measurements.items():
        own = (by_key or {}).get(key, own_mhz)
        kept = dict(per_freq)
        if own is not None and own in per_freq:  # else (unknown, or not measured there) what was measured stays
            kept = {f: p for f, p in per_freq.items() if f <= own}
            kept.update({f: per_freq[own] for f in grid if f > own})
        out[key] = kept
    return out


def kind_warmups(start: SweepStart, warmup: SustainedClock,
                 keys: Iterable[tuple[int, str]]) -> dict[tuple[int, str], KindWarmup]:
    """Per key, what this rank's unlocked card did under it in warm-up, for the profile: the clock
    (its own, else the card's: ``SweepStart.own_for``) and the robust time of its instructions at
    default clocks (None where warm-up timed none)."""
    out: dict[tuple[int, str], KindWarmup] = {}
    for key in keys:
        load = warmup.by_key.get(key)
        point = None
        if load is not None and load.durations_s:
            st = robust_stats(load.durations_s)
            point = ClockPoint(st.median, 0.0, st.n, st.spread, st.se)
        out[key] = KindWarmup(start.own_for(key), point)
    return out
