"""The runtime's step clock: each step's time, energy and instructions in the GPU's own time.

``StepClock`` is what the engine's hooks call: ``GPUTimeline`` where the GPU runs behind the host,
``HostSteps`` where host time is GPU time or no GPU timeline is available (the synchronous
simulated GPU, a GPU without CUDA event timing), with the GPU layer's ``InstructionTimer`` for
instructions profiled one by one; either way a step ends as one ``StepNumbers``. Energy is the
poller thread's counter updates read at the step's times, past the last update at the last
interval's power (``AfterLast.EXTEND``: a step's end comes before the counter's next update); the
synchronous simulated GPU's counter is read at the step's boundaries instead
(``GPUPort.direct_energy_reader``). A step the counter did not measure (failed reads left a gap in
the updates over it, ``EnergyPoller.covers``, or a boundary read failed) has no energy (None).

Why: a GPU runs its work after the host launched it (the measured H200: 5 instructions behind in a
1F1B step with no host sync). Whatever the hooks do at once (a clock request, a timestamp, an
energy read) happens instructions before the GPU gets there. With a GPU timeline (a real GPU
with CUDA, the simulated GPU's asynchronous mode) the hooks only record events on the stream:

- clock requests follow the stream (``StreamClocks``): the request for instruction i hangs on
  instruction i−1's begin event and goes out ``planned(i−1) − switch latency − lead`` of GPU time
  after the GPU reached it, so instruction i starts at its own clock;
- the step timer (``GPUStepTimer``) shares those begin events, and a step's begin is its first
  instruction's: one event per boundary, none where nothing hangs on it (an instruction whose
  clock does not change and that the timer does not mark). A step's time is the GPU span of its
  instructions and its work between steps (optimizer, gradient all-reduce: after its last
  instruction up to its end event), a bucket of its own, at default clocks when a plan runs
  (``Deployment.step_ending``);
- energy is the poller thread's counter updates interpolated at the step's GPU times: no
  energy read on the training thread.

Events are recycled: a fresh one costs the host 40–60 µs on a real card, a recorded-again one
~5 µs. The events of a step go back to the pool once its step settled and the follower passed
everything handed up to the end of the following step (a clock request of the next step's first
instruction hangs on this step's last begin event).

At step end the engine waits for that step's end event (``GPUStepTimer.fence``): work already
queued, no device sync; so a step's numbers are known at its own end, every rank at the same step,
and a clock set at a step boundary lands exactly between two steps. The wait is about a step at
most, none once the follower failed (a CUDA error from an event): then ``StepClock`` times steps on
the host and the port resets the clocks for the rest of the run (``GPUPort.take_notices``).
"""

from __future__ import annotations

import math
import threading
from collections import deque
from collections.abc import Callable, Hashable
from dataclasses import dataclass, replace
from time import monotonic
from typing import Protocol

from perseus.gpu.stream.gpu_time import GPUStep, GPUStepTimer, StreamTimeline, non_instruction_work
from perseus.gpu.errors import GPUError
from perseus.gpu.meter.energy import AfterLast, CounterUpdate, energy_at
from perseus.gpu.stream.clocks import StreamClocks
from perseus.gpu.stream.compute_stream import ComputeStream, StreamRecorder
from perseus.gpu.stream.follow import BoundaryEvent, FollowMechanism, StreamFollower
from perseus.gpu.meter.timing import CPUInstructionTimer, InstructionTimer, TimedInstruction

RESET_MHZ = 0  # a stream request for default clocks (the controller's reset), not a locked clock
SPAN = "__instructions__"  # the one mark of a step whose instructions are not timed one by one


class _PooledRecorder:
    """Records through ``base`` and gives a step's events back once nobody reads them."""

    def __init__(self, base: ComputeStream) -> None:
        self._base = base
        self._issued: list[BoundaryEvent] = []
        self._generations: deque[tuple[list[BoundaryEvent], int]] = deque()

    def record(self) -> BoundaryEvent:
        event: BoundaryEvent = self._base.record()
        self._issued.append(event)
        return event

    def close_generation(self, handed: int) -> None:
        """The events recorded since the last call are a step's; ``handed``: the follower's count
        of actions handed so far."""
        self._generations.append((self._issued, handed))
        self._issued = []

    def recycle(self, followed: int) -> None:
        gens = self._generations
        while len(gens) >= 2 and followed >= gens[1][1]:
            for event in gens.popleft()[0]:
                self._base.recycle(event)


