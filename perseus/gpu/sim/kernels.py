"""Kernels on a simulated GPU: busy sections the clock in force really stretches.

Why: a lower clock must really slow the pipeline down. The training process does its (CPU) work
for an instruction between ``begin`` and ``end``; that work is the kernel's duration at the
maximum clock, and ``end`` sleeps until the kernel would have finished at the clocks in force
while it ran (a clock change that lands mid-kernel changes the rest of it, as on hardware). One
kernel runs at a time per GPU, owned by a process; a kernel whose process died is cleared when
the GPU is next opened.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass

from perseus.gpu.errors import GPUError, GPUInvalidArgumentError
from perseus.gpu.sim.integrator import StateIntegrator
from perseus.gpu.sim.state import SimStateFile


@dataclass(frozen=True)
class KernelRecord:
    """One finished kernel: when it started and ran (CLOCK_MONOTONIC s), its max-clock work, the
    clock set at its start and its end, and when the clock set at its end took effect."""

    start: float
    duration_s: float
    work_s: float
    start_mhz: int
    end_mhz: int
    clock_applied_at: float


def pid_alive(pid: int) -> bool:
    """Whether process ``pid`` still exists (one of another user counts as alive)."""
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class KernelRunner:
    """Runs this process's kernels on one simulated GPU's shared state."""

    def __init__(self, file: SimStateFile, physics: StateIntegrator, index: int,
                 clock: Callable[[], float], sleep: Callable[[float], None]) -> None:
        self._file = file
        self._physics = physics
        self._index = index
        self._clock = clock
        self._sleep = sleep

    def clear_stale(self) -> None:
        """End a kernel whose process died (at the time of this call, as if it had run till now)."""
        with self._file.update() as st:
            if st.busy and not pid_alive(st.busy_pid):
                self._physics.settle(st, self._clock())
                st.busy, st.busy_pid = 0, 0
                self._physics.refresh_power(st)

    def begin(self, activity: float, compute_fraction: float, *, start_at: float | None = None) -> None:
        """Start a kernel (see ``SimulatedGPU.begin_busy``)."""
        if not 0.0 <= activity <= 1.0 or not 0.0 <= compute_fraction <= 1.0:
            raise GPUInvalidArgumentError(
                f"activity ({activity}) and compute_fraction ({compute_fraction}) must be in [0, 1]"
            )
        physics = self._physics
        me = os.getpid()
        with self._file.update() as st:
            if st.busy:
                who = "this process" if st.busy_pid == me else f"process {st.busy_pid}"
                if st.busy_pid == me or pid_alive(st.busy_pid):
                    raise GPUError(f"simulated GPU {self._index} is already running an instruction ({who}); "
                                   "call end_busy() first")
            now = self._clock()
            if start_at is not None:
                now = min(start_at, now)
                physics.rewind_idle(st, now)
                now = max(now, st.t_ref)
            physics.settle(st, now)
            st.busy, st.busy_pid = 1, me
            st.activity, st.compute_fraction = float(activity), float(compute_fraction)
            st.busy_start, st.slow_integral, st.busy_progress = now, 0.0, 0.0
            st.busy_start_mhz = physics.set_clock(st)
            physics.refresh_power(st)

    def end(self, cpu_elapsed_s: float | None = None, *, min_s: float = 0.0) -> float:
        """Sleep until the kernel's work is done; return its duration (see ``SimulatedGPU.end_busy``)."""
        physics = self._physics
        with self._file.update() as st:
            if not st.busy or st.busy_pid != os.getpid():
                raise GPUError(f"end_busy() on simulated GPU {self._index} without a matching begin_busy()")
            now = self._clock()
            physics.settle(st, now)
            start = st.busy_start
            wall = now - start
            cpu = wall if cpu_elapsed_s is None else float(cpu_elapsed_s)
            if cpu < 0:
                raise GPUInvalidArgumentError(f"cpu_elapsed_s must be >= 0, got {cpu}")
            work = max(cpu, float(min_s))
            if st.busy_progress >= work:  # the caller's own measure of the work, shorter than the section: done
                mean_slow = (st.slow_integral / wall if wall > 0
                             else physics.model.slowdown(physics.effective_clock(st), st.compute_fraction))
                end = start + work * mean_slow
            else:
                end = physics.kernel_end(st, now, work - st.busy_progress)
        while end > now:
            self._sleep(end - now)
            with self._file.update() as st:
                # Progress up to the planned end: a newer request that landed before it leaves work.
                physics.settle(st, end)
                if st.busy_progress >= work * (1 - 1e-9):
                    break
                now = self._clock()
                end = physics.kernel_end(st, now, work - st.busy_progress)
        return self._finish(start, max(end - start, 0.0), work)

    def end_at(self, until: float) -> float:
        """End a kernel that runs until told (a stream's spin) at ``until``: its length is its work."""
        st = self._file.read()
        if not st.busy or st.busy_pid != os.getpid():
            raise GPUError(f"end_busy() on simulated GPU {self._index} without a matching begin_busy()")
        if until > (now := self._clock()):
            self._sleep(until - now)
        duration = max(until - st.busy_start, 0.0)
        return self._finish(st.busy_start, duration, duration)

    def _finish(self, start: float, duration: float, work: float) -> float:
        physics = self._physics
        with self._file.update() as st:
            # The kernel ended at start + duration even if this process woke up later (a busy
            # host): busy power up to then, blocking power after, as on a real GPU.
            now = self._clock()
            physics.settle(st, min(now, start + duration))
            st.busy, st.busy_pid = 0, 0
            st.last_busy_start, st.last_busy_s, st.last_busy_work_s = start, duration, work
            st.last_busy_mhz, st.last_busy_start_mhz = physics.set_clock(st), st.busy_start_mhz
            st.last_busy_applied_at = st.applied_at
            physics.refresh_power(st)
            physics.settle(st, now)
        return duration

    def last(self) -> KernelRecord:
        """What the last finished kernel did."""
        st = self._file.read()
        return KernelRecord(st.last_busy_start, st.last_busy_s, st.last_busy_work_s, st.last_busy_start_mhz,
                            st.last_busy_mhz, st.last_busy_applied_at)
