"""Steps and instructions timed as the GPU ran them, read without ever synchronizing.

Why: host timestamps of an asynchronous GPU time the launches, not the work. On the measured H200
the host's ``step()`` call lasted 241 ms of a 332 ms GPU step (ratio 0.73), and a CUDA timer
anchored at ``resolve()`` after a sync shifted every timestamp late by the GPU work before the
sync (31.6 ms of optimizer tail: forward power +22 %). ``GPUStepTimer`` records an event at each
step's begin and end and at each instruction's begin and end (the training thread's only cost);
a step *settles* once the stream follower has seen the GPU pass its end event, read later, never
waited for: only the follower's thread queries or waits on events, so a CUDA error one raises fails
the follower (``StreamFollower.failed``), never the training thread (an error reading a settled
step's event times fails it too). Each step is anchored on its own begin event, whose host time the
stream follower saw (within ~0.1 ms) or, on the simulated GPU, the event's exact GPU timestamp; the
rest are offsets from it on the GPU's clock, so nothing done on the host between the step and its
reading shifts it.

What a settled ``GPUStep`` holds (CLOCK_MONOTONIC seconds):

- ``instruction_span_s``: first instruction begin to last instruction end, the step's time;
- ``non_instruction_gpu_s``: the step's GPU work after its last instruction, up to its end event
  (optimizer, gradient all-reduce); ``gpu_step_s`` is the two together;
- ``energy_j`` / ``non_instruction_energy_j``: the energy counter interpolated at those GPU times.
"""

from __future__ import annotations

import math
import threading
import time
from collections import deque
from collections.abc import Hashable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from perseus.gpu.errors import GPUError
from perseus.gpu.meter.energy import AfterLast, CounterUpdate, energy_at
from perseus.gpu.stream.compute_stream import JoinedEvent, event_parts
from perseus.gpu.stream.follow import BoundaryEvent, EventRecorder, StreamFollower
from perseus.gpu.meter.timing import TimedInstruction

# How long ``fence`` waits for a step's end (a failed follower: not at all). The GPU may still have
# the whole step queued when the host ends it, and a step may be longer than the ones before (a
# lower clock, a slower plan, a peer's wait), so FENCE_FACTOR × the longest of the last
# FENCE_HISTORY settled steps (GPU time, begin event to end event), plus FENCE_FLOOR_S for the
# follower's delay and a busy host: 0.25 s steps wait 0.85 s at most. Before any step settled
# (the first steps: lazy initialization, autotuning), FIRST_FENCE_S. A step not settled by then is
# host-timed, and settles later.
FENCE_FACTOR = 3.0
FENCE_FLOOR_S = 0.1
FENCE_HISTORY = 8
FIRST_FENCE_S = 5.0
_FENCE_SLICE_S = 0.005  # the fence looks at the follower's ``failed`` this often while it waits


class StreamTimeline(Protocol):
    """Turns completed events into host times: ``anchor`` (a step's begin event, seen by the
    follower at ``seen_s``) and offsets from it on the GPU's clock."""

    def anchor_time(self, anchor: BoundaryEvent, seen_s: float) -> float: ...

    def seconds_between(self, earlier: BoundaryEvent, later: BoundaryEvent) -> float: ...


class SimTimeline:
    """The simulated stream's events carry their exact GPU timestamp."""

    def anchor_time(self, anchor: Any, seen_s: float) -> float:
        return float(anchor.gpu_time_s)

    def seconds_between(self, earlier: Any, later: Any) -> float:
        return float(later.gpu_time_s - earlier.gpu_time_s)


class CudaTimeline:
    """``torch.cuda.Event(enable_timing=True)``: the follower's sighting anchors, ``elapsed_time``
    (ms, on the GPU's clock) places the rest; a boundary on two streams (``JoinedEvent``) is at
    its later part."""

    def anchor_time(self, anchor: Any, seen_s: float) -> float:
        return seen_s

    def seconds_between(self, earlier: Any, later: Any) -> float:
        if not isinstance(earlier, JoinedEvent) and not isinstance(later, JoinedEvent):
            return float(earlier.elapsed_time(later)) / 1e3
        ref, *rest = event_parts(earlier)
        late_ms = max(float(ref.elapsed_time(p)) for p in event_parts(later))
        early_ms = max([0.0] + [float(ref.elapsed_time(p)) for p in rest])
        return (late_ms - early_ms) / 1e3


