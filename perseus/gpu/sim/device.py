"""A simulated GPU that drives real code: real processes, real wall-clock slowdown, real files.

Why: the controller, measurement and runtime must be exercised end to end on machines without a
GPU. The training process does its (CPU) work for an instruction inside ``sim.busy()``; the real
elapsed time is taken as the kernel's duration at the maximum clock, and on exit the simulator
sleeps the extra time the current SM clock would have cost (``t(f) − t_max``), so a lower clock
really slows the pipeline. Energy is integrated continuously (busy power during instructions,
P_blocking in between) and exposed through a coarse counter that, like A100/H100 NVML, only
advances at update-period boundaries. State lives in a shared file (``sim.state``) so the
controller process's clock changes are seen by the trainer, and vice versa.

Equations and parameters: see ``perseus.gpu.sim.dvfs``.
"""

from __future__ import annotations

import math
import os
import random
import threading
import time
import uuid as uuidlib
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from perseus.gpu.device import BusyResult, ClockEventReason, GPUDevice, check_sm_clock
from perseus.gpu.sim.dvfs import PRESETS, DVFSModel, get_preset
from perseus.gpu.errors import GPUError, GPUInvalidArgumentError, GPUPermissionError
from perseus.gpu.sim.stream import SimStream
from perseus.gpu.sim.state import SimParams, SimState, SimStateFile, default_state_dir, state_path
from perseus.gpu.spec import GPUSpec

DEFAULT_PRESET = "A100-SXM"
DEFAULT_UPDATE_PERIOD_S = 0.1
SIM_DRIVER_VERSION = "perseus-sim-1"
_NOISY_BOUNDARIES = 64  # per read, at most this many counter updates get their own noise draw


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


class VirtualClock:
    """A manual clock for deterministic single-process tests: ``sleep`` advances time instantly."""

    def __init__(self, start: float = 1000.0) -> None:
        self.t = start

    def now(self) -> float:
        return self.t

    def sleep(self, dt: float) -> None:
        self.t += max(0.0, dt)


