"""Per-instruction energy from a coarse energy counter, and P_blocking measurement.

The problem: on A100/H100 the NVML energy counter advances only every ~100 ms, while a pipeline
instruction lasts a few ms. Differencing the counter around one instruction gives 0 or a whole
period's energy. The method here:

1. ``EnergyPoller`` polls the counter (default every 2 ms) in a background thread and records the
   instants it changes (midpoint of the two polls around the change: ±1 ms).
2. Consecutive update instants delimit intervals ``i`` with exactly known energy ``ΔE_i``.
3. ``attribute_energy`` (``attribution.py``) solves, by least squares over all intervals,
       ΔE_i = Σ_k P_k · overlap_i(k) + P_idle · idle_i
   where overlap_i(k) is the time instructions of key ``k`` ran inside what interval ``i``
   measured (``counter.py``: the whole interval, or the part a part-time meter samples). Keys are
   arbitrary (e.g. ``("forward", 1410)`` for a per-frequency profiling window).
4. Energy per instruction of key ``k`` = P_k × its mean duration; standard errors come from the
   regression covariance σ²(AᵀA)⁻¹.

The error sources (boundary-instant jitter, power varying within a key) are independent across
intervals and shrink as 1/√(#intervals); see docs/gpu.md for the measured error.
"""

from __future__ import annotations

import bisect
import math
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from enum import Enum
from typing import Any

import numpy as np

# The counter's types and attribution have modules of their own; callers import them from here too.
from perseus.gpu.meter.attribution import IDLE as IDLE, AttributionResult as AttributionResult
from perseus.gpu.meter.attribution import KeyEnergy as KeyEnergy, attribute_energy as attribute_energy
from perseus.gpu.meter.clock_samples import ClockSample
from perseus.gpu.meter.counter import CounterUpdate, MeasurementError as MeasurementError, counter_period_s
from perseus.gpu.device import ENERGY_UPDATE_PERIOD_S, GPUDevice
from perseus.gpu.errors import GPUError
from perseus.gpu.meter.read_failures import GAP_PERIODS, ReadFailures


