"""``GPUPort``: where the runtime opens, controls and reads its GPU.

The GPU layer opens the device and chooses the path its clocks change through
(``perseus.gpu.clock_service``); the port wraps the device and its clock controller so that

- ``request`` (hot path, once per instruction whose clock differs from the last one) only
  hands a number to the controller and returns; ``request_at`` hands it a time to make it at,
- ``apply`` (step boundary, profiling) waits until the clock is in effect,
- ``reset`` always leaves the GPU at default clocks, whatever happened before.

It also gives the runtime what reads the GPU off the training thread or on the GPU's own clock:
the energy poller (every energy read on its thread) and the clock under load it samples, the GPU
timeline (``gpu_timeline.py``), the instruction timer, P_blocking; on a simulated GPU, the simulator
itself (``sim_device``), whose kernels the runtime runs (``sim_kernels.py``). ``open_port`` opens
every rank's port or stops every rank at start-up together.
"""

from __future__ import annotations

import logging
import os
from collections import deque
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace
from time import monotonic
from typing import TYPE_CHECKING, Any, Callable, Sequence

from perseus.errors import ConfigError, PerseusError
from perseus.gpu.device import ENERGY_UPDATE_PERIOD_S
from perseus.gpu.errors import GPUError
from perseus.gpu.meter.clock_samples import UNKNOWN, SustainedClock
from perseus.runtime.lifecycle import job_error_line

if TYPE_CHECKING:
    from perseus.runtime.port.clock_trace import ClockTrace, SwitchSample
    from perseus.runtime.port.gpu_timeline import GPUTimeline
    from perseus.gpu.control.controller import ClockController
    from perseus.gpu.device import ClockEventReason, GPUDevice
    from perseus.gpu.meter.energy import EnergyPoller
    from perseus.gpu.control.notice import ClockNotice
    from perseus.gpu.sim.device import SimulatedGPU
    from perseus.gpu.meter.timing import InstructionTimer, TimedInstruction
    from perseus.runtime.plane.collective import Collective, PairChannel
    from perseus.runtime.config import PerseusConfig

log = logging.getLogger("perseus.runtime")
# The likely cause of a failed stream follower on a real GPU, and its fix.
# What to do about an energy counter that stopped answering (``take_notices``).
ENERGY_FIX = ("check the GPU's health (nvidia-smi -q, the kernel log for Xid errors); energy savings resume "
              "when the job restarts on a GPU whose counter answers")
# The run events after which this rank keeps default clocks for the rest of the run, and how the
# engine names the cause when a deployed plan falls back on one.
FALLBACK_EVENTS = {
    "clock_failed": "clock control failed",
    "follower_failed": "following the GPU stream failed",
    "energy_failed": "the GPU's energy counter stopped answering",
}

SWITCH_SAMPLES = 256  # clock changes kept (a sweep makes tens; deployment one per plan change)

FOLLOWER_FIX = ("if this job captures CUDA graphs, capture them with torch.cuda.graph(..., "
                "capture_error_mode=\"thread_local\") so the follower thread may poll events meanwhile")