class _Requests:
    """One epoch's clock requests: dropped once a host-side clock change made them stale (checked
    under the lock the host's change takes, so none slips out after it)."""

    __slots__ = ("live", "_send", "_lock")

    def __init__(self, send: Callable[[int, float | None], None], lock: threading.Lock) -> None:
        self.live = True
        self._send = send
        self._lock = lock

    def __call__(self, mhz: int, at: float | None) -> None:
        with self._lock:
            if self.live:
                self._send(mhz, at)


@dataclass(frozen=True)
class StepNumbers:
    """One step as the runtime reports it (seconds, joules). ``time_s``: the GPU's step (first
    instruction begin to the step's end event) where there is a GPU timeline, host time otherwise;
    ``span_s``: its instructions' span; ``instructions``: what profiling attributes energy to;
    ``non_instruction_s`` / ``non_instruction_energy_j``: the work between steps (after the last
    instruction up to the step's end on the GPU's clock; host-timed, what the runtime ran from its
    tail mark to the step end, ``HostSteps``); ``judged_s``: the span and it, what the guard judges.
    ``energy_j`` None: unmeasured (the counter's reads failed over the step, ``EnergySource.covers``),
    never 0 J or the counter's last value: every consumer leaves such a step out of its energies."""

    time_s: float
    energy_j: float | None
    span_s: float
    # The step's begin to its last instruction's end: the straggler check's natural time, where a
    # pipeline slowed before its first instruction (its data) counts. Without a timeline the host's;
    # NaN: the span (on the GPU's clock the step begins at its first instruction).
    until_last_end_s: float = math.nan
    non_instruction_s: float = 0.0
    non_instruction_energy_j: float | None = 0.0
    instructions: tuple[TimedInstruction, ...] = ()
    gpu_time: bool = False
    host_s: float | None = None  # the step on the host (begin hook to end hook)
    start_s: float = math.nan  # where the GPU began its first instruction (CLOCK_MONOTONIC)

    @property
    def judged_s(self) -> float:
        """The step time the guard judges, plan steps and default-clock probes alike: the
        instructions' span and the work between steps (host work before the first instruction,
        the data's, is left out)."""
        return self.span_s + self.non_instruction_s

    @property
    def straggler_s(self) -> float:
        """The time the straggler check compares across pipelines (``until_last_end_s``)."""
        return self.span_s if math.isnan(self.until_last_end_s) else self.until_last_end_s

    @property
    def span_energy_j(self) -> float | None:
        """Energy of the instructions' span (the step's less its non-instruction tail); None: unmeasured."""
        if self.energy_j is None or self.non_instruction_energy_j is None:
            return None
        return self.energy_j - self.non_instruction_energy_j


class EnergySource(Protocol):
    """The poller thread's counter updates (``EnergyPoller.since``) and whether they measure a
    span (``EnergyPoller.covers``: no gap left by failed reads)."""

    def since(self, t_s: float) -> list[CounterUpdate]: ...

    def covers(self, t0: float, t1: float) -> bool: ...