class EnergyPoller:
    """Records the instants a (coarse) energy counter changes.

    Run it as a background thread (``start``/``stop``, or ``with``) or call ``poll_once`` or ``tick``
    yourself (virtual-time tests). Polling costs one counter read per ``interval_s``; a failed one is
    retried with backoff, the gap it leaves in the updates is known (``covers``; ``read_failures.py``).

    With ``clocks``, each poll also samples the SM clock and clock-event reasons, at most every
    ``clock_every_s`` (``meter/clock_samples.py``): this thread is the only one that reads the device
    after start-up, so the training thread never pays for it. The newest ``clock_keep`` are kept.
    """

    def __init__(self, device: GPUDevice, interval_s: float = 0.002,
                 clock: Callable[[], float] = time.perf_counter, *, clocks: bool = False,
                 clock_every_s: float = 0.01, clock_keep: int = 4096) -> None:
        self.device = device
        self.interval_s = interval_s
        self._clock = clock
        self._lock = threading.Lock()
        self._updates: list[CounterUpdate] = []
        self._last_t: float | None = None
        self._last_e: float | None = None
        self._last_stamp: float | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.polls = 0
        self._clocks = clocks
        self._clock_every_s = clock_every_s
        self._next_clock_t = -math.inf
        self._clock_samples: deque[ClockSample] = deque(maxlen=clock_keep)
        self.error: str | None = None  # why the thread stopped reading (a device error), once it did
        self.read_failures = ReadFailures(interval_s)

    def poll_once(self) -> CounterUpdate | None:
        e, stamp = self.device.energy_counter_reading()  # a stamp: the device knows when it advanced (the simulator)
        t = self._clock()
        self.polls += 1
        update = None
        if stamp is not None:
            # The device says when its counter advanced: a new stamp is an update (the value may
            # differ in its last bits between readers that integrated from different points).
            if self._last_stamp is not None and stamp > self._last_stamp:
                update = CounterUpdate(stamp, e)
            if self._last_stamp is None or stamp > self._last_stamp:
                self._last_stamp = stamp
        elif self._last_e is not None and e != self._last_e:
            assert self._last_t is not None
            update = CounterUpdate(0.5 * (self._last_t + t), e)
        if update is not None:
            with self._lock:
                self._updates.append(update)
            if self.read_failures.gap_open:
                self.read_failures.updated(update.t_s, self.gap_s())
        self._last_t, self._last_e = t, e
        if self._clocks and t >= self._next_clock_t:
            self._next_clock_t = t + self._clock_every_s
            self._sample_clock(t)
        return update

    def _sample_clock(self, t: float) -> None:
        try:
            mhz = self.device.current_sm_clock_mhz()
            reasons = self.device.clock_event_reasons() if mhz is not None else frozenset()
        except GPUError:
            mhz = None
        if mhz is None:  # the backend cannot tell (or failed): no samples, the sustained clock stays unknown
            self._clocks = False
            return
        sample = ClockSample(t, int(mhz), reasons)
        with self._lock:
            self._clock_samples.append(sample)

    def clock_samples(self, since_s: float = -math.inf) -> list[ClockSample]:
        """The clock samples taken at or after ``since_s`` (the poller's clock)."""
        with self._lock:
            return [s for s in self._clock_samples if s.t_s >= since_s]

    def tick(self) -> float | None:
        """One read as the thread makes it: the wait before the next (backing off while reads fail),
        None once the counter is dead (``error`` set; ``ReadFailures.failed``)."""
        try:
            self.poll_once()
        except GPUError as exc:
            if not self.read_failures.failing:  # without device stamps the next good read is a baseline:
                self._last_e = None  # when the counter changed while reads failed is unknown
            last = self.latest()
            wait = self.read_failures.failed(exc, self._clock(), last.t_s if last is not None else None)
            if wait is None and self.error is None:
                self.error = str(exc)
            return wait
        return self.read_failures.answered()

    def gap_s(self) -> float:
        """The longest gap in the updates that still measures: ``GAP_PERIODS`` counter periods."""
        period = self.counter_period_s() or self.device.energy_update_period_s or ENERGY_UPDATE_PERIOD_S
        return GAP_PERIODS * period

    def covers(self, t0: float, t1: float) -> bool:
        """Whether the updates measure [t0, t1]: no gap failed reads left overlaps it (``gap_s``)."""
        return self.read_failures.covers(t0, t1, self.gap_s())

    def _run(self) -> None:
        # The first (baseline) read happens here too: every read is on this thread, none on the
        # caller's (a training thread must not pay 2.4 ms per read).
        while not self._stop.is_set():
            wait = self.tick()
            if wait is None:  # the counter is dead: no more updates; the owner reports it once (``error``)
                return
            self._stop.wait(wait)

    def start(self) -> EnergyPoller:
        if self._thread is None:
            self._stop.clear()
            self._thread = threading.Thread(target=self._run, name="perseus-energy-poller", daemon=True)
            self._thread.start()
        return self

    def stop(self) -> None:
        if self._thread is not None:
            self._stop.set()
            self._thread.join()
            self._thread = None

    def __enter__(self) -> EnergyPoller:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def updates(self) -> list[CounterUpdate]:
        """Counter updates observed so far (the first reading is a baseline, not an update)."""
        with self._lock:
            return list(self._updates)

    def latest(self) -> CounterUpdate | None:
        """The newest counter update (what the step hooks take instead of reading the counter:
        a read costs 2.4 ms on an H200, and the value only changes every counter period)."""
        with self._lock:
            return self._updates[-1] if self._updates else None

    def since(self, t_s: float) -> list[CounterUpdate]:
        """The updates from the last one at or before ``t_s`` on (a step's window: the copy stays
        short however long the run)."""
        with self._lock:
            updates = self._updates
            i = bisect.bisect_right(updates, t_s, key=lambda u: u.t_s)
            return updates[max(0, i - 1):]

    def counter_period_s(self) -> float | None:
        """The counter's update period as measured so far (median gap), None before 3 updates."""
        with self._lock:
            recent = self._updates[-64:]
        return counter_period_s(recent)


class AfterLast(Enum):
    """What ``energy_at`` reads after the counter's last update."""

    HOLD = "hold"  # the last update's value: nothing is claimed past what the counter said
    EXTEND = "extend"  # the last interval's power carried on: a time read before the counter's next update


def energy_at(updates: Sequence[CounterUpdate], t: float, after_last: AfterLast) -> float:
    """The energy counter at ``t``: linear between the updates around it (power constant within
    one counter period: the finest the counter can say); before the first update, its value;
    after the last, as ``after_last`` says. NaN without updates."""
    if not updates:
        return math.nan
    first, last = updates[0], updates[-1]
    if t <= first.t_s or len(updates) == 1:
        return first.energy_j if t <= first.t_s else last.energy_j
    if t >= last.t_s:
        if after_last is AfterLast.HOLD:
            return last.energy_j
        a, b = updates[-2], last
    else:
        i = bisect.bisect_right(updates, t, key=lambda u: u.t_s)
        a, b = updates[i - 1], updates[i]
    return a.energy_j + (b.energy_j - a.energy_j) * (t - a.t_s) / (b.t_s - a.t_s)


def poll_interval_s(period_s: float) -> float:
    """A poll rate matched to the counter: 20 polls per period (5 ms for 100 ms), which places
    each update within ±2.5 ms and leaves the poller thread idle most of the time."""
    return min(0.02, max(0.001, period_s / 20))


def attribution_window_s(period_s: float, intervals: int = 30) -> float:
    """How long to measure so attribution has ``intervals`` counter intervals: the standard
    error of an attributed power shrinks as 1/√intervals."""
    return period_s * (intervals + 1)