@dataclass(frozen=True)
class GPUStep:
    """One step as the GPU ran it (see the module docstring)."""

    index: int
    begin_s: float
    end_s: float
    instructions: tuple[TimedInstruction, ...]
    energy_j: float = math.nan
    non_instruction_energy_j: float = math.nan

    @property
    def gpu_step_s(self) -> float:
        """The step's GPU time: its first instruction's begin to its end event (a gap before the
        first instruction is the GPU waiting for the host, idle, and not the step's)."""
        if not self.instructions:
            return self.end_s - self.begin_s
        return self.end_s - self.instructions[0].start_s

    @property
    def instruction_span_s(self) -> float:
        """First instruction begin to last instruction end: the step's time as the GPU spent it."""
        if not self.instructions:
            return 0.0
        return self.instructions[-1].end_s - self.instructions[0].start_s

    @property
    def busy_s(self) -> float:
        """Time inside instructions (the span less its bubbles)."""
        return sum(i.duration_s for i in self.instructions)

    @property
    def non_instruction_gpu_s(self) -> float:
        """GPU time of the step after its last instruction (optimizer, gradient all-reduce)."""
        return max(0.0, self.gpu_step_s - self.instruction_span_s)


@dataclass
class _OpenStep:
    index: int
    begin: BoundaryEvent | None  # None until its first instruction's, where that is shared
    seen_s: float = math.nan
    marks: list[tuple[Hashable, BoundaryEvent, BoundaryEvent]] = field(default_factory=list)
    end: BoundaryEvent | None = None
    ended: threading.Event = field(default_factory=threading.Event)  # the follower saw the GPU pass ``end``