class GPUTimeline:
    """The hooks' events, the stream-ordered clock requests and the GPU step timer of one GPU."""

    def __init__(self, recorder: StreamRecorder, timeline: StreamTimeline, energy: EnergySource,
                 send: Callable[[int, float | None], None], *, instructions: int = 0, switch_latency_s: float = 0.0,
                 timed: bool = False, mechanism: FollowMechanism = FollowMechanism.POLL) -> None:
        # The follower's thread makes the events' device its own before it asks about any
        # (``CudaEventRecorder.bind_thread``): no stray context on GPU 0.
        self.follower = StreamFollower(mechanism, on_start=recorder.bind_thread)
        self.streams = ComputeStream(recorder)  # events on the framework's compute stream, not the current one
        self._recorder = _PooledRecorder(self.streams)
        self._energy = energy
        self._send = send
        self._latency = switch_latency_s
        self._timed = timed
        self.timer = GPUStepTimer(self._recorder, self.follower, timeline)
        self.lock = threading.Lock()  # the port holds it around its own clock changes
        self._requests = _Requests(send, self.lock)
        self.clocks = self._new_clocks()
        self._event: BoundaryEvent | None = None  # the begin event the clock request just recorded
        self._stream_read = False  # this begin hook read the compute stream already (``clock``)
        self._instructions = instructions  # a step's (the stage's) instruction count
        self._count = 0  # instructions begun in this step
        self._open = False
        self._read_end: tuple[float, float] | None = None  # (the last step's end, the counter value read there)

    def _new_clocks(self) -> StreamClocks:
        return StreamClocks(self._recorder, self.follower, self._requests, switch_latency_s=self._latency,
                            timed=self._timed)

    # ---------------------------------------------------------------- training thread (hot path)
    def step_begin(self) -> None:
        self.timer.step_begin(at_first_instruction=True)  # its begin event: its first instruction's
        self._count = 0

    def clock(self, mhz: int, planned_s: float | None, next_mhz: int | None = None) -> None:
        """The beginning instruction's planned clock, in effect when the GPU reaches it, and the
        next one's (``next_mhz``), in effect when the GPU is done with this one (``planned_s``).
        A step's first instruction keeps its event (the step timer's); others record one only
        where a request hangs on it (``StreamClocks.instruction``)."""
        self.streams.instruction_begins()
        self._stream_read = True
        self._event = self.clocks.instruction(mhz, planned_s, next_mhz, keep=self._count == 0)

    def begin(self, key: Hashable, profiling: bool) -> None:
        """An instruction begins. ``profiling``: timed one by one; otherwise only the step's
        span is (its first begin, its last end): one event per instruction at most, the clock
        request's, shared."""
        if self._stream_read:
            self._stream_read = False
        else:
            self.streams.instruction_begins()
        event, self._event = self._event, None
        first = self._count == 0
        self._count += 1
        if profiling or first:
            self.timer.begin(key if profiling else SPAN, event)
            self._open = True

    def end(self, profiling: bool) -> None:
        if self._open and (profiling or self._count >= self._instructions):
            self.streams.ends_here()  # work the instruction left on a side stream current now counts
            self.timer.end()
            self._open = False

    def ahead(self, mhz: int) -> None:
        """The clock of the work between steps (``RESET_MHZ``: default clocks), at step end: in
        effect when the GPU finishes this step's last instruction (``StreamClocks.ahead``); the
        next step's first clock is asked for at its own first instruction."""
        self.clocks.ahead(mhz)

    def boundary(self, mhz: int) -> None:
        """A clock (``RESET_MHZ``: default clocks) for the GPU's work from here on: a probe
        step's default clocks, a fallback from a hook."""
        self.clocks.boundary(mhz)

    # ---------------------------------------------------------------- step boundaries
    def invalidate(self) -> None:
        """Requests handed and not yet made are dropped: the host changes the clock itself now
        (after the step fence, so the GPU has nothing of the old plan left to run). The caller
        holds ``lock``."""
        self._requests.live = False
        self._requests = _Requests(self._send, self.lock)
        self.clocks = self._new_clocks()

    def lead_by(self, switch_latency_s: float) -> None:
        """Requests from here on lead by this switch latency (a measured one, known only after the
        timeline opened); those still on their way are dropped. Between steps."""
        with self.lock:
            self._latency = switch_latency_s
            self.invalidate()

    @property
    def failure(self) -> BaseException | None:
        """What failed the stream follower (``StreamFollower.error``): nothing of this timeline
        works any more (no clock request goes out, no step settles); None while it follows."""
        return self.follower.error

    def step_end(self) -> StepNumbers | None:
        """The step's numbers, once the GPU passed its end (``GPUStepTimer.fence``: about a step at
        most); None when it did not settle in time or the follower failed."""
        if self._open:  # fewer instructions than the stage has: the span ends here
            self.streams.ends_here()
            self.timer.end()
            self._open = False
        if self.follower.failed:
            return None
        if self._count:  # the step's end is an end hook too (a step without instructions records its begin here)
            self.streams.step_ends()
        self.timer.step_end()
        steps = self.timer.fence()
        self._recorder.close_generation(self.follower.handed)
        self._recorder.recycle(self.follower.followed)
        # an older step settling late is not this one
        return self._numbers(steps[-1]) if steps and steps[-1].index == self.timer.last_index else None

    def _numbers(self, step: GPUStep) -> StepNumbers:
        """The step's time and energy; its end is read before the counter's next update (at the last
        interval's power), so the previous step's end, read again now, corrects this step by the
        difference: the steps' energies add up to the counter's."""
        first = step.instructions[0].start_s if step.instructions else step.begin_s
        tail = step.instructions[-1].end_s if step.instructions else step.begin_s
        last = self._read_end
        updates = self._energy.since(min(first, last[0]) if last is not None else first)
        e0, e_tail, e1 = (energy_at(updates, t, AfterLast.EXTEND) for t in (first, tail, step.end_s))
        if last is not None and not math.isnan(e0):
            e0 -= energy_at(updates, last[0], AfterLast.EXTEND) - last[1]
        measured = not math.isnan(e1 - e0) and self._energy.covers(first, step.end_s)
        self._read_end = (step.end_s, e1) if measured else None  # nothing to correct after an unmeasured step
        timed = tuple(i for i in step.instructions if i.key != SPAN)
        timed += tuple(non_instruction_work(step)) if timed else ()
        return StepNumbers(step.gpu_step_s, e1 - e0 if measured else None, step.instruction_span_s,
                           non_instruction_s=step.non_instruction_gpu_s,
                           non_instruction_energy_j=e1 - e_tail if measured else None,
                           instructions=timed, gpu_time=True, start_s=first)

    def close(self) -> None:
        with self.lock:
            self._requests.live = False
        self.follower.close()