class GPUPort:
    """Clock control and energy reading for one rank's GPU.

    Measure-only mode is the GPU layer's ``NullController``: the port has one code path and
    never asks whether clocks may change.
    """

    def __init__(self, device: GPUDevice, controller: ClockController) -> None:
        self.device = device
        self.controller = controller
        self.supported_mhz: list[int] = list(device.supported_sm_clocks_mhz())
        self.default_mhz: int = int(device.default_sm_clock_mhz())
        self.name: str = str(device.name)
        self.driver_version: str = device.driver_version
        self.current_mhz: int = self.default_mhz
        # Whether the controller can hold a request until a given time (switch latency hiding).
        self.timed_requests: bool = controller.timed_requests
        self._closed = False
        self.energy_error: str | None = None  # set once the energy counter died (its poller's ``error``)
        self.clock_failure: str | None = None  # set by the first ``failed`` notice: default clocks for good
        self.trace: ClockTrace | None = None  # the per-instruction clock trace, which notes each request
        # With a GPU timeline (``open_timeline``) requests follow the stream, and the host's own
        # clock changes drop the requests still on their way.
        self.timeline: GPUTimeline | None = None
        self._poller: EnergyPoller | None = None
        # The clock this card sustains under the job's load, from warm-up (``end_warmup_clocks``).
        self.sustained: SustainedClock = UNKNOWN
        self._poller_started_s = 0.0
        # The clock changes ``apply`` saw land (the latest), whether the device reports its clock
        # (None: not asked yet), and the switch latency requests lead by (``use_switch_latency``).
        self.switch_samples: deque[SwitchSample] = deque(maxlen=SWITCH_SAMPLES)
        self.reports_clock: bool | None = None
        self.switch_latency_s: float | None = None

    # ---------------------------------------------------------------- opening

    @classmethod
    def open(
        cls, backend: str, device_index: int | None, sim_gpu: dict[str, Any], *, control: bool, clock_check_s: float = 0.0,
        zeusd_socket: str | None = None,
    ) -> GPUPort:
        """The port of the configured GPU, its clocks changed through the path the GPU layer
        chooses (``perseus.gpu.clock_service``: clockd, zeusd, the local controller process or,
        unless ``control``, none)."""
        from perseus.gpu.clock_service import open_clock_service

        device, controller = open_clock_service(backend, device_index, sim_gpu, control=control,
                                                clock_check_s=clock_check_s, zeusd_socket=zeusd_socket)
        return cls(device, controller)

    # ---------------------------------------------------------------- clocks

    def request(self, mhz: int) -> None:
        """Ask for a clock without waiting (instruction hooks); noted in the clock trace, if any."""
        if mhz != self.current_mhz:
            self.current_mhz = mhz
            self.controller.set_frequency(mhz)
            if self.trace is not None:
                self.trace.requested(mhz, monotonic())

    def request_at(self, mhz: int, at: float) -> None:
        """Ask for a clock to be requested from the device at CLOCK_MONOTONIC ``at`` (instruction
        hooks; needs ``timed_requests``). Never skipped: a plan's timed requests are its switches."""
        self.current_mhz = mhz
        self.controller.set_frequency(mhz, at)
        if self.trace is not None:
            self.trace.requested(mhz, at)

    def request_now(self, mhz: int) -> None:
        """Ask for a clock at once, dropping the timed requests the controller still holds (a new
        plan's first clock, a step's first after the work between steps ran at default clocks);
        noted in the clock trace, if any."""
        self.current_mhz = mhz
        self.controller.set_frequency(mhz)
        if self.trace is not None:
            self.trace.requested(mhz, monotonic())

    @contextmanager
    def _host_change(self) -> Iterator[None]:
        """Around a clock change the host makes itself: stream requests still on their way are
        dropped first (they belong to work the GPU has finished or that runs at this clock now)."""
        timeline = self.timeline
        if timeline is None:
            yield
            return
        with timeline.lock:
            timeline.invalidate()
            yield

    def stream_request(self, mhz: int, at: float | None) -> None:
        """A request the GPU timeline's follower makes when the GPU reaches its boundary (its
        thread): ``RESET_MHZ`` is default clocks."""
        if mhz <= 0:
            self.current_mhz = self.default_mhz
            self.controller.reset()
            return
        self.current_mhz = mhz
        if at is None:
            self.controller.set_frequency(mhz)
        else:
            self.controller.set_frequency(mhz, at)
        if self.trace is not None:
            self.trace.requested(mhz, monotonic() if at is None else at)

    def apply(self, mhz: int, settle_timeout_s: float = 0.25) -> None:
        """Set a clock and wait until it is in effect (step boundaries only).

        The controller's flush returns once the request is made; a GPU with a switch latency holds
        the clock some milliseconds later, and the profiling sweep would time the step's first
        instructions at the previous clock (seen in clock traces at 20 ms). So wait, at most
        ``settle_timeout_s``, until the device reports the clock (NVML reports the current SM clock,
        which a throttled GPU may never reach: hence the bound). The wait is the switch latency:
        a change seen to land is kept as a ``SwitchSample`` (``switch_samples``; the profiling sweep
        turns its clock changes into the measured latency), on this thread, which waits anyway."""
        import time

        before = None
        if self.controller.enabled:
            try:
                before = self.device.locked_sm_clock_mhz()
            except GPUError:  # unread: no sample; the wait below reads (and fails) as it always did
                before = None
        with self._host_change():
            self.current_mhz = mhz
            asked = time.monotonic()
            self.controller.set_frequency(mhz)
        self.controller.flush()
        if not self.controller.enabled:
            return
        self.reports_clock = before is not None
        last_other, deadline = asked, time.monotonic() + settle_timeout_s
        while True:
            t = time.monotonic()
            if self.device.locked_sm_clock_mhz() == mhz:
                break
            if t >= deadline:
                return  # never seen (throttled, refused): no sample
            last_other = t
            time.sleep(0.0005)
        if before is not None and before != mhz:
            from perseus.runtime.port.clock_trace import SwitchSample

            sample = SwitchSample(int(before), mhz, asked, last_other, t)
            self.switch_samples.append(sample)
            if self.trace is not None:
                self.trace.switched(sample)

    def use_switch_latency(self, seconds: float) -> None:
        """The switch latency the GPU timeline's requests lead by (``StreamClocks``), from the next
        host clock change on: a measured one, known only after the timeline opened. Between steps."""
        self.switch_latency_s = seconds
        if self.timeline is not None:
            self.timeline.lead_by(seconds)

    def release(self) -> None:
        """Ask for default clocks without waiting (fallback from an instruction hook, a probe
        step); with a GPU timeline, for the work launched from here on."""
        if self.timeline is not None:
            from perseus.runtime.port.gpu_timeline import RESET_MHZ

            self.timeline.boundary(RESET_MHZ)
            return
        self.current_mhz = self.default_mhz
        self.controller.reset()

    def reset(self) -> None:
        """Back to default clocks (unlocked), waiting until done; safe to call repeatedly."""
        with self._host_change():
            self.current_mhz = self.default_mhz
            self.controller.reset()
        self.controller.flush()

    # ---------------------------------------------------------------- energy

    def notices(self) -> list[ClockNotice]:
        """What the controller reported unasked since the last call (step ends; never blocks)."""
        return self.controller.notices()

    def take_notices(self, rank: int) -> list[tuple[str, Any]]:
        """The notices since the last call (step ends) as the run's events, each logged once: an
        ``override`` as ``clock_override``; the first ``failed`` as ``clock_failed``, which sets
        ``clock_failure`` (later ones add nothing); a failed stream follower as ``follower_failed``
        (``_follower_failed``); a dead energy counter as ``energy_failed`` (``_energy_failed``)."""
        events: list[tuple[str, Any]] = []
        for notice in self.notices():
            if notice.kind == "override":
                log.warning("perseus: rank %d: %s", rank, notice.describe())
                events.append(("clock_override", notice.as_dict()))
            elif notice.kind == "failed" and self.clock_failure is None:
                self.clock_failure = str(notice.message)
                log.warning("perseus: rank %d: clock control failed (%s); continuing at default clocks for the rest "
                            "of the run", rank, self.clock_failure)
                events.append(("clock_failed", self.clock_failure))
        # after the notices: these retire the controller, whose last notices would be lost
        return events + self._follower_failed(rank) + self._energy_failed(rank)

    def _to_measure_only(self) -> None:
        """Default clocks now and no clock change for the rest of the run: the controller becomes
        the measure-only one (the closed one leaves the GPU unlocked)."""
        from perseus.gpu.control.controller import NullController

        if not self.controller.enabled:
            return
        try:
            self.reset()
        finally:
            retired, self.controller = self.controller, NullController()
            retired.close()

    def _follower_failed(self, rank: int) -> list[tuple[str, Any]]:
        """A GPU timeline whose stream follower failed (``GPUTimeline.failure``): no clock request
        would go out again, so the GPU is reset from the host at once (requests on their way
        dropped) and the port changes no clock for the rest of the run (its controller becomes the
        measure-only one; the closed one leaves the GPU unlocked); steps are host-timed from now on
        (``StepClock``). One line and one ``follower_failed`` event; ``clock_failure`` is set, so a
        plan falls back and a profile is discarded as after a failed clock controller."""
        timeline = self.timeline
        if timeline is None or timeline.failure is None:
            return []
        problem = str(timeline.failure) or type(timeline.failure).__name__
        try:
            self._to_measure_only()  # its reset drops the requests still on their way
        finally:
            self.timeline = None
            timeline.close()
        self.clock_failure = self.clock_failure or f"following the GPU stream failed ({problem})"
        log.warning("perseus: rank %d: following the GPU stream failed (%s); continuing at default clocks for the "
                    "rest of the run; %s", rank, problem, FOLLOWER_FIX)
        return [("follower_failed", problem)]

    def _energy_failed(self, rank: int) -> list[tuple[str, Any]]:
        """The energy counter died (its poller's reads failed for ``read_failures.DEAD_AFTER_S``, or
        the GPU is lost): the run measures time only (its steps' energy is None from here) at default
        clocks for the rest of it, since a plan or a sweep is judged on energy. The port resets the clocks
        and its controller becomes the measure-only one; ``clock_failure`` is set, so a plan falls
        back and a profile is discarded as after a failed clock controller. One line, one
        ``energy_failed`` event."""
        poller = self._poller
        if poller is None or poller.error is None or self.energy_error is not None:
            return []
        self.energy_error = poller.error
        self._to_measure_only()
        self.clock_failure = self.clock_failure or f"the GPU's energy counter stopped answering ({poller.error})"
        log.warning("perseus: rank %d: the GPU's energy counter stopped answering (%s); continuing at default clocks, "
                    "measuring time only; %s", rank, poller.error, ENERGY_FIX)
        return [("energy_failed", poller.error)]

    def energy_j(self) -> float | None:
        """The energy counter now, read on the calling thread (2.4 ms on an H200); None when the
        read fails (never an earlier value: a step would read 0 J)."""
        try:
            return float(self.device.total_energy_j())
        except GPUError:
            return None

    @property
    def is_simulated(self) -> bool:
        return self.device.simulated

    @property
    def sim_device(self) -> SimulatedGPU | None:
        """The simulated GPU under this port (also under a zeusd wrapper), whose kernels the
        runtime stretches; None on a real GPU."""
        from perseus.gpu.sim.device import SimulatedGPU

        device = self.device.underlying
        return device if isinstance(device, SimulatedGPU) else None

    def key_settings(self) -> dict[str, Any]:
        """The settings of this GPU that change what a clock does, for the profile cache key
        (``sources.stage_gpus``): the power limit caps the clock the card sustains, the memory clock
        sets memory-bound kernels' time. A reading that fails is None (that key never matches a read one)."""
        def read(what: Callable[[], float]) -> int | None:
            try:
                return round(float(what()))
            except (GPUError, OSError, ValueError):
                return None

        return {"name": self.name, "power_limit_w": read(self.device.power_limit_w),
                "memory_clock_mhz": read(self.device.max_memory_clock_mhz)}

    def instruction_timer(self) -> InstructionTimer:
        """CUDA-event timer on a real GPU (kernels are asynchronous), the simulated GPU's own
        kernel timing on a simulated one."""
        from perseus.gpu.meter.timing import SimulatedKernelTimer, make_instruction_timer

        sim = self.sim_device
        if sim is not None:
            return SimulatedKernelTimer(sim)
        return make_instruction_timer(prefer_cuda=True)

    def direct_energy_reader(self) -> Callable[[], float] | None:
        """The synchronous simulated GPU's counter, read at step boundaries on the training thread:
        a shared-memory read, not NVML, and its kernels run inside the hooks, so host time is its
        time (steps shorter than the poller's period would read no energy from the poller). None
        for every other device: their energy comes from the poller thread only."""
        sim = self.sim_device if self.is_simulated else None
        if sim is None or sim.asynchronous:
            return None
        return sim.total_energy_j

    def energy_source(self) -> EnergyPoller:
        """The port's own energy poller, started on first use: every energy read is on its thread
        (a real read costs 2.4 ms on an H200), polling 20 times per counter period."""
        if self._poller is None:
            from perseus.gpu.meter.energy import EnergyPoller, poll_interval_s

            # A continuous counter (period 0) is polled at the rate of NVML's.
            period = self.device.energy_update_period_s or ENERGY_UPDATE_PERIOD_S
            self._poller_started_s = monotonic()
            self._poller = EnergyPoller(self.device, max(poll_interval_s(period), 0.002), clock=monotonic,
                                        clocks=True).start()
        return self._poller

    # ---------------------------------------------------------------- the clock under load

    def end_warmup_clocks(self, instructions: Sequence[TimedInstruction] = ()) -> SustainedClock:
        """The clock the unlocked card sustained in the later half of warm-up (the poller's busy
        samples, snapped to a supported clock) and the reasons it reported, and the same per
        instruction key of warm-up's timed ``instructions`` (``kind_loads``); kept as ``sustained``."""
        from perseus.gpu.meter.clock_samples import kind_loads, nearest_clock, sustained_clock

        now = monotonic()
        since = self._poller_started_s + 0.5 * (now - self._poller_started_s)
        samples = self.energy_source().clock_samples(since)
        found = sustained_clock(samples)
        loads = kind_loads(samples, [i for i in instructions if i.start_s >= since])
        if self.supported_mhz:
            def snap(clock: SustainedClock) -> SustainedClock:
                return clock if clock.mhz is None else replace(clock, mhz=nearest_clock(clock.mhz, self.supported_mhz))

            found = snap(found)
            loads = {key: replace(load, clock=snap(load.clock)) for key, load in loads.items()}
        self.sustained = found = replace(found, by_key=loads)
        return found

    def clock_reasons_since(self, t_s: float) -> frozenset[ClockEventReason]:
        """The reasons busy clock samples reported since CLOCK_MONOTONIC ``t_s``."""
        from perseus.gpu.meter.clock_samples import busy_reasons

        return busy_reasons(self.energy_source().clock_samples(t_s))

    def open_timeline(self, switch_latency_s: float, instructions: int) -> GPUTimeline | None:
        """The GPU timeline (``gpu_timeline.py``) where the GPU runs behind the host: a simulated GPU
        in asynchronous mode, a real GPU with CUDA; None where host time is GPU time."""
        from perseus.gpu.stream.gpu_time import CudaTimeline, SimTimeline
        from perseus.gpu.meter.timing import cuda_timing_available
        from perseus.runtime.port.gpu_timeline import GPUTimeline

        sim = self.sim_device
        if sim is not None:
            if not sim.asynchronous:
                return None
            recorder: Any = sim.stream
            timeline: Any = SimTimeline()
        elif os.environ.get("PERSEUS_GPU_TIMELINE", "1") != "0" and cuda_timing_available():
            from perseus.gpu.stream.follow import CudaEventRecorder

            recorder, timeline = CudaEventRecorder(enable_timing=True), CudaTimeline()
        else:
            return None
        self.timeline = GPUTimeline(recorder, timeline, self.energy_source(), self.stream_request,
                                    instructions=instructions, switch_latency_s=switch_latency_s,
                                    timed=self.timed_requests)
        return self.timeline

    def energy_poller(self, interval_s: float) -> EnergyPoller:
        """Background thread recording when the coarse energy counter advances."""
        from perseus.gpu.meter.energy import EnergyPoller

        return EnergyPoller(self.device, interval_s).start()

    def measure_p_blocking(self, seconds: float, channel: PairChannel | None = None) -> float:
        """P_blocking as Perseus defines it: this GPU's power while its rank is blocked in a P2P
        receive and the partner sleeps (``channel``: the pair takes turns); alone, plain idle power."""
        from perseus.gpu.meter import energy as measurement

        if channel is not None:
            result = measurement.measure_blocking_power_pair(self.device, channel.send, channel.recv, channel.first,
                                                             seconds)
        else:
            result = measurement.measure_blocking_power(self.device, seconds)
        return float(result.power_w)

    def sample_idle_power(self, seconds: float) -> float:
        return _sample_idle_power(self.device, seconds)

    def close(self) -> None:
        """Reset clocks, stop the controller, release the device. Idempotent."""
        if self._closed:
            return
        self._closed = True
        try:
            if self.timeline is not None:
                self.timeline.close()
            self.reset()
        finally:
            if self._poller is not None:
                self._poller.stop()
            self.controller.close()
            self.device.close()


