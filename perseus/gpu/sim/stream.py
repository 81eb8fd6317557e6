"""The simulated GPU's asynchronous mode: a stream the host enqueues onto and a device thread runs.

Why: a real GPU runs kernels after the host launched them. In a 1F1B step with no host sync the
measured H200 ran 5 instructions (median 79 ms) behind the host, so whatever the host does at an
instruction's hook (a clock request, a timestamp, an energy read) happens instructions before
the GPU gets there. The synchronous simulated GPU hides that: its kernel runs inside the hook.
``SimStream`` restores it: ``launch`` puts a kernel (its max-clock work) on a bounded queue and
returns at once unless ``depth`` kernels are already waiting (then the host blocks, as CUDA's
launch queue does); a device thread runs them in order as ``SimulatedGPU`` busy sections, so the
clock in force while it runs is what slows it down. ``record`` puts an event on the stream that
completes, with its GPU timestamp, when the device thread reaches it (``query``/``synchronize``,
like ``torch.cuda.Event``).

With ``spin_activity`` > 0 a stream that ran out of work spins until the host's next kernel comes:
a real pipeline stage waiting for its peer runs NCCL's receive (or send) kernel, which polls at
a power well above idle and set by the clock in force, where the plain model draws P_blocking.

Side streams (``side``, like ``torch.cuda.Stream()``): frameworks put communication and overlapped
work on streams of their own (MoE shared-expert overlap, DeepSpeed's and Megatron's communication
streams), and a hook may run while one is current (``using``, like ``torch.cuda.stream(s)``). An
event recorded with no stream named goes on the calling thread's current stream, as
``torch.cuda.Event.record()`` does, so code that records on "whatever is current" shows here what
it does on a real GPU. A side stream's kernels take their max-clock time beside the main stream's,
outside the device's power model (what frameworks overlap on side streams is mostly communication).

Timestamps are CLOCK_MONOTONIC seconds (``time.monotonic``), the simulated GPU's own clock.
"""

from __future__ import annotations

import math
import threading
import time
from collections import defaultdict, deque
from collections.abc import Callable, Hashable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Protocol

from perseus.gpu.errors import GPUError, GPUInvalidArgumentError

DEFAULT_DEPTH = 8


class _KernelRecord(Protocol):
    """What the stream reads of a finished kernel (``sim.kernels.KernelRecord``, frozen)."""

    @property
    def start(self) -> float: ...

    @property
    def duration_s(self) -> float: ...

    @property
    def start_mhz(self) -> int: ...


class StreamDevice(Protocol):
    """What the stream needs of ``SimulatedGPU`` (which owns the stream: no import back)."""

    @property
    def index(self) -> int: ...

    def begin_busy(self, activity: float = 1.0, compute_fraction: float = 0.8, *,
                   start_at: float | None = None) -> None: ...

    def end_busy(self, cpu_elapsed_s: float | None = None, *, min_s: float = 0.0,
                 until: float | None = None) -> float: ...

    def last_kernel(self) -> _KernelRecord: ...

    def current_sm_clock_mhz(self) -> int | None: ...


class SimEvent:
    """A marker on a ``SimStream``: completes when the device thread reaches it."""

    __slots__ = ("_done", "_gate", "gpu_time_s")

    def __init__(self) -> None:
        # A held lock the device thread releases: a cheap one-shot latch (recording is on the
        # training thread's hot path; a threading.Event costs several times more).
        self._gate = threading.Lock()
        self._gate.acquire()
        self._done = False
        self.gpu_time_s = math.nan  # when the GPU reached it (CLOCK_MONOTONIC), once complete

    def query(self) -> bool:
        """Whether the GPU has reached the event (never blocks)."""
        return self._done

    def synchronize(self) -> None:
        """Wait (blocking, no spin) until the GPU has reached the event."""
        if not self._done:
            self._gate.acquire()
            self._gate.release()

    def _rearm(self) -> None:
        """Make a completed event recordable again (a recycled ``torch.cuda.Event``)."""
        if not self._done:
            raise GPUError("a stream event was recycled before the GPU reached it")
        self._gate.acquire()
        self._done = False
        self.gpu_time_s = math.nan

    def _complete(self, t: float) -> None:
        self.gpu_time_s = t
        self._done = True
        self._gate.release()


class FailingEvent(SimEvent):
    """An event whose ``query`` and ``synchronize`` raise as a CUDA error does (an injected fault):
    the GPU still reaches it, the host cannot ask."""

    __slots__ = ()

    def query(self) -> bool:
        raise RuntimeError(EVENT_FAULT)

    def synchronize(self) -> None:
        raise RuntimeError(EVENT_FAULT)


EVENT_FAULT = ("CUDA error: operation not permitted when stream is capturing "
               "(an injected fault of the simulated GPU's stream)")