class HostSteps:
    """Host timestamps for a GPU without a timeline (the synchronous simulated GPU: its kernels
    run inside the hooks, so host time is GPU time); energy from the poller's updates too. The
    GPU's work between steps is what runs from ``mark_tail`` (the synchronous simulator's step
    tail, which the runtime runs at step end) to the step end: its own time and energy (the
    direct counter's where there is one, else the poller's); none where nothing was marked (the
    host's own waits after the last instruction, for its sends, are no GPU work)."""

    def __init__(self, energy: EnergySource, clock: Callable[[], float],
                 read_now: Callable[[], float] | None = None) -> None:
        self._energy = energy
        self._clock = clock
        self._read_now = read_now  # the synchronous simulator's counter (GPUPort.direct_energy_reader)
        self._t0 = self._first_begin = self._last_end = self._e0 = 0.0
        self._t_tail = self._e_tail = math.nan  # when the work between steps began, the counter then
        self._begun = False

    def step_begin(self) -> None:
        self._t0 = self._first_begin = self._last_end = self._clock()
        if self._read_now is not None:
            self._e0 = self._read(self._read_now)
        self._t_tail = self._e_tail = math.nan
        self._begun = False

    def mark_tail(self) -> None:
        """The work between steps begins (the synchronous simulator runs it next): its start, and
        the direct counter now where there is one, so that work has its own time and energy."""
        self._t_tail = self._clock()
        if self._read_now is not None:
            self._e_tail = self._read(self._read_now)

    @staticmethod
    def _read(read: Callable[[], float]) -> float:
        """The direct counter read; NaN when it fails (the step is unmeasured, training goes on)."""
        try:
            return read()
        except GPUError:
            return math.nan

    def begin(self) -> None:
        """An instruction begins: the first one starts the span (host work before it is not the plan's)."""
        if not self._begun:
            self._first_begin = self._clock()
            self._begun = True

    def end(self) -> None:
        self._last_end = self._clock()

    def step_end(self) -> StepNumbers:
        """The step's numbers; its energy None (unmeasured) where a read at its boundaries failed,
        or the poller's updates do not cover it."""
        t1 = self._clock()
        energy: float | None
        marked = not math.isnan(self._t_tail)
        tail_s = t1 - self._t_tail if marked else 0.0
        tail: float | None = 0.0
        if self._read_now is not None:
            e1 = self._read(self._read_now)
            energy = e1 - self._e0  # NaN (unmeasured) when either read failed
            tail = e1 - self._e_tail if marked else 0.0  # NaN: a read failed
        else:
            updates = self._energy.since(self._t0)
            e0, e1 = (energy_at(updates, t, AfterLast.EXTEND) for t in (self._t0, t1))
            energy = e1 - e0
            tail = e1 - energy_at(updates, self._t_tail, AfterLast.EXTEND) if marked else 0.0
            if not self._energy.covers(self._t0, t1):
                energy = tail = None
        energy = None if energy is None or math.isnan(energy) else energy
        tail = None if tail is None or math.isnan(tail) else tail
        return StepNumbers(t1 - self._t0, energy, max(self._last_end - self._first_begin, 1e-9),
                           until_last_end_s=max(self._last_end - self._t0, 1e-9), non_instruction_s=tail_s,
                           non_instruction_energy_j=tail)