def open_port(config: PerseusConfig, collective: Collective, rank: int,
              gpu: GPUPort | None = None) -> tuple[GPUPort, PerseusConfig]:
    """This rank's port (``gpu`` when the caller brings one) and the run's config, or an error on
    every rank: a rank that cannot open its GPU stops them all at start-up, together. Where a rank
    may not change its clocks (``NoClockAccess``), ``without_clock_access`` decides for the job:
    ``fail`` stops every rank the same way; ``measure-only`` makes every rank measure only (a plan
    is the whole job's: the ranks' clocks change together or not at all) and the config returned
    says ``mode = measure-only``, with one line from rank 0 naming ranks and reasons."""
    from perseus.gpu.clock_service import NoClockAccess

    error: PerseusError | None = None
    denied: str | None = None  # why this rank may not change its clocks, where it measures only instead
    port = gpu
    if port is None:
        index = device_index(config, rank)

        def open_gpu(control: bool) -> GPUPort:
            return GPUPort.open(config.gpu, index, config.sim_gpu, control=control,
                                clock_check_s=config.clock_check_s, zeusd_socket=config.zeusd_socket)

        try:
            try:
                port = open_gpu(config.mode.controls_clocks)
            except NoClockAccess as exc:
                if not config.without_clock_access.measures:
                    raise
                denied = str(exc)
                port = open_gpu(False)
        except PerseusError as exc:
            error = exc
    if not collective.all_true(error is None):
        if port is not None:
            port.close()
        error = error or ConfigError("perseus: another rank could not open its GPU or control its clocks")
        error.line = job_error_line(collective, rank, error)
        raise error
    assert port is not None
    if not config.mode.controls_clocks or collective.all_true(denied is None):
        return port, config
    if port.controller.enabled:  # this rank may; the job may not: its clocks stay at default too
        from perseus.gpu.control.controller import NullController

        port.controller.close()
        port.controller, port.timed_requests = NullController(), NullController.timed_requests
    _say_measure_only(collective, rank, denied)
    from perseus.runtime.config import Mode

    return port, config.replace(mode=Mode.MEASURE_ONLY)


