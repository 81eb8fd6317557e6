"""``SimulatedGPU``: the ``GPUDevice`` contract over a simulated GPU's shared state file.

Why: the controller, measurement and runtime must be exercised end to end on machines without a
GPU, with real processes, real wall-clock slowdown and real files. Every process that opens the
same index sees one GPU (``state``): the controller process's clock changes slow the trainer's
kernels down (``kernels``), and energy is integrated continuously (busy power during kernels,
P_blocking in between) behind a coarse counter that, like A100/H100 NVML, only advances at
update-period boundaries (``integrator``). In the asynchronous mode (``stream_depth`` ≥ 1) the
kernels run on a stream a device thread drives (``stream``).

Equations and parameters: see ``perseus.gpu.sim.dvfs``.
"""

from __future__ import annotations

import os
import random
import threading
import time
import uuid as uuidlib
from collections import Counter
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from perseus.gpu.device import BusyResult, ClockEventReason, GPUDevice, check_sm_clock
from perseus.gpu.errors import GPUError, GPUInvalidArgumentError, GPUNotSupportedError, GPUPermissionError
from perseus.gpu.sim.dvfs import DVFSModel, replay_preset
from perseus.gpu.sim.faults import SimFaults
from perseus.gpu.sim.integrator import StateIntegrator
from perseus.gpu.sim.kernels import KernelRecord, KernelRunner
from perseus.gpu.sim.params import check_params, explicit_params, open_state_file
from perseus.gpu.sim.state import SimState, default_state_dir, state_path
from perseus.gpu.sim.stream import SimStream
from perseus.gpu.sim.virtual_clock import VirtualClock
from perseus.gpu.spec import GPUSpec
from perseus.profile.model import InstructionProfile, Profile

__all__ = ["SimulatedGPU", "VirtualClock"]

SIM_DRIVER_VERSION = "perseus-sim-1"
MIG_PROBLEM = ("MIG mode is enabled, and a clock change would change every MIG instance's clock; "
               "measure-only works, or disable MIG (`sudo nvidia-smi -i <index> -mig 0`)")


