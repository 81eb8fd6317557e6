"""The runtime's events on the stream the framework computes on, not on whatever stream is current
when a hook happens to run.

Why: frameworks run work on side streams (MoE shared-expert overlap, DeepSpeed's and Megatron's
communication streams) and may call a hook while one is current. An event recorded there is
reached when that stream gets there: at once on an idle side stream, so a clock request hung on it
lands early and a span ends before its work.

Which stream: the one current at each instruction's begin hook, where the framework launches the
instruction's kernels (Megatron, DeepSpeed and torch.distributed.pipelining all compute there).
``ComputeStream`` reads it at that hook (``instruction_begins``) and records every event of the
runtime on it: the instruction's boundaries, its clock requests, the step's end.

An instruction that left work on a side stream: its end hook (``ends_here``, where the end event
is recorded) finds another stream current, and the end event waits for both, an event on each, the
later counts (``JoinedEvent``); the step's end then waits for that side stream too (``step_ends``),
so a step settles only once all of its events are reached. Nothing waits on the framework's
streams: their overlap stays as the framework made it (a refusal would cost a Megatron or DeepSpeed
user the savings for an overlap they chose; an added wait, the overlap itself).

What such a user gets: an instruction's time is its work on its own stream plus whatever it still
has on the stream current at its end; side-stream work the framework leaves running past the
instruction without that stream being current (a gradient reduce-scatter it joins at the
optimizer) overlaps the next instructions and is not theirs: the step's end, recorded after the
framework's join, includes it as non-instruction work.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

from perseus.gpu.stream.follow import BoundaryEvent


class StreamRecorder(Protocol):
    """What ``CudaEventRecorder`` and ``SimStream`` share: the calling thread's current stream, an
    event recorded on a named stream, a completed event taken back, and the follower thread bound
    to the events' device."""

    def current_stream(self) -> Any: ...

    def record(self, stream: Any = None) -> Any: ...

    def recycle(self, event: Any) -> None: ...

    def bind_thread(self) -> None: ...


class JoinedEvent:
    """One boundary on several streams: reached once every stream reached its part."""

    __slots__ = ("parts",)

    def __init__(self, parts: Sequence[BoundaryEvent]) -> None:
        self.parts: tuple[Any, ...] = tuple(parts)

    def query(self) -> bool:
        return all(p.query() for p in self.parts)

    def synchronize(self) -> None:
        for p in self.parts:
            p.synchronize()

    @property
    def gpu_time_s(self) -> float:
        """The simulated GPU's timestamp: the latest part's."""
        return max(float(p.gpu_time_s) for p in self.parts)


def event_parts(event: Any) -> tuple[Any, ...]:
    """The recorded events ``event`` stands for (one, or a ``JoinedEvent``'s parts)."""
    return event.parts if isinstance(event, JoinedEvent) else (event,)


class ComputeStream:
    """Records on the framework's compute stream (the module docstring): the recorder ``StreamClocks``
    and ``GPUStepTimer`` use where a runtime's hooks drive them."""

    def __init__(self, base: StreamRecorder) -> None:
        self._base = base
        self.stream: Any = base.current_stream()  # until the first instruction: the opening thread's
        self._join: list[Any] = []  # the streams the next recorded event also waits for
        self._step_end = False  # the next recorded event is the step's end
        self._step_sides: list[Any] = []  # side streams events of this step waited for
        self.joined = 0  # events recorded on more than one stream

    def instruction_begins(self) -> None:
        """At an instruction's begin hook: its work goes on the stream current now."""
        self.stream = self._base.current_stream()

    def ends_here(self) -> None:
        """At an end hook, before its event is recorded: the next event also waits for the stream
        current now, if it is another one (the instruction left work there)."""
        current = self._base.current_stream()
        self._join = [] if current is self.stream or current == self.stream else [current]

    def step_ends(self) -> None:
        """At the step's end hook, before its end event: that event also waits for every side stream
        an event of the step waited for, so the GPU reaches no event of the step after its end."""
        self.ends_here()
        self._join += [s for s in self._step_sides if s not in self._join and s != self.stream]
        self._step_sides = []
        self._step_end = True

    def record(self) -> BoundaryEvent:
        event: BoundaryEvent = self._base.record(self.stream)
        join, self._join = self._join, []
        step_end, self._step_end = self._step_end, False
        if not join:
            return event
        self.joined += 1
        if not step_end:
            self._step_sides += [s for s in join if s not in self._step_sides]
        return JoinedEvent((event, *(self._base.record(s) for s in join)))

    def recycle(self, event: Any) -> None:
        for part in event_parts(event):
            self._base.recycle(part)

    def bind_thread(self) -> None:
        self._base.bind_thread()