# -- blocking power -----------------------------------------------------------------------------
@dataclass(frozen=True)
class BlockingPowerResult:
    """Average power while the GPU was idle/blocked, from counter updates inside the window."""

    power_w: float
    window_s: float  # time between the first and last counter update used
    n_updates: int
    instant_power_w: float  # mean of instantaneous power readings (cross-check); NaN if none


def power_from_updates(updates: Sequence[CounterUpdate], t_from: float = -math.inf,
                       t_to: float = math.inf) -> tuple[float, float, int]:
    """(average power, window, n) from the first to the last update within [t_from, t_to]."""
    inside = [u for u in updates if t_from <= u.t_s <= t_to]
    if len(inside) < 2:
        raise MeasurementError(
            f"only {len(inside)} energy-counter update(s) inside the window; make it longer than "
            "two counter periods"
        )
    window = inside[-1].t_s - inside[0].t_s
    return (inside[-1].energy_j - inside[0].energy_j) / window, window, len(inside)


def measure_blocking_power(
    device: GPUDevice,
    duration_s: float = 2.0,
    *,
    poll_interval_s: float = 0.002,
    clock: Callable[[], float] = time.perf_counter,
    sleep: Callable[[float], None] = time.sleep,
    timeout_s: float | None = None,
) -> BlockingPowerResult:
    """Power of this GPU while it runs nothing, over ≥ ``duration_s`` between counter updates.

    Single-device version: the caller guarantees the GPU is idle (no kernels queued). For the
    value Perseus needs on a real job (a rank blocked in a P2P receive) use
    ``measure_blocking_power_p2p``.
    """
    poller = EnergyPoller(device, poll_interval_s, clock)
    timeout = timeout_s if timeout_s is not None else duration_s + 10.0
    deadline = clock() + timeout
    instant: list[float] = []
    poller.poll_once()
    first: CounterUpdate | None = None
    while True:
        u = poller.poll_once()
        if u is not None and first is None:
            first = u
        if first is not None and u is not None and u.t_s - first.t_s >= duration_s:
            break
        if clock() > deadline:
            raise MeasurementError(
                f"the energy counter of {device.name} did not advance enough within "
                f"{timeout:.1f} s; is the GPU busy or the counter unsupported?"
            )
        if len(instant) < 10_000:
            instant.append(device.power_w())
        sleep(poll_interval_s)
    p, window, n = power_from_updates(poller.updates())
    return BlockingPowerResult(p, window, n, float(np.mean(instant)) if instant else math.nan)


def measure_blocking_power_p2p(
    device: GPUDevice,
    peer: int,
    duration_s: float = 2.0,
    *,
    group: Any = None,
    poll_interval_s: float = 0.002,
) -> BlockingPowerResult:
    """P_blocking as Perseus defines it: this rank blocked in a P2P receive while ``peer`` sleeps.

    Both ranks of the pair call this (collective over the pair only, not the group). Two
    rounds: the lower rank is blocked first, then the higher one, so each rank returns its own
    GPU's value. Tensors live on the current CUDA device for NCCL and on the CPU otherwise.
    """
    import torch
    import torch.distributed as dist

    me = dist.get_rank()
    if peer == me:
        raise GPUError("measure_blocking_power_p2p needs a different peer rank")
    on_gpu = dist.get_backend(group) == "nccl"
    tensor_device = torch.device("cuda", torch.cuda.current_device()) if on_gpu else torch.device("cpu")
    return measure_blocking_power_pair(
        device, lambda t: dist.send(t, dst=peer, group=group), lambda t: dist.recv(t, src=peer, group=group),
        me < peer, duration_s, poll_interval_s=poll_interval_s, tensor_device=tensor_device)


def measure_blocking_power_pair(
    device: GPUDevice,
    send: Callable[[Any], object],
    recv: Callable[[Any], object],
    first: bool,
    duration_s: float = 2.0,
    *,
    poll_interval_s: float = 0.002,
    tensor_device: Any = None,
) -> BlockingPowerResult:
    """``measure_blocking_power_p2p`` over any two-rank line (``send``/``recv`` of a one-element
    tensor to and from the partner; ``first``: this rank is blocked in the first round)."""
    import torch

    token = torch.zeros(1, device=tensor_device or torch.device("cpu"))
    measured: tuple[Sequence[CounterUpdate], float, float] | None = None
    for blocked_round in (True, False):
        if blocked_round == first:
            with EnergyPoller(device, poll_interval_s) as poller:
                send(token)  # "start sleeping"
                t0 = time.perf_counter()
                recv(token)  # blocked here for ~duration_s
                t1 = time.perf_counter()
            measured = (poller.updates(), t0, t1)
        else:
            recv(token)
            time.sleep(duration_s)
            send(token)
    # Evaluated only after both rounds: raising between them (a window too short for the
    # counter) would leave the peer blocked in its round forever.
    assert measured is not None
    updates, t0, t1 = measured
    p, window, n = power_from_updates(updates, t0, t1)
    return BlockingPowerResult(p, window, n, math.nan)