@dataclass(frozen=True)
class StreamKernel:
    """One kernel the device thread ran: its tag, GPU start and end, its max-clock work, the SM
    clock set when it started and the one it ran at (below it under a power cap)."""

    tag: Hashable
    start_s: float
    end_s: float
    work_s: float
    set_mhz: int
    run_mhz: int


class _Launch:
    """A kernel on the queue. ``work_s`` is None while the host still launches it (``OpenKernel``):
    the device thread starts it when it gets there and waits for its work before ending it."""

    __slots__ = ("work_s", "activity", "compute_fraction", "tag", "launched_s", "_closed")

    def __init__(self, work_s: float | None, activity: float, compute_fraction: float, tag: Hashable,
                 launched_s: float) -> None:
        self.work_s, self.activity, self.compute_fraction = work_s, activity, compute_fraction
        self.tag, self.launched_s = tag, launched_s
        self._closed = threading.Lock()  # held while open: a one-shot latch, as in ``SimEvent``
        if work_s is None:
            self._closed.acquire()

    def close(self, work_s: float) -> None:
        if self.work_s is None:
            self.work_s = work_s
            self._closed.release()

    def wait_closed(self) -> float:
        if self.work_s is None:
            self._closed.acquire()
            self._closed.release()
        assert self.work_s is not None
        return self.work_s


class OpenKernel:
    """A kernel the host has started launching and whose work is known only at its end (``close``).

    Why: a framework launches an instruction's kernels while its host code runs, and an idle GPU
    starts on the first of them at once. The simulated instruction's work is its host CPU time,
    known only when the instruction ends; launching it then would start the GPU's share only after
    the host's, spending that time twice where the GPU waited for the host. An open kernel starts
    when the device thread reaches it, like the real first kernel, and ends ``work_s`` (stretched
    by the clock) after that start, once ``close`` has said what ``work_s`` is."""

    __slots__ = ("_launch",)

    def __init__(self, launch: _Launch) -> None:
        self._launch = launch

    @property
    def open(self) -> bool:
        return self._launch.work_s is None

    def close(self, work_s: float) -> None:
        """The kernel's max-clock work, in seconds (a second close is ignored)."""
        if work_s < 0 or not math.isfinite(work_s):
            raise GPUInvalidArgumentError(f"kernel work must be finite seconds >= 0, got {work_s!r}")
        self._launch.close(float(work_s))


@dataclass(frozen=True)
class _SideKernelRecord:
    start: float
    duration_s: float
    start_mhz: int


class _SideDevice:
    """What runs a side stream's kernels: each takes its max-clock work in time whatever the clock,
    and draws nothing of the device's power model (see the module docstring)."""

    def __init__(self, gpu: StreamDevice, clock: Callable[[], float]) -> None:
        self._gpu = gpu
        self._clock = clock
        self._start = math.nan
        self._last = _SideKernelRecord(math.nan, 0.0, 0)

    @property
    def index(self) -> int:
        return self._gpu.index

    def begin_busy(self, activity: float = 1.0, compute_fraction: float = 0.8, *,
                   start_at: float | None = None) -> None:
        now = self._clock()
        self._start = now if start_at is None else min(start_at, now)

    def end_busy(self, cpu_elapsed_s: float | None = None, *, min_s: float = 0.0,
                 until: float | None = None) -> float:
        end = until if until is not None else self._start + max(cpu_elapsed_s or 0.0, min_s)
        if (wait := end - self._clock()) > 0:
            time.sleep(wait)
        self._last = _SideKernelRecord(self._start, end - self._start, self.current_sm_clock_mhz() or 0)
        return end - self._start

    def last_kernel(self) -> _KernelRecord:
        return self._last

    def current_sm_clock_mhz(self) -> int | None:
        return self._gpu.current_sm_clock_mhz()


