"""The SM clock a card sustains under a load, from samples the energy poller's thread takes.

Why: an unlocked card does not run at its top supported clock under every load. A real H200 ran a
dense bf16 GEMM stage at 1,530 MHz (an H100: 1,380 MHz) with reason ``sw_power_cap``, and a
memory-bound loop at 1,980 MHz on the same card (docs/gpu.md). Locking a clock above the sustained
one changes nothing: the card throttles back to it. So the profiling sweep starts at the sustained
clock, and "max" and "default clocks" mean what the unlocked card does under this load.

Samples are read on the poller thread only (``EnergyPoller(clocks=True)``), never on the training
thread. A sample whose reasons include ``gpu_idle`` was taken between kernels (a pipeline bubble)
and says nothing about the clock under load, so only busy samples count.

The card sustains a clock per kind of work, not per card, so warm-up's samples are also attributed
to the instruction whose span (on the same clock) holds their time (``kind_loads``): each kind's
sustained clock and its instructions' durations at default clocks (``KindLoad``).
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from collections.abc import Hashable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from statistics import median_low
from typing import Any, Protocol

from perseus.gpu.device import ClockEventReason

MIN_BUSY_SAMPLES = 3  # fewer busy samples than this: the sustained clock is unknown


@dataclass(frozen=True)
class ClockSample:
    """The SM clock (MHz) and clock-event reasons the device reported at ``t_s`` (the poller's clock)."""

    t_s: float
    mhz: int
    reasons: frozenset[ClockEventReason]

    @property
    def busy(self) -> bool:
        return ClockEventReason.IDLE not in self.reasons


class Span(Protocol):
    """An instruction's run on the samples' clock (``perseus.gpu.meter.timing.TimedInstruction``)."""

    @property
    def key(self) -> Hashable: ...
    @property
    def start_s(self) -> float: ...
    @property
    def end_s(self) -> float: ...


@dataclass(frozen=True)
class KindLoad:
    """One instruction key under the unlocked card: the clock it sustained while the key's
    instructions ran (``clock.mhz`` None: too few samples inside them) and their durations (s)."""

    clock: SustainedClock
    durations_s: tuple[float, ...]

    def as_dict(self) -> dict[str, Any]:
        return {**self.clock.as_dict(), "instructions": len(self.durations_s)}


@dataclass(frozen=True)
class SustainedClock:
    """The clock the card ran at while busy (median of busy samples; None when too few) and every
    reason it reported then; ``by_key``: the same per instruction key (``kind_loads``), where
    warm-up's instructions were timed."""

    mhz: int | None
    reasons: frozenset[ClockEventReason]
    busy_samples: int
    samples: int
    by_key: Mapping[Hashable, KindLoad] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"mhz": self.mhz, "reasons": reason_names(self.reasons),
                               "busy_samples": self.busy_samples, "samples": self.samples}
        if self.by_key:
            out["by_kind"] = {" ".join(map(str, key)) if isinstance(key, tuple) else str(key): load.as_dict()
                              for key, load in sorted(self.by_key.items(), key=lambda kv: repr(kv[0]))}
        return out


UNKNOWN = SustainedClock(None, frozenset(), 0, 0)


def sustained_clock(samples: Sequence[ClockSample], min_busy: int = MIN_BUSY_SAMPLES) -> SustainedClock:
    """The median clock of the busy samples and the reasons they carried."""
    busy = [s for s in samples if s.busy]
    reasons = busy_reasons(busy)
    if len(busy) < max(min_busy, 1):
        return SustainedClock(None, reasons, len(busy), len(samples))
    return SustainedClock(int(median_low(s.mhz for s in busy)), reasons, len(busy), len(samples))


def kind_loads(samples: Sequence[ClockSample], spans: Iterable[Span],
               min_busy: int = MIN_BUSY_SAMPLES) -> dict[Hashable, KindLoad]:
    """Per instruction key of ``spans`` (tuples only: not a step's span or non-instruction bucket):
    the sustained clock of the samples taken inside its spans, and its spans' durations."""
    ordered = sorted(samples, key=lambda s: s.t_s)
    times = [s.t_s for s in ordered]
    inside: dict[Hashable, list[ClockSample]] = {}
    durations: dict[Hashable, list[float]] = {}
    for span in spans:
        if not isinstance(span.key, tuple) or span.end_s <= span.start_s:
            continue
        durations.setdefault(span.key, []).append(span.end_s - span.start_s)
        within = ordered[bisect_left(times, span.start_s):bisect_right(times, span.end_s)]
        inside.setdefault(span.key, []).extend(within)
    return {key: KindLoad(sustained_clock(inside[key], min_busy), tuple(durations[key])) for key in durations}


def busy_reasons(samples: Iterable[ClockSample]) -> frozenset[ClockEventReason]:
    """Every reason reported by a busy sample (``gpu_idle`` never is)."""
    out: set[ClockEventReason] = set()
    for s in samples:
        if s.busy:
            out |= s.reasons
    return frozenset(out)


def reason_names(reasons: Iterable[ClockEventReason]) -> list[str]:
    """The reasons as NVML's names, sorted (profiles and events store these)."""
    return sorted(r.value for r in reasons)


def nearest_clock(mhz: int, supported: Sequence[int]) -> int:
    """The supported clock nearest ``mhz`` (the lower one on a tie): a sampled clock on the grid."""
    return min(supported, key=lambda f: (abs(f - mhz), f))
