"""Failed reads of the energy counter: when to read again, when the counter is dead, and which
spans its updates no longer measure.

Why: an NVML counter read fails now and then (a busy driver, a moment's error), and one failure
must not end measurement for the rest of the run; yet a step whose span the updates do not cover,
because reads failed, has no energy to report (an interpolation across the gap is a guess, 0 J or
the counter's last value are wrong). ``EnergyPoller`` keeps one ``ReadFailures`` and tells it of
each failed read and each update; a step asks ``covers``.
"""

from __future__ import annotations

import bisect
import threading

from perseus.gpu.errors import GPUError, GPULibraryMissingError, GPUNotFoundError, GPUNotSupportedError

# Failed reads are retried, each wait twice the last (from the poll interval) up to BACKOFF_MAX_S: a
# moment's error passes, and a counter that keeps failing is read once a second, not 200 times.
BACKOFF_MAX_S = 1.0
# Reads failing this long in a row: the counter is dead (``EnergyPoller.error``) and the run measures
# time only. Longer than a driver's own recovery (seconds), short enough that no plan runs long unmeasured.
DEAD_AFTER_S = 10.0
# A gap in the updates left by failed reads, longer than this many counter periods, leaves the steps
# over it unmeasured: two, as the first update after reads resume may come a period late.
GAP_PERIODS = 2.0
# Errors no retry mends (``translate_nvml_error``): the GPU is gone or has no counter; dead at once.
_PERMANENT = (GPUNotFoundError, GPUNotSupportedError, GPULibraryMissingError)


class ReadFailures:
    """One poller's failed reads: the backoff of the failures in a row, and the gaps they left in
    the counter's updates (the poller's thread reports, any thread asks ``covers``)."""

    def __init__(self, interval_s: float) -> None:
        self.interval_s = interval_s
        self.count = 0  # failed reads so far
        self._since: float | None = None  # the first of the failed reads in a row
        self._backoff_s = interval_s
        self._lock = threading.Lock()
        self._open: float | None = None  # where failed reads stopped the updates, until the next update
        self._gaps: list[tuple[float, float]] = []  # closed gaps longer than their bound, in time order

    @property
    def failing(self) -> bool:
        """Whether the last read failed."""
        return self._since is not None

    @property
    def gap_open(self) -> bool:
        """Whether reads failed since the last update."""
        return self._open is not None

    def failed(self, exc: GPUError, now: float, last_update_s: float | None) -> float | None:
        """A read failed at ``now`` (the last update came at ``last_update_s``): the seconds to wait
        before the next read, None once the counter is dead (failing for ``DEAD_AFTER_S``, or an
        error no retry mends)."""
        self.count += 1
        if self._since is None:
            self._since = now
            with self._lock:
                if self._open is None:  # the updates stop here (until the first one after reads resume)
                    self._open = now if last_update_s is None else last_update_s
        if isinstance(exc, _PERMANENT) or now - self._since >= DEAD_AFTER_S:
            return None
        wait, self._backoff_s = self._backoff_s, min(2 * self._backoff_s, BACKOFF_MAX_S)
        return wait

    def answered(self) -> float:
        """A read answered: the failures in a row end; the seconds to wait before the next read."""
        self._since, self._backoff_s = None, self.interval_s
        return self.interval_s

    def updated(self, t_s: float, longest_s: float) -> None:
        """The counter's first update after failed reads, at ``t_s``, closes their gap: kept when it
        is longer than ``longest_s``."""
        with self._lock:
            if self._open is not None and t_s - self._open > longest_s:
                self._gaps.append((self._open, t_s))
            self._open = None

    def covers(self, t0: float, t1: float, longest_s: float) -> bool:
        """Whether the updates measure [t0, t1]: no gap longer than ``longest_s`` that failed reads
        left overlaps it (an open one counts from where the updates stopped)."""
        with self._lock:
            open_from = self._open
            i = bisect.bisect_right(self._gaps, t0, key=lambda g: g[1])  # the first gap ending after t0;
            closed = self._gaps[i:i + 1]  # gaps are disjoint and in order: no later one starts before it
        if open_from is not None and t1 > open_from + longest_s:
            return False
        return not any(start < t1 for start, _ in closed)