class SimStream:
    """One in-order stream of a ``SimulatedGPU``, run by a device thread of this process: the GPU's
    main stream, or one of its side streams (``side``)."""

    def __init__(self, device: StreamDevice, depth: int = DEFAULT_DEPTH,
                 clock: Callable[[], float] = time.monotonic, *, event_new_s: float = 0.0,
                 event_record_s: float = 0.0, fails: Callable[[int], bool] | None = None,
                 spin_activity: float = 0.0, main: SimStream | None = None) -> None:
        if not isinstance(depth, int) or depth < 1:
            raise GPUInvalidArgumentError(f"stream depth is how many kernels may wait (>= 1), got {depth!r}")
        self.device = device
        self._main: SimStream = self if main is None else main  # the GPU's main stream: events' pool, current stream
        self._sides: list[SimStream] = []
        self._current: threading.local = threading.local() if main is None else main._current  # each thread's current stream
        self.depth = depth
        self._clock = clock
        self._cv = threading.Condition()
        self._queue: deque[_Launch | SimEvent] = deque()
        self._open: list[_Launch] = []  # open kernels, closed at ``close`` if the host never did
        self._unfinished = 0  # kernels launched and not yet finished
        self._history: list[StreamKernel] = []
        self._error: BaseException | None = None
        self._closed = False
        self.max_ahead = 0  # the most kernels that were ever waiting or running at a launch
        # The host's cost of an event on a real card (creating one, or recording one taken back with
        # ``recycle``), charged per recording thread (``threading.get_ident``) instead of spent: a
        # regression to fresh events on the hot path shows in ``event_cost_s`` deterministically,
        # and a busy test machine is not loaded further.
        self.event_new_s = event_new_s
        self.event_record_s = event_record_s
        self.event_cost_s: defaultdict[int, float] = defaultdict(float)
        self._pool: list[SimEvent] = []
        self.events_created = 0
        self.events_recorded = 0
        self._fails = fails  # whether the n-th recorded event raises (an injected fault)
        self.spin_activity = spin_activity  # > 0: out of work, the GPU spins (a pipeline wait's NCCL kernel)
        self.spins: list[tuple[float, float]] = []  # (start, end) of each spin, GPU time
        kind = "stream" if main is None else "side-stream"
        self._thread = threading.Thread(target=self._run, name=f"perseus-sim-gpu{device.index}-{kind}", daemon=True)
        self._thread.start()

    # ---------------------------------------------------------------- host side
    def launch(self, work_s: float, *, activity: float = 1.0, compute_fraction: float = 0.8,
               tag: Hashable = None) -> None:
        """Enqueue a kernel of ``work_s`` max-clock seconds; blocks only while ``depth`` wait."""
        if work_s < 0 or not math.isfinite(work_s):
            raise GPUInvalidArgumentError(f"kernel work must be finite seconds >= 0, got {work_s!r}")
        self._enqueue(_Launch(float(work_s), activity, compute_fraction, tag, math.nan))

    def open_kernel(self, *, activity: float = 1.0, compute_fraction: float = 0.8,
                    tag: Hashable = None) -> OpenKernel:
        """Enqueue a kernel whose work the host states later (``OpenKernel.close``); blocks only
        while ``depth`` wait. Nothing after it on the stream runs before it is closed."""
        return OpenKernel(self._enqueue(_Launch(None, activity, compute_fraction, tag, math.nan)))

    def _enqueue(self, launch: _Launch) -> _Launch:
        """Put ``launch`` on the queue once fewer than ``depth`` kernels wait, stamped with the time."""
        with self._cv:
            self._raise_if_failed()
            while self._unfinished >= self.depth and self._error is None and not self._closed:
                self._cv.wait()
            self._raise_if_failed()
            self._unfinished += 1
            self.max_ahead = max(self.max_ahead, self._unfinished)
            launch.launched_s = self._clock()
            if launch.work_s is None:
                self._open.append(launch)
            self._queue.append(launch)
            self._cv.notify_all()
        return launch

    def record(self, stream: SimStream | None = None) -> SimEvent:
        """An event at the current end of ``stream`` (None: the calling thread's current stream, as
        ``torch.cuda.Event.record()``); never blocks. A recycled one when the pool has one
        (``event_record_s`` of host CPU), else a new one (``event_new_s``)."""
        main = self._main
        main.events_recorded += 1
        if main._fails is not None and main._fails(main.events_recorded):
            event: SimEvent = FailingEvent()
            main.events_created += 1
        elif main._pool:
            event = main._pool.pop()
            event._rearm()
            main.event_cost_s[threading.get_ident()] += main.event_record_s
        else:
            event = SimEvent()
            main.events_created += 1
            main.event_cost_s[threading.get_ident()] += main.event_new_s
        (stream if stream is not None else self.current_stream())._put(event)
        return event

    def _put(self, event: SimEvent) -> None:
        event.gpu_time_s = self._clock()  # when recorded: the GPU reaches it no earlier
        with self._cv:
            if not self._queue and self._unfinished == 0:
                event._complete(event.gpu_time_s)  # nothing in flight: the GPU is already there
            else:
                self._queue.append(event)  # the device thread is busy: it finds the event in time

    def recycle(self, event: SimEvent) -> None:
        """A completed event nobody reads any more may be recorded again (``record`` takes it)."""
        if not isinstance(event, FailingEvent):
            self._main._pool.append(event)

    def bind_thread(self) -> None:
        """Nothing to bind: the simulated GPU has no per-thread device (``CudaEventRecorder``'s has)."""

    # ---------------------------------------------------------------- side streams
    def side(self) -> SimStream:
        """A new side stream on this GPU (``torch.cuda.Stream()``); closed with the main stream."""
        main = self._main
        stream = SimStream(_SideDevice(main.device, main._clock), main.depth, main._clock, main=main)
        with main._cv:
            main._sides.append(stream)
        return stream

    def current_stream(self) -> SimStream:
        """The calling thread's current stream: the main stream unless ``using`` made another one so."""
        current: SimStream | None = getattr(self._current, "stream", None)
        return self._main if current is None else current

    @contextmanager
    def using(self, stream: SimStream) -> Iterator[SimStream]:
        """Make ``stream`` the calling thread's current stream inside the block (``torch.cuda.stream``)."""
        if stream._main is not self._main:
            raise GPUInvalidArgumentError("a stream of another simulated GPU cannot be made current here")
        before = getattr(self._current, "stream", None)
        self._current.stream = stream
        try:
            yield stream
        finally:
            self._current.stream = before

    def ahead(self) -> int:
        """Kernels launched and not finished: how far the host runs ahead of the GPU."""
        return self._unfinished

    def synchronize(self) -> None:
        """Wait until everything launched on this stream so far has run (a ``.item()``)."""
        self.record(self).synchronize()
        with self._cv:
            self._raise_if_failed()

    def kernels(self) -> list[StreamKernel]:
        """The kernels run so far (tests and benchmarks read the GPU's truth here)."""
        with self._cv:
            return list(self._history)

    def close(self) -> None:
        """Run what is queued (an open kernel ends with no further work), then stop the device thread
        (a main stream's side streams' too)."""
        with self._cv:
            sides, self._sides = self._sides, []
        for side in sides:
            side.close()
        with self._cv:
            for launch in self._open:
                launch.close(0.0)
            self._open.clear()
            self._closed = True
            self._cv.notify_all()
        self._thread.join()

    def _raise_if_failed(self) -> None:
        if self._error is not None:
            raise GPUError(f"simulated GPU {self.device.index}'s stream failed: {self._error}")

    # ---------------------------------------------------------------- device thread
    def _run(self) -> None:
        # The GPU's own time: where the last kernel ended. The device thread wakes up late on a
        # busy host; a real GPU does not, so what follows a kernel starts (and is stamped) at its
        # end, or when launched if that is later.
        gpu_free = -math.inf
        while True:
            spinning = self.spin_activity > 0 and gpu_free > -math.inf and self._spin_begin(gpu_free)
            with self._cv:
                while not self._queue and not self._closed:
                    self._cv.wait()
                item = self._queue.popleft() if self._queue else None
            if spinning:  # until the host's kernel came (its launch), or now
                until = self._clock() if item is None else item.gpu_time_s if isinstance(item, SimEvent) else item.launched_s
                gpu_free = max(gpu_free, self._spin_end(until))
            if item is None:
                return
            if isinstance(item, SimEvent):
                item._complete(max(item.gpu_time_s, gpu_free))
                continue
            try:
                kernel = self._execute(item, max(item.launched_s, gpu_free))
                gpu_free = kernel.end_s
            except BaseException as exc:  # noqa: BLE001 - surfaced on the host's next call
                with self._cv:
                    self._error = exc
                    self._unfinished -= 1
                    self._cv.notify_all()
                continue
            with self._cv:
                self._history.append(kernel)
                self._unfinished -= 1
                self._cv.notify_all()

    def _spin_begin(self, gpu_free: float) -> bool:
        """Start spinning from ``gpu_free`` if there is no work; whether it did."""
        with self._cv:
            if self._queue or self._closed or self._error is not None:
                return False
        try:
            self.device.begin_busy(self.spin_activity, 0.0, start_at=gpu_free)
        except BaseException as exc:  # noqa: BLE001 - surfaced on the host's next call
            with self._cv:
                self._error = exc
            return False
        return True

    def _spin_end(self, until: float) -> float:
        """Stop spinning at ``until``; when the spin ended (-inf if it failed)."""
        try:
            self.device.end_busy(until=until)
        except BaseException as exc:  # noqa: BLE001 - surfaced on the host's next call
            with self._cv:
                self._error = exc
            return -math.inf
        rec = self.device.last_kernel()
        self.spins.append((rec.start, rec.start + rec.duration_s))
        return rec.start + rec.duration_s

    def _execute(self, k: _Launch, start_at: float) -> StreamKernel:
        dev = self.device
        dev.begin_busy(k.activity, k.compute_fraction, start_at=start_at)
        run_mhz = dev.current_sm_clock_mhz() or 0
        work_s = k.wait_closed()  # an open kernel: the host states its work when the instruction ends
        with self._cv:
            if k in self._open:
                self._open.remove(k)
        dev.end_busy(work_s)
        rec = dev.last_kernel()
        return StreamKernel(k.tag, rec.start, rec.start + rec.duration_s, work_s, rec.start_mhz, run_mhz)