def _say_measure_only(collective: Collective, rank: int, denied: str | None) -> None:
    """Rank 0's one line for the job: which ranks may not change clocks, why, and that all measure only."""
    try:
        gathered = collective.gather_to_root((rank, denied))
    except Exception as exc:  # noqa: BLE001 - the fallback stands; only its explanation is lost
        log.warning("perseus: rank %d: %s; the job measures only", rank, denied or f"(could not gather why: {exc})")
        return
    if gathered is None:
        return
    by_reason: dict[str, list[int]] = {}
    for r, reason in gathered:
        if reason is not None:
            by_reason.setdefault(reason, []).append(r)
    parts = [f"rank{'s' if len(ranks) > 1 else ''} {', '.join(map(str, ranks))}: {reason.removeprefix('perseus: ')}"
             for reason, ranks in by_reason.items()]
    log.warning("perseus: %s; so the whole job trains on without changing clocks, measuring only (mode measure-only, "
                "as without_clock_access: measure-only says; \"fail\" would stop it instead)", " | ".join(parts))


def device_index(config: PerseusConfig, rank: int) -> int | None:
    """The configured index; simulated GPUs default to the global ``rank`` (they are files named by
    index, so every rank would otherwise share GPU 0). NVML's default, the current CUDA
    device, is already right."""
    from perseus.gpu.factory import resolve_kind

    if config.device_index is None and resolve_kind(config.gpu) == "sim":
        return rank
    return config.device_index


def _sample_idle_power(device: GPUDevice, seconds: float, period_s: float = 0.01) -> float:
    import time

    samples = []
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        samples.append(float(device.power_w()))
        time.sleep(period_s)
    return sum(samples) / len(samples)