class GPUStepTimer:
    """Events at step and instruction boundaries; steps settle as the GPU passes them."""

    def __init__(self, recorder: EventRecorder, follower: StreamFollower, timeline: StreamTimeline) -> None:
        self.recorder = recorder
        self.follower = follower
        self.timeline = timeline
        self._open: _OpenStep | None = None
        self._key: tuple[Hashable, BoundaryEvent] | None = None
        self._waiting: deque[_OpenStep] = deque()
        self._index = 0
        self._anchored = False
        self._lengths: deque[float] = deque(maxlen=FENCE_HISTORY)  # settled steps' GPU time (fence bound)

    # ---------------------------------------------------------------- training thread
    def step_begin(self, at_first_instruction: bool = False) -> None:
        """A step begins. ``at_first_instruction``: its begin event is its first instruction's
        (``begin``), one event fewer per step: the step's GPU time starts there anyway
        (``GPUStep.gpu_step_s``); a step with no instruction gets its own at ``step_end``."""
        if self._open is not None:
            self.step_end()
        self._open = _OpenStep(self._index, None if at_first_instruction else self.recorder.record())
        self._index += 1
        self._anchored = False

    def _anchor(self, step: _OpenStep, begin: BoundaryEvent) -> None:
        """The follower notes when it sees the step's begin event. Handed at the step's first
        instruction, after that instruction's clock requests, which may hang on the same event or
        an earlier one and wait for their due time: the follower sees each event when the GPU gets
        there all the same (``StreamFollower._observe``)."""

        def anchor(seen: float) -> None:
            step.seen_s = seen

        self.follower.follow(begin, anchor)
        self._anchored = True

    def begin(self, key: Hashable, event: BoundaryEvent | None = None) -> None:
        """Instruction begins; ``event``: a begin event already recorded here (``StreamClocks``)."""
        if event is None:
            event = self.recorder.record()
        step = self._open
        if step is not None and not self._anchored:
            if step.begin is None:
                step.begin = event
            self._anchor(step, step.begin)
        self._key = (key, event)

    def end(self) -> None:
        if self._key is None or self._open is None:
            raise GPUError("GPUStepTimer.end() without a matching begin() inside a step")
        key, begin = self._key
        self._key = None
        self._open.marks.append((key, begin, self.recorder.record()))

    def step_end(self) -> None:
        step, self._open = self._open, None
        if step is None:
            return
        if not self._anchored:
            if step.begin is None:
                step.begin = self.recorder.record()
            self._anchor(step, step.begin)
        step.end = self.recorder.record()
        self.follower.follow(step.end, lambda seen: step.ended.set())
        self._waiting.append(step)

    # ---------------------------------------------------------------- reading (never blocks)
    def waiting(self) -> int:
        """Steps ended on the host that the GPU has not finished (or the follower not seen)."""
        return len(self._waiting)

    @property
    def last_index(self) -> int:
        """The index of the step begun last (-1: none yet)."""
        return self._index - 1

    def settled(self, updates: Sequence[CounterUpdate] = ()) -> list[GPUStep]:
        """The steps the GPU has finished, oldest first (each returned once). With energy-counter
        ``updates``, a step settles only once an update after its end exists, and carries its
        energy; without, its energy is NaN."""
        out: list[GPUStep] = []
        while self._waiting:
            step = self._waiting[0]
            if not step.ended.is_set() or math.isnan(step.seen_s):
                break
            try:
                timed = self._timed(step)
            except Exception as exc:  # noqa: BLE001 - a CUDA error reading the events' times
                self.follower.fail(exc)  # the owner reacts as to any failure of the stream
                break
            if updates:
                if updates[-1].t_s < timed.end_s:
                    break
                timed = _with_energy(timed, updates)
            out.append(timed)
            self._lengths.append(timed.end_s - timed.begin_s)
            self._waiting.popleft()
        return out

    def fence(self, timeout_s: float | None = None) -> list[GPUStep]:
        """Every step ended so far, waiting until the follower saw the GPU pass the last one's end
        event (it follows in order: every anchor before it too): the host waits for work already
        queued, never for a device sync. At most ``timeout_s`` (default ``fence_bound_s``: about a
        step), not at all once the follower failed; a step unsettled then stays waiting. Never raises."""
        if not self._waiting:
            return []
        last, follower = self._waiting[-1], self.follower
        deadline = time.monotonic() + (self.fence_bound_s() if timeout_s is None else timeout_s)
        while not follower.failed:
            left = deadline - time.monotonic()
            if left <= 0 or last.ended.wait(min(left, _FENCE_SLICE_S)):
                break
        return self.settled()

    def fence_bound_s(self) -> float:
        """How long ``fence`` waits: about a step (the constants above say how)."""
        if not self._lengths:
            return FIRST_FENCE_S
        return FENCE_FACTOR * max(self._lengths) + FENCE_FLOOR_S

    def _timed(self, step: _OpenStep) -> GPUStep:
        tl, begin = self.timeline, step.begin
        assert begin is not None and step.end is not None  # both recorded by ``step_end``
        base = tl.anchor_time(begin, step.seen_s)
        inst = tuple(TimedInstruction(key, base + tl.seconds_between(begin, b),
                                      base + tl.seconds_between(begin, e)) for key, b, e in step.marks)
        return GPUStep(step.index, base, base + tl.seconds_between(begin, step.end), inst)


def _with_energy(step: GPUStep, updates: Sequence[CounterUpdate]) -> GPUStep:
    first = step.instructions[0].start_s if step.instructions else step.begin_s
    tail = step.instructions[-1].end_s if step.instructions else step.begin_s
    e0, e_tail, e1 = (energy_at(updates, t, AfterLast.HOLD) for t in (first, tail, step.end_s))
    return GPUStep(step.index, step.begin_s, step.end_s, step.instructions, e1 - e0, e1 - e_tail)


NON_INSTRUCTION = "__non_instruction__"


def non_instruction_work(step: GPUStep) -> list[TimedInstruction]:
    """The step's GPU work outside its instructions' span as intervals keyed ``NON_INSTRUCTION``,
    so attribution gives it its own power instead of billing it as idle or to the instructions."""
    if not step.instructions:
        return [TimedInstruction(NON_INSTRUCTION, step.begin_s, step.end_s)]
    tail = step.instructions[-1].end_s
    return [TimedInstruction(NON_INSTRUCTION, tail, step.end_s)] if step.end_s > tail else []