class SimulatedGPU(GPUDevice):
    """A simulated GPU whose state is shared by every process that opens the same ``index``.

    Opening an index whose state file exists *attaches* to it (clock lock, energy, model are
    kept, like a real GPU after a crash); ``reset_state=True`` starts fresh. Parameters left as
    ``None`` come from the existing file or the defaults; explicit ones must match the file.
    ``replay`` (a directory of measured runs, or ``{"dir": ..., "time_scale": ...}``) is the replay
    preset instead of ``preset`` or ``model``: GPU ``index`` replays stage ``index`` of those runs
    (``dvfs.replay_preset``).
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
        faults: SimFaults | dict[str, Any] | None = None,
        replay: str | os.PathLike[str] | Mapping[str, Any] | None = None,
        stream_depth: int = 0,
        allow_clock_setting: bool = True,
        reset_state: bool = False,
        clock: Callable[[], float] | None = None,
        sleep: Callable[[float], None] | None = None,
    ) -> None:
        if not isinstance(index, int) or index < 0:
            raise GPUInvalidArgumentError(f"simulated GPU index must be an int >= 0, got {index!r}")
        if replay is not None:  # a JSON config's ``sim_gpu`` names a directory, not a DVFSModel
            if preset is not None or model is not None:
                raise GPUInvalidArgumentError("replay= is the GPU's preset: pass it without preset= or model=")
            model = replay_preset(replay, index)
        check_params(preset=preset, model=model, energy_update_period_s=energy_update_period_s, noise=noise,
                     switch_latency_s=switch_latency_s)
        if not isinstance(stream_depth, int) or stream_depth < 0:
            raise GPUInvalidArgumentError("stream_depth is how many kernels the host may run ahead (0 = synchronous)")
        if isinstance(faults, dict):  # a JSON config's ``sim_gpu`` (the runtime's) cannot hold a SimFaults
            faults = SimFaults.from_dict(faults)
        self._index = index
        self.stream_depth = stream_depth
        self._stream: SimStream | None = None
        self._clock = clock or time.monotonic
        self._sleep = sleep or time.sleep
        self._allow_clocks = allow_clock_setting
        self._state_dir = Path(state_dir) if state_dir is not None else default_state_dir()
        explicit = explicit_params(preset=preset, model=model, energy_update_period_s=energy_update_period_s,
                                   noise=noise, seed=seed, switch_latency_s=switch_latency_s, faults=faults)
        self._file = open_state_file(index, state_path(index, self._state_dir), explicit, reset=reset_state,
                                     now=self._clock())
        self._physics = StateIntegrator.from_params(self._file.params)
        self.faults = SimFaults.from_dict(self._file.params.get("faults"))
        self._created_s = float(self._file.params.get("created_s", 0.0))
        self._clocks = self.model.supported_sm_clocks()
        self._rng = random.Random(self.seed * 7919 + index)
        self._uuid = "GPU-" + str(uuidlib.uuid5(uuidlib.NAMESPACE_URL, f"perseus-sim/{self.model.name}/{index}"))
        # Energy-counter reads per thread (``threading.get_ident``): tests and benchmarks check that
        # the training thread makes none (a real one costs 2.4 ms on an H200).
        self.energy_reads: Counter[int] = Counter()
        self._kernels = KernelRunner(self._file, self._physics, index, self._clock, self._sleep)
        self._kernels.clear_stale()

    # -- the device's parameters, as its state file records them ----------------------------
    @property
    def model(self) -> DVFSModel:
        return self._physics.model

    @property
    def energy_update_period_s(self) -> float:
        return self._physics.energy_update_period_s

    @property
    def noise(self) -> float:
        return self._physics.noise

    @property
    def seed(self) -> int:
        return self._physics.seed

    @property
    def switch_latency_s(self) -> float:
        return self._physics.switch_latency_s

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
                                     event_record_s=self.model.event_record_s, fails=self.faults.event_fails,
                                     spin_activity=self.model.spin_activity)
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

    # -- state ----------------------------------------------------------------------------
    def _now_state(self) -> SimState:
        """Snapshot for reading: a clock change whose latency has passed is in effect (the copy is
        settled up to that moment only, so power stays constant from ``t_ref`` on; nothing is
        written back)."""
        st = self._file.read()
        if st.pending and st.pending_at <= self._clock():
            self._physics.settle(st, st.pending_at)
        return st

    # -- clocks -----------------------------------------------------------------------------
    def supported_sm_clocks_mhz(self) -> list[int]:
        return list(self._clocks)

    def max_memory_clock_mhz(self) -> int:
        return self.model.memory_clock_mhz

    def _since_created_s(self) -> float:
        return self._clock() - self._created_s

    def _check_allowed(self, what: str) -> None:
        if self.faults.mig:
            raise GPUNotSupportedError(f"{what} on simulated GPU {self._index}: {MIG_PROBLEM}")
        if not self._allow_clocks or self.faults.no_cap_sys_admin:
            raise GPUPermissionError(f"{what} on simulated GPU {self._index}")

    def _check_clock_lock(self, what: str) -> None:
        """A clock lock or reset: allowed, and not refused by a fault right now."""
        self._check_allowed(what)
        if self.faults.lock_refused(self._since_created_s()):
            raise GPUPermissionError(f"{what} on simulated GPU {self._index} (refused by an injected fault)")

    def set_locked_sm_clock(self, mhz: int) -> None:
        """Lock to ``mhz`` snapped to the supported grid (hardware rounds the same way)."""
        self._check_clock_lock("Locking the SM clock")
        target = self.model.nearest_clock(check_sm_clock(mhz, self._clocks))
        with self._file.update() as st:
            self._physics.request_clock(st, 1, target, self._clock())
            st.n_lock += 1

    def reset_locked_sm_clock(self) -> None:
        self._check_clock_lock("Resetting the SM clock")
        with self._file.update() as st:
            self._physics.request_clock(st, 0, 0, self._clock())
            st.n_reset += 1

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
        return self._physics.set_clock(self._now_state())

    def is_clock_locked(self) -> bool:
        return bool(self._now_state().locked)

    def effective_sm_clock_mhz(self, activity: float = 1.0) -> int:
        """Clock a kernel of this activity would run at now (after power-limit throttling)."""
        st = self._now_state()
        st.activity = activity
        return self._physics.effective_clock(st)

    def current_sm_clock_mhz(self) -> int | None:
        """The clock the running kernel runs at (below the set one under the power limit); the
        set clock when idle."""
        st = self._now_state()
        return self._physics.effective_clock(st) if st.busy else self._physics.set_clock(st)

    def clock_event_reasons(self) -> frozenset[ClockEventReason]:
        """``sw_power_cap`` while a kernel runs below the set clock for the power limit; ``gpu_idle``
        when nothing runs; ``applications_clocks_setting`` while a lock holds the clock down."""
        st = self._now_state()
        reasons = set()
        if not st.busy:
            reasons.add(ClockEventReason.IDLE)
        elif self._physics.effective_clock(st) < self._physics.set_clock(st):
            reasons.add(ClockEventReason.SW_POWER_CAP)
        if st.locked and st.locked_mhz < self.model.sm_max_mhz:
            reasons.add(ClockEventReason.APPLICATIONS_CLOCKS)
        return frozenset(reasons)

    # -- energy and power -------------------------------------------------------------------
    def _pay_energy_read(self) -> None:
        self.energy_reads[threading.get_ident()] += 1
        if self.model.energy_read_s > 0:
            self._sleep(self.model.energy_read_s)
        if self.faults.energy_fails(self._since_created_s()):
            raise GPUError(f"Reading energy of simulated GPU {self._index} failed: Unknown Error (an injected fault)")

    def total_energy_j(self) -> float:
        """The coarse counter: advances only at update-period boundaries (0 = continuous)."""
        self._pay_energy_read()
        return self._physics.counter_reading(self._now_state(), self._clock())[0]

    def energy_counter_reading(self) -> tuple[float, float | None]:
        """(counter value, time of its last update): the simulator knows when its coarse counter
        advanced, so the energy poller need not guess it from when it looked (a busy process
        looks late). CLOCK_MONOTONIC seconds. A model with a real card's meter (part-time, late)
        says no time, as NVML does not."""
        self._pay_energy_read()
        value, at = self._physics.counter_reading(self._now_state(), self._clock())
        m = self.model
        return value, (None if m.meter_sampled_fraction < 1 or m.meter_lag_s > 0 else at)

    def true_energy_j(self) -> float:
        """Exact integrated energy (ground truth for tests; real GPUs have no such reading)."""
        return self._physics.true_energy(self._now_state(), self._clock())

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
            self._physics.settle(st, self._clock())
            st.power_limit_w = float(w)
            self._physics.refresh_power(st)

    def can_set_clocks(self) -> bool:
        return self._allow_clocks and not self.faults.no_cap_sys_admin and not self.faults.mig

    def control_problem(self) -> str | None:
        if self.faults.mig:
            return f"simulated GPU {self._index}: {MIG_PROBLEM}"
        if self.faults.no_cap_sys_admin:
            return (f"simulated GPU {self._index}: this process is root in a user namespace without CAP_SYS_ADMIN, "
                    "so it may not change clocks; grant the capability (docker --cap-add SYS_ADMIN, Kubernetes "
                    "securityContext.capabilities.add: [SYS_ADMIN]), or use perseus clockd or zeusd")
        return None

    # -- running instructions ---------------------------------------------------------------
    def begin_busy(self, activity: float = 1.0, compute_fraction: float = 0.8, *, start_at: float | None = None) -> None:
        """Mark the start of an instruction (kernel work) with the given SM activity (0–1) and
        compute-bound fraction α (0–1; the rest is memory-bound and ignores the SM clock).
        ``start_at``: the kernel started earlier than now (the stream's device thread woke late
        after the previous kernel; a real GPU starts the next one at once)."""
        self._kernels.begin(activity, compute_fraction, start_at=start_at)

    def end_busy(self, cpu_elapsed_s: float | None = None, *, min_s: float = 0.0,
                 until: float | None = None) -> float:
        """End the instruction: sleep until its simulated duration has passed; return that duration.

        ``cpu_elapsed_s`` is the instruction's work, its duration at the max clock; ``None`` uses
        the wall time since ``begin_busy``; either is raised to ``min_s`` (a nominal kernel time
        the work is padded to). The kernel progresses at ``1 / slowdown`` of the clock in force at
        each moment, so a clock change that lands while it runs (switch latency) changes the rest
        of it, as on hardware; this call returns once the work is done: one sleep per clock change
        on the way, so a busy machine's wake-up delays are paid about once per instruction.
        ``until``: the kernel ends then, whatever its work (a stream's spin ends when the host's next
        kernel comes).
        """
        return self._kernels.end(cpu_elapsed_s, min_s=min_s) if until is None else self._kernels.end_at(until)

    def last_busy_interval(self) -> tuple[float, float]:
        """(start, simulated duration) of the last finished instruction; start is CLOCK_MONOTONIC.

        The simulated GPU's own timing of its kernels, as CUDA events are a real GPU's: free of
        the host's scheduling noise (``SimulatedKernelTimer`` uses it for profiling).
        """
        st = self._file.read()
        return st.last_busy_start, st.last_busy_s

    def last_kernel(self) -> KernelRecord:
        """What the last finished instruction's kernel did, for clock-switch latency traces."""
        return self._kernels.last()

    def kernel_time_s(self, work_s: float, mhz: int, compute_fraction: float = 0.8) -> float:
        """How long ``work_s`` max-clock seconds take held at ``mhz`` (the model, no switch on the way)."""
        st = self._file.read()
        st.locked, st.locked_mhz = 1, int(mhz)
        return work_s * self.model.slowdown(self._physics.effective_clock(st), compute_fraction)

    def exact_profile(self, work_s: Mapping[str, float], clocks: Sequence[int], *, stage: int = 0) -> Profile:
        """The profile this GPU honours exactly, for tests and benchmarks that need a plan whose
        predictions the simulator meets: for each kind of ``work_s`` (max-clock seconds, full
        activity), its kernel time and busy energy at each of ``clocks``, under the power limit."""
        m = self.model
        entries = {}
        for kind, work in work_s.items():
            times = [self.kernel_time_s(work, f) for f in clocks]
            energies = [m.busy_power_w(m.throttled_clock(f, 1.0, m.tdp_w), 1.0) * s for f, s in zip(clocks, times)]
            entries[(stage, 0, kind)] = InstructionProfile(tuple(clocks), tuple(times), tuple(energies))
        return Profile(entries, m.p_blocking_w, m.name)

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