def _pid_alive(pid: int) -> bool:
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class SimulatedGPU(GPUDevice):
    """A simulated GPU whose state is shared by every process that opens the same ``index``.

    Opening an index whose state file exists *attaches* to it (clock lock, energy, model are
    kept, like a real GPU after a crash); ``reset_state=True`` starts fresh. Parameters left as
    ``None`` come from the existing file or the defaults; explicit ones must match the file.
    """

    def __init__(
        self,
        index: int = 0,
        *,
        preset: str | None = None,
        model: DVFSModel | None = None,
        state_dir: str | os.PathLike[str] | None = None,
        energy_update_period_s: float | None = None,
        noise: float | None = None,
        seed: int | None = None,
        switch_latency_s: float | None = None,
        stream_depth: int = 0,
        allow_clock_setting: bool = True,
        reset_state: bool = False,
        clock: Callable[[], float] | None = None,
        sleep: Callable[[float], None] | None = None,
    ) -> None:
        if not isinstance(index, int) or index < 0:
            raise GPUInvalidArgumentError(f"simulated GPU index must be an int >= 0, got {index!r}")
        if preset is not None and model is not None:
            raise GPUInvalidArgumentError("pass either preset= or model=, not both")
        if energy_update_period_s is not None and energy_update_period_s < 0:
            raise GPUInvalidArgumentError("energy_update_period_s must be >= 0 (0 = continuous counter)")
        if noise is not None and not 0 <= noise < 0.5:
            raise GPUInvalidArgumentError("noise is a relative standard deviation in [0, 0.5)")
        if switch_latency_s is not None and not 0 <= switch_latency_s <= 1.0:
            raise GPUInvalidArgumentError("switch_latency_s is the delay of a clock change in seconds, in [0, 1]")
        if not isinstance(stream_depth, int) or stream_depth < 0:
            raise GPUInvalidArgumentError("stream_depth is how many kernels the host may run ahead (0 = synchronous)")
        self._index = index
        self.stream_depth = stream_depth
        self._stream: SimStream | None = None
        self._clock = clock or time.monotonic
        self._sleep = sleep or time.sleep
        self._allow_clocks = allow_clock_setting
        self._state_dir = Path(state_dir) if state_dir is not None else default_state_dir()
        explicit: SimParams = {}
        if preset is not None or model is not None:
            explicit["model"] = (model or get_preset(preset or DEFAULT_PRESET)).to_dict()
        if energy_update_period_s is not None:
            explicit["energy_update_period_s"] = float(energy_update_period_s)
        if noise is not None:
            explicit["noise"] = float(noise)
        if seed is not None:
            explicit["seed"] = int(seed)
        if switch_latency_s is not None:
            explicit["switch_latency_s"] = float(switch_latency_s)
        params: SimParams = {
            "model": PRESETS[DEFAULT_PRESET].to_dict(),
            "energy_update_period_s": DEFAULT_UPDATE_PERIOD_S,
            "noise": 0.0,
            "seed": 0,
            "switch_latency_s": 0.0,
            **explicit,
        }
        period = float(params["energy_update_period_s"])
        params["counter_phase_s"] = random.Random(int(params["seed"])).uniform(0, period)
        now = self._clock()
        m = DVFSModel(**params["model"])
        init = SimState(power_limit_w=m.tdp_w, t_ref=now, power_w=m.p_blocking_w,
                        counter_k=math.floor((now - params["counter_phase_s"]) / period) if period > 0 else 0)
        self._file = SimStateFile(state_path(index, self._state_dir), params, reset=reset_state, init_state=init)
        fp = self._file.params
        mismatched = [k for k, v in explicit.items() if fp.get(k) != v]
        if mismatched:
            self._file.close()
            raise GPUError(
                f"Simulated GPU {index} at {self._file.path} already exists with different "
                f"{', '.join(mismatched)}; pass reset_state=True to re-create it, leave those "
                "arguments unset to attach, or use another PERSEUS_SIM_GPU_DIR"
            )
        self.model = DVFSModel(**fp["model"])
        self.energy_update_period_s = float(fp["energy_update_period_s"])
        self.noise = float(fp["noise"])
        self.seed = int(fp["seed"])
        self.switch_latency_s = float(fp.get("switch_latency_s", 0.0))
        self._phase = float(fp["counter_phase_s"])
        self._clocks = self.model.supported_sm_clocks()
        self._rng = random.Random(self.seed * 7919 + index)
        self._uuid = "GPU-" + str(uuidlib.uuid5(uuidlib.NAMESPACE_URL, f"perseus-sim/{self.model.name}/{index}"))
        # Energy-counter reads per thread (``threading.get_ident``): tests and benchmarks check that
        # the training thread makes none (a real one costs 2.4 ms on an H200).
        self.energy_reads: Counter[int] = Counter()
        self._clear_stale_busy()

    # -- identity ---------------------------------------------------------------------------
    @property
    def name(self) -> str:
        return self.model.name

    @property
    def uuid(self) -> str:
        return self._uuid

    @property
    def architecture(self) -> str:
        return self.model.architecture

    @property
    def index(self) -> int:
        return self._index

    @property
    def asynchronous(self) -> bool:
        """Whether instructions run on ``stream`` (the host runs ahead) instead of inside the hooks."""
        return self.stream_depth > 0

    @property
    def stream(self) -> SimStream:
        """This process's stream onto the GPU, run by a device thread (asynchronous mode)."""
        if self._stream is None:
            if not self.asynchronous:
                raise GPUError(f"simulated GPU {self._index} is synchronous; open it with stream_depth >= 1")
            self._stream = SimStream(self, self.stream_depth, self._clock, event_new_s=self.model.event_new_s,
                                     event_record_s=self.model.event_record_s)
        return self._stream

    @property
    def driver_version(self) -> str:
        return SIM_DRIVER_VERSION

    @property
    def simulated(self) -> bool:
        return True

    @property
    def state_path(self) -> Path:
        """The shared state file (inspect it from any process with ``read_sim_state``)."""
        return self._file.path

    def spec(self) -> GPUSpec:
        """Picklable description another process (the controller) uses to attach to this GPU."""
        return GPUSpec(kind="sim", index=self._index,
                       sim={"state_dir": str(self._state_dir.resolve()),
                            "allow_clock_setting": self._allow_clocks})

    # -- model helpers ----------------------------------------------------------------------
    def _set_clock(self, st: SimState) -> int:
        return st.locked_mhz if st.locked else self.model.sm_max_mhz

    def _effective_clock(self, st: SimState) -> int:
        return self.model.throttled_clock(self._set_clock(st), st.activity, st.power_limit_w)

    def _true_energy(self, st: SimState, t: float) -> float:
        return st.energy_j + st.power_w * max(0.0, t - st.t_ref)

    def _boundary(self, k: int) -> float:
        return self._phase + k * self.energy_update_period_s

    def _eps(self, k: int) -> float:
        if self.noise == 0:
            return 0.0
        e = random.Random(self.seed * 1_000_003 + k).gauss(0.0, self.noise)
        return max(-0.5, min(0.5, e))

    def _counter_at(self, st: SimState, k: int) -> float:
        """Readable counter at boundary ``k`` (> st.counter_k); power is constant since t_ref."""
        value, prev = st.counter_j, st.counter_true_j
        last_noisy = min(k, st.counter_k + _NOISY_BOUNDARIES)
        for j in range(st.counter_k + 1, last_noisy + 1):
            e = self._true_energy(st, self._boundary(j))
            value += (e - prev) * (1.0 + self._eps(j))
            prev = e
        if k > last_noisy:
            value += self._true_energy(st, self._boundary(k)) - prev
        return value

    def _settle(self, st: SimState, now: float) -> None:
        """Advance the integrators to ``now`` before any change of power state; a clock change
        on its way (switch latency) takes effect at its time on the way."""
        if st.pending and st.pending_at <= now:
            self._settle_segment(st, st.pending_at)
            st.locked, st.locked_mhz = st.pending_locked, st.pending_mhz
            st.pending, st.applied_at = 0, st.pending_at
            self._refresh_power(st)
        self._settle_segment(st, now)

    def _settle_segment(self, st: SimState, now: float) -> None:
        now = max(now, st.t_ref)
        period = self.energy_update_period_s
        if period > 0:
            k = math.floor((now - self._phase) / period)
            if k > st.counter_k:
                st.counter_j = self._counter_at(st, k)
                st.counter_true_j = self._true_energy(st, self._boundary(k))
                st.counter_k = k
        dt = now - st.t_ref
        if st.busy:
            slow = self.model.slowdown(self._effective_clock(st), st.compute_fraction)
            st.slow_integral += slow * dt
            st.busy_progress += dt / slow
        st.energy_j += st.power_w * dt
        st.t_ref = now

    def _refresh_power(self, st: SimState) -> None:
        st.power_w = (self.model.busy_power_w(self._effective_clock(st), st.activity)
                      if st.busy else self.model.p_blocking_w)

    def _clear_stale_busy(self) -> None:
        with self._file.update() as st:
            if st.busy and not _pid_alive(st.busy_pid):
                self._settle(st, self._clock())
                st.busy, st.busy_pid = 0, 0
                self._refresh_power(st)

    def _now_state(self) -> SimState:
        """Snapshot for reading: a clock change whose latency has passed is in effect (the copy is
        settled up to that moment only, so power stays constant from ``t_ref`` on; nothing is
        written back)."""
        st = self._file.read()
        if st.pending and st.pending_at <= self._clock():
            self._settle(st, st.pending_at)
        return st

    # -- clocks -----------------------------------------------------------------------------
    def supported_sm_clocks_mhz(self) -> list[int]:
        return list(self._clocks)

    def max_memory_clock_mhz(self) -> int:
        return self.model.memory_clock_mhz

    def _check_allowed(self, what: str) -> None:
        if not self._allow_clocks:
            raise GPUPermissionError(f"{what} on simulated GPU {self._index}")

    def set_locked_sm_clock(self, mhz: int) -> None:
        """Lock to ``mhz`` snapped to the supported grid (hardware rounds the same way)."""
        self._check_allowed("Locking the SM clock")
        target = self.model.nearest_clock(check_sm_clock(mhz, self._clocks))
        with self._file.update() as st:
            self._request_clock(st, 1, target)
            st.n_lock += 1

    def reset_locked_sm_clock(self) -> None:
        self._check_allowed("Resetting the SM clock")
        with self._file.update() as st:
            self._request_clock(st, 0, 0)
            st.n_reset += 1

    def _request_clock(self, st: SimState, locked: int, mhz: int) -> None:
        """A clock change takes effect ``switch_latency_s`` after the request (at once when 0);
        a newer request replaces one still on its way, as the driver applies the latest."""
        now = self._clock()
        self._settle(st, now)
        if self.switch_latency_s > 0:
            st.pending, st.pending_locked, st.pending_mhz = 1, locked, mhz
            st.pending_at = now + self.switch_latency_s
            return
        st.pending = 0
        st.locked, st.locked_mhz = locked, mhz
        st.applied_at = now
        self._refresh_power(st)

    def lock_memory_clock(self, mhz: int) -> None:
        self._check_allowed("Locking the memory clock")
        if mhz != self.model.memory_clock_mhz:
            raise GPUInvalidArgumentError(
                f"Memory clock {mhz} MHz is not supported; choose one of [{self.model.memory_clock_mhz}]"
            )
        with self._file.update() as st:
            st.mem_locked_mhz = int(mhz)

    def reset_memory_clock(self) -> None:
        self._check_allowed("Resetting the memory clock")
        with self._file.update() as st:
            st.mem_locked_mhz = 0

    def locked_sm_clock_mhz(self) -> int | None:
        """The clock the GPU is held at: the locked clock, or the default when unlocked."""
        return self._set_clock(self._now_state())

    def is_clock_locked(self) -> bool:
        return bool(self._now_state().locked)

    def effective_sm_clock_mhz(self, activity: float = 1.0) -> int:
        """Clock a kernel of this activity would run at now (after power-limit throttling)."""
        st = self._now_state()
        st.activity = activity
        return self._effective_clock(st)

    def current_sm_clock_mhz(self) -> int | None:
        """The clock the running kernel runs at (below the set one under the power limit); the
        set clock when idle."""
        st = self._now_state()
        return self._effective_clock(st) if st.busy else self._set_clock(st)

    def clock_event_reasons(self) -> frozenset[ClockEventReason]:
        """``sw_power_cap`` while a kernel runs below the set clock for the power limit; ``gpu_idle``
        when nothing runs; ``applications_clocks_setting`` while a lock holds the clock down."""
        st = self._now_state()
        reasons = set()
        if not st.busy:
            reasons.add(ClockEventReason.IDLE)
        elif self._effective_clock(st) < self._set_clock(st):
            reasons.add(ClockEventReason.SW_POWER_CAP)
        if st.locked and st.locked_mhz < self.model.sm_max_mhz:
            reasons.add(ClockEventReason.APPLICATIONS_CLOCKS)
        return frozenset(reasons)

    def _pay_energy_read(self) -> None:
        self.energy_reads[threading.get_ident()] += 1
        if self.model.energy_read_s > 0:
            self._sleep(self.model.energy_read_s)

    # -- energy and power -------------------------------------------------------------------
    def total_energy_j(self) -> float:
        """The coarse counter: advances only at update-period boundaries (0 = continuous)."""
        self._pay_energy_read()
        st = self._now_state()
        now = self._clock()
        if self.energy_update_period_s <= 0:
            return self._true_energy(st, now)
        k = math.floor((now - self._phase) / self.energy_update_period_s)
        return st.counter_j if k <= st.counter_k else self._counter_at(st, k)

    def energy_counter_reading(self) -> tuple[float, float | None]:
        """(counter value, time of its last update): the simulator knows when its coarse counter
        advanced, so the energy poller need not guess it from when it looked (a busy process
        looks late). CLOCK_MONOTONIC seconds."""
        self._pay_energy_read()
        st = self._now_state()
        now = self._clock()
        if self.energy_update_period_s <= 0:
            return self._true_energy(st, now), now
        k = math.floor((now - self._phase) / self.energy_update_period_s)
        value = st.counter_j if k <= st.counter_k else self._counter_at(st, k)
        return value, self._boundary(max(k, st.counter_k))

    def true_energy_j(self) -> float:
        """Exact integrated energy (ground truth for tests; real GPUs have no such reading)."""
        return self._true_energy(self._now_state(), self._clock())

    def power_w(self) -> float:
        if self.model.power_read_s > 0:
            self._sleep(self.model.power_read_s)
        p = self._now_state().power_w
        if self.noise:
            p *= 1.0 + max(-0.5, min(0.5, self._rng.gauss(0.0, self.noise)))
        return p

    def power_limit_w(self) -> float:
        return self._file.read().power_limit_w

    def power_limit_range_w(self) -> tuple[float, float]:
        return self.model.power_limit_min_w, self.model.tdp_w

    def set_power_limit_w(self, w: float) -> None:
        self._check_allowed("Setting the power limit")
        lo, hi = self.power_limit_range_w()
        if not lo <= w <= hi:
            raise GPUInvalidArgumentError(f"Power limit {w} W is outside the allowed range {lo}–{hi} W")
        with self._file.update() as st:
            self._settle(st, self._clock())
            st.power_limit_w = float(w)
            self._refresh_power(st)

    def can_set_clocks(self) -> bool:
        return self._allow_clocks

    # -- running instructions ---------------------------------------------------------------
    def begin_busy(self, activity: float = 1.0, compute_fraction: float = 0.8, *, start_at: float | None = None) -> None:
        """Mark the start of an instruction (kernel work) with the given SM activity (0–1) and
        compute-bound fraction α (0–1; the rest is memory-bound and ignores the SM clock).
        ``start_at``: the kernel started earlier than now (the stream's device thread woke late
        after the previous kernel; a real GPU starts the next one at once)."""
        if not 0.0 <= activity <= 1.0 or not 0.0 <= compute_fraction <= 1.0:
            raise GPUInvalidArgumentError(
                f"activity ({activity}) and compute_fraction ({compute_fraction}) must be in [0, 1]"
            )
        me = os.getpid()
        with self._file.update() as st:
            if st.busy:
                who = "this process" if st.busy_pid == me else f"process {st.busy_pid}"
                if st.busy_pid == me or _pid_alive(st.busy_pid):
                    raise GPUError(f"simulated GPU {self._index} is already running an instruction ({who}); "
                                   "call end_busy() first")
            now = self._clock()
            if start_at is not None:
                now = min(start_at, now)
                self._rewind_idle(st, now)
                now = max(now, st.t_ref)
            self._settle(st, now)
            st.busy, st.busy_pid = 1, me
            st.activity, st.compute_fraction = float(activity), float(compute_fraction)
            st.busy_start, st.slow_integral, st.busy_progress = now, 0.0, 0.0
            st.busy_start_mhz = self._set_clock(st)
            self._refresh_power(st)

    def _rewind_idle(self, st: SimState, t: float) -> None:
        """Take back idle time integrated past ``t`` (a late-waking stream thread settled it), so a
        kernel can start at ``t``; only while no counter update and no clock change lies after ``t``."""
        if st.busy or st.pending or t >= st.t_ref or st.applied_at > t:
            return
        if self.energy_update_period_s > 0 and self._boundary(st.counter_k) > t:
            return
        st.energy_j -= st.power_w * (st.t_ref - t)
        st.t_ref = t

    def end_busy(self, cpu_elapsed_s: float | None = None, *, min_s: float = 0.0) -> float:
        """End the instruction: sleep until its simulated duration has passed; return that duration.

        ``cpu_elapsed_s`` is the instruction's work, its duration at the max clock; ``None`` uses
        the wall time since ``begin_busy``; either is raised to ``min_s`` (a nominal kernel time
        the work is padded to). The kernel progresses at ``1 / slowdown`` of the clock in force at
        each moment, so a clock change that lands while it runs (switch latency) changes the rest
        of it, as on hardware; this call returns once the work is done: one sleep per clock change
        on the way, so a busy machine's wake-up delays are paid about once per instruction.
        """
        with self._file.update() as st:
            if not st.busy or st.busy_pid != os.getpid():
                raise GPUError(f"end_busy() on simulated GPU {self._index} without a matching begin_busy()")
            now = self._clock()
            self._settle(st, now)
            start = st.busy_start
            wall = now - start
            cpu = wall if cpu_elapsed_s is None else float(cpu_elapsed_s)
            if cpu < 0:
                raise GPUInvalidArgumentError(f"cpu_elapsed_s must be >= 0, got {cpu}")
            work = max(cpu, float(min_s))
            if st.busy_progress >= work:  # the caller's own measure of the work, shorter than the section: done
                mean_slow = (st.slow_integral / wall if wall > 0
                             else self.model.slowdown(self._effective_clock(st), st.compute_fraction))
                end = start + work * mean_slow
            else:
                end = self._kernel_end(st, now, work - st.busy_progress)
        while end > now:
            self._sleep(end - now)
            with self._file.update() as st:
                # Progress up to the planned end: a newer request that landed before it leaves work.
                self._settle(st, end)
                if st.busy_progress >= work * (1 - 1e-9):
                    break
                now = self._clock()
                end = self._kernel_end(st, now, work - st.busy_progress)
        return self._finish(start, max(end - start, 0.0), work)

    def _finish(self, start: float, duration: float, work: float) -> float:
        with self._file.update() as st:
            # The kernel ended at start + duration even if this process woke up later (a busy
            # host): busy power up to then, blocking power after, as on a real GPU.
            now = self._clock()
            self._settle(st, min(now, start + duration))
            st.busy, st.busy_pid = 0, 0
            st.last_busy_start, st.last_busy_s, st.last_busy_work_s = start, duration, work
            st.last_busy_mhz, st.last_busy_start_mhz = self._set_clock(st), st.busy_start_mhz
            st.last_busy_applied_at = st.applied_at
            self._refresh_power(st)
            self._settle(st, now)
        return duration

    def _kernel_end(self, st: SimState, now: float, work_left: float) -> float:
        """When ``work_left`` max-clock seconds are done, from ``now``, at the clock in force and
        the one on its way (settles ``st`` to ``now``)."""
        self._settle(st, now)
        if work_left <= 0:
            return now
        slow = self.model.slowdown(self._effective_clock(st), st.compute_fraction)
        end = now + work_left * slow
        if st.pending and st.pending_at < end:
            work_left -= (st.pending_at - now) / slow
            nxt = SimState(**vars(st))
            nxt.locked, nxt.locked_mhz = nxt.pending_locked, nxt.pending_mhz
            end = st.pending_at + work_left * self.model.slowdown(self._effective_clock(nxt), st.compute_fraction)
        return end

    def last_busy_interval(self) -> tuple[float, float]:
        """(start, simulated duration) of the last finished instruction; start is CLOCK_MONOTONIC.

        The simulated GPU's own timing of its kernels, as CUDA events are a real GPU's: free of
        the host's scheduling noise (``SimulatedKernelTimer`` uses it for profiling).
        """
        st = self._file.read()
        return st.last_busy_start, st.last_busy_s

    def last_kernel(self) -> KernelRecord:
        """What the last finished instruction's kernel did, for clock-switch latency traces."""
        st = self._file.read()
        return KernelRecord(st.last_busy_start, st.last_busy_s, st.last_busy_work_s, st.last_busy_start_mhz,
                            st.last_busy_mhz, st.last_busy_applied_at)

    def kernel_time_s(self, work_s: float, mhz: int, compute_fraction: float = 0.8) -> float:
        """How long ``work_s`` max-clock seconds take held at ``mhz`` (the model, no switch on the way)."""
        st = self._file.read()
        st.locked, st.locked_mhz = 1, int(mhz)
        return work_s * self.model.slowdown(self._effective_clock(st), compute_fraction)

    def last_busy_clock_mhz(self) -> int:
        """The SM clock set (locked, else the default) when the last finished instruction ended:
        the clock it ran at, unlike ``locked_sm_clock_mhz`` which a later request may change."""
        return self._file.read().last_busy_mhz

    @contextmanager
    def busy(self, activity: float = 1.0, compute_fraction: float = 0.8) -> Iterator[BusyResult]:
        """``with sim.busy(): do_the_work()`` — the block's real time is the max-clock duration;
        on exit it is stretched to the current clock (see ``end_busy``)."""
        result = BusyResult()
        self.begin_busy(activity, compute_fraction)
        try:
            yield result
        finally:
            result.duration_s = self.end_busy()

    def run_for(self, t_max_s: float, activity: float = 1.0, compute_fraction: float = 0.8) -> float:
        """A synthetic kernel that would take ``t_max_s`` at the max clock (no CPU work: sleeps)."""
        self.begin_busy(activity, compute_fraction)
        try:
            self._sleep(t_max_s)
        finally:
            duration = self.end_busy(t_max_s)
        return duration

    def snapshot(self) -> SimState:
        """Raw shared state (clock lock, energy integrators, counters)."""
        return self._file.read()

    def close(self) -> None:
        if self._stream is not None:
            self._stream.close()
            self._stream = None
        self._file.close()