class StepClock:
    """What the engine's hooks call to time steps: the GPU timeline where there is one, host time
    (and the simulated GPU's kernel timer while profiling) otherwise; ``step_end`` gives the step's
    ``StepNumbers`` either way, its instructions timed one by one while ``profiling``."""

    def __init__(self, timeline: GPUTimeline | None, host: HostSteps, timer: InstructionTimer) -> None:
        self.timeline = timeline
        self.host = host
        self.timer = timer
        if timeline is not None:  # the hooks call the timeline's own methods: one call less per hook
            self.begin = timeline.begin  # type: ignore[method-assign]  # same signature, bound once (hot path)
            self.end = timeline.end  # type: ignore[method-assign]  # as above

    def step_begin(self) -> None:
        self.host.step_begin()  # no energy read: the poller thread's updates
        if self.timeline is not None:
            self.timeline.step_begin()

    def begin(self, key: Hashable, profiling: bool) -> None:
        """Host time (with a GPU timeline, ``__init__`` binds ``GPUTimeline.begin`` here)."""
        self.host.begin()
        if profiling:
            self.timer.begin(key)

    def end(self, profiling: bool) -> None:
        """Host time (with a GPU timeline, ``GPUTimeline.end``)."""
        if profiling:
            self.timer.end()
        self.host.end()

    def step_end(self, profiling: bool) -> StepNumbers:
        """The step's numbers: the GPU's (waiting for its end event: work already queued, never a
        device sync) where there is a timeline and the step settled, else the host's."""
        host = self.host.step_end()
        numbers = self.timeline.step_end() if self.timeline is not None else None
        if self.timeline is not None and self.timeline.failure is not None:
            self._host_only()
        if numbers is not None:
            return StepNumbers(**{**vars(numbers), "host_s": host.time_s})
        timed = tuple(self.timer.resolve()) if profiling else ()
        return replace(host, instructions=timed, host_s=host.time_s)

    def discard(self) -> None:
        """Forget instructions timed so far (profiling starts)."""
        self.timer.resolve()

    def _host_only(self) -> None:
        """The GPU timeline failed (its follower did; the port resets the clocks): host time from
        the next step on, the hooks back on this class's methods, instructions timed on the host
        (a CUDA event timer would ask the failing stream)."""
        self.timeline = None
        vars(self).pop("begin", None)
        vars(self).pop("end", None)
        self.timer = CPUInstructionTimer(monotonic)


class InertSteps(StepClock):
    """A disabled runtime's: its hooks time nothing."""

    def __init__(self) -> None:
        super().__init__(None, HostSteps(_NoEnergy(), lambda: 0.0), _NoTimer())

    def begin(self, key: Hashable, profiling: bool) -> None:
        pass

    def end(self, profiling: bool) -> None:
        pass


class _NoEnergy:
    def since(self, t_s: float) -> list[CounterUpdate]:
        return []

    def covers(self, t0: float, t1: float) -> bool:
        return True


class _NoTimer(InstructionTimer):
    def begin(self, key: Hashable) -> None:
        pass

    def end(self) -> None:
        pass

    def resolve(self) -> list[TimedInstruction]:
        return []
