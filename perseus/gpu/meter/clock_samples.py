"""The SM clock a card sustains under a load, from samples the energy poller's thread takes.

Why: an unlocked card does not run at its top supported clock under every load. A real H200 ran a
dense bf16 GEMM stage at 1,530 MHz (an H100: 1,380 MHz) with reason ``sw_power_cap``, and a
memory-bound loop at 1,980 MHz on the same card (docs/gpu.md). Locking a clock above the sustained
one changes nothing: the card throttles back to it. So the profiling sweep starts at the sustained
clock, and "max" and "default clocks" mean what the unlocked card does under this load.

Samples are read on the poller thread only (``EnergyPoller(clocks=True)``), never on the training
thread. A sample whose reasons include ``gpu_idle`` was taken between kernels (a pipeline bubble)
and says nothing about the clock under load, so only busy samples count.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from statistics import median_low
from typing import Any

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


@dataclass(frozen=True)
class SustainedClock:
    """The clock the card ran at while busy (median of busy samples; None when too few) and every
    reason it reported then."""

    mhz: int | None
    reasons: frozenset[ClockEventReason]
    busy_samples: int
    samples: int

    def as_dict(self) -> dict[str, Any]:
        return {"mhz": self.mhz, "reasons": reason_names(self.reasons), "busy_samples": self.busy_samples,
                "samples": self.samples}


UNKNOWN = SustainedClock(None, frozenset(), 0, 0)


def sustained_clock(samples: Sequence[ClockSample], min_busy: int = MIN_BUSY_SAMPLES) -> SustainedClock:
    """The median clock of the busy samples and the reasons they carried."""
    busy = [s for s in samples if s.busy]
    reasons = busy_reasons(busy)
    if len(busy) < max(min_busy, 1):
        return SustainedClock(None, reasons, len(busy), len(samples))
    return SustainedClock(int(median_low(s.mhz for s in busy)), reasons, len(busy), len(samples))


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
