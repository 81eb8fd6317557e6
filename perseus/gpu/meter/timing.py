"""Per-instruction timing: a CPU path (``perf_counter``) and a CUDA path (CUDA events).

Why two paths: on a GPU, kernels run asynchronously, so host timestamps measure launch time, not
execution. CUDA events recorded on the stream at begin/end measure execution; they are resolved
once per step (one ``synchronize`` on the last event), never per instruction, so timing doesn't
serialize the pipeline. Without CUDA (simulated GPU, CPU runs) host time *is* execution time.

Timestamps share the clock of ``EnergyPoller`` (``time.perf_counter``, CLOCK_MONOTONIC on Linux)
so instructions can be aligned with energy-counter updates.
"""

from __future__ import annotations

import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Hashable
from dataclasses import dataclass
from typing import Any, Protocol

from perseus.gpu.errors import GPUError


@dataclass(frozen=True)
class TimedInstruction:
    """One executed instruction; ``key`` groups instructions that share a power level, e.g.
    ``("forward", 1410)`` — (kind, SM clock) for a per-frequency profiling window."""

    key: Hashable
    start_s: float
    end_s: float

    @property
    def duration_s(self) -> float:
        return self.end_s - self.start_s


class InstructionTimer(ABC):
    """``begin(key)`` / ``end()`` around each instruction, ``resolve()`` once per step."""

    @abstractmethod
    def begin(self, key: Hashable) -> None: ...

    @abstractmethod
    def end(self) -> None: ...

    @abstractmethod
    def resolve(self) -> list[TimedInstruction]:
        """Instructions timed since the last resolve, in execution order (clears them)."""


class CPUInstructionTimer(InstructionTimer):
    """Host timestamps; exact when the work is synchronous (CPU or simulated GPU)."""

    def __init__(self, clock: Callable[[], float] = time.perf_counter) -> None:
        self._clock = clock
        self._open: tuple[Hashable, float] | None = None
        self._done: list[TimedInstruction] = []

    def begin(self, key: Hashable) -> None:
        if self._open is not None:
            raise GPUError(f"instruction {key!r} began while {self._open[0]!r} is still open")
        self._open = (key, self._clock())

    def end(self) -> None:
        t = self._clock()
        if self._open is None:
            raise GPUError("end() without a matching begin()")
        key, t0 = self._open
        self._open = None
        self._done.append(self._timed(key, t0, t))

    def _timed(self, key: Hashable, t0: float, t1: float) -> TimedInstruction:
        return TimedInstruction(key, t0, t1)

    def resolve(self) -> list[TimedInstruction]:
        done, self._done = self._done, []
        return done


class KernelTimes(Protocol):
    """A device that times its own kernels (the simulated GPU)."""

    def last_busy_interval(self) -> tuple[float, float]:
        """(start, duration) of the last finished kernel; start is CLOCK_MONOTONIC."""
        ...


class SimulatedKernelTimer(CPUInstructionTimer):
    """Kernel times as a simulated GPU ran them, the way CUDA events time a real GPU's kernels.

    The host's view of an instruction adds what is not the kernel: hook cost, sleep overshoot,
    the process descheduled on a busy machine. The simulated GPU knows each busy section's start
    and stretched duration, so that is what profiling records. An instruction that ran no busy
    section (work outside the simulated GPU) is timed with host timestamps. Both clocks are
    ``CLOCK_MONOTONIC`` (``time.monotonic``), the energy poller's too on Linux.
    """

    def __init__(self, device: KernelTimes, clock: Callable[[], float] = time.monotonic) -> None:
        super().__init__(clock)
        self._device = device

    def _timed(self, key: Hashable, t0: float, t1: float) -> TimedInstruction:
        start, duration = self._device.last_busy_interval()
        if t0 <= start <= t1:
            return TimedInstruction(key, start, start + duration)
        return TimedInstruction(key, t0, t1)


class CUDAInstructionTimer(InstructionTimer):
    """CUDA events on the current stream, recycled from a pool; resolved lazily per step.

    Absolute times are anchored at resolve: after synchronizing the last end event, its
    completion is taken as "now" (an upper bound; the bias is the host's wait latency, tiny
    next to the ~100 ms energy-counter period it is used with).
    """

    def __init__(self, clock: Callable[[], float] = time.perf_counter) -> None:
        import torch

        if not torch.cuda.is_available():
            raise GPUError("CUDAInstructionTimer needs a CUDA build of torch and a visible GPU")
        self._torch = torch
        self._clock = clock
        self._pool: list[Any] = []
        self._open: tuple[Hashable, Any] | None = None
        self._records: list[tuple[Hashable, Any, Any]] = []

    def _event(self) -> Any:
        return self._pool.pop() if self._pool else self._torch.cuda.Event(enable_timing=True)

    def begin(self, key: Hashable) -> None:
        if self._open is not None:
            raise GPUError(f"instruction {key!r} began while {self._open[0]!r} is still open")
        ev = self._event()
        ev.record()
        self._open = (key, ev)

    def end(self) -> None:
        if self._open is None:
            raise GPUError("end() without a matching begin()")
        ev = self._event()
        ev.record()
        key, begin = self._open
        self._open = None
        self._records.append((key, begin, ev))

    def resolve(self) -> list[TimedInstruction]:
        if not self._records:
            return []
        first, last = self._records[0][1], self._records[-1][2]
        last.synchronize()
        base = self._clock() - first.elapsed_time(last) / 1e3
        out = [TimedInstruction(key, base + first.elapsed_time(b) / 1e3, base + first.elapsed_time(e) / 1e3)
               for key, b, e in self._records]
        for _, b, e in self._records:
            self._pool += (b, e)
        self._records = []
        return out


def cuda_timing_available() -> bool:
    """True only with a CUDA build of torch and a visible GPU (never on CPU-only machines)."""
    try:
        import torch
    except ImportError:
        return False
    return bool(torch.cuda.is_available())


def make_instruction_timer(prefer_cuda: bool = True) -> InstructionTimer:
    """CUDA events when a GPU is usable and wanted, host timestamps otherwise."""
    if prefer_cuda and cuda_timing_available():
        return CUDAInstructionTimer()
    return CPUInstructionTimer()
