"""Host actions ordered with the GPU stream: the training thread marks a boundary, a follower
thread acts when the GPU gets there.

Why: the host runs ahead of the GPU (5 instructions, 79 ms median, on the measured H200 in a 1F1B
step), so a clock requested at an instruction's hook lands instructions early. The training
thread instead records an event at the boundary (``torch.cuda.Event`` on a real GPU, a
``SimEvent`` on the simulated one) and hands it with the action to ``StreamFollower``; the
follower's thread waits for the event and runs the action when the GPU has reached it, or
``after_s`` of GPU time later (a switch-ahead request for instruction i+1 hangs on instruction
i's begin event with ``after_s`` = i's profiled duration − the switch latency − the follower's lead).

How it waits (measured on the H200, delay from the GPU reaching a boundary to the action):
``event.query()`` every 50 µs: 97 µs median, 151 µs p99, 0.07 core, step time ×1.0015 — the
default (``FollowMechanism.POLL``); a blocking ``event.synchronize()`` (``BLOCK``): 46 µs with a
spinning sync (0.9 core) or 267 µs with blocking-sync events. Host functions on the stream stall
it, and a device sync before each instruction costs 1.5 % step time: neither is offered.

The training thread's cost is one event record and one deque append; it never synchronizes.

A follower fails on the first exception on its thread (an event's ``query``/``synchronize`` raising a
CUDA error, e.g. a graph captured in the global capture mode while it polls; an action raising): it
keeps the error (``error``, ``failed``) and from then on drops every action, pending or handed later,
without touching its event: a clock request whose boundary cannot be observed would land late, on
whatever the GPU runs then. Its owner reads ``failed`` and stops relying on it (the runtime: default
clocks, host-timed steps); the thread lives on, idle, until ``close``.
"""

from __future__ import annotations

import math
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from enum import Enum
from typing import Any, Protocol

from perseus.gpu.errors import GPUError, GPUInvalidArgumentError

DEFAULT_POLL_S = 50e-6


class BoundaryEvent(Protocol):
    """What ``torch.cuda.Event`` and ``SimEvent`` share: has the GPU reached it?"""

    def query(self) -> bool: ...

    def synchronize(self) -> None: ...


class EventRecorder(Protocol):
    """Records a boundary event at the current end of the stream (training thread)."""

    def record(self) -> BoundaryEvent: ...


class FollowMechanism(Enum):
    """How the follower thread waits for an event."""

    POLL = "poll"  # event.query() every poll_s: the default
    BLOCK = "block"  # event.synchronize() on the follower thread


class CudaEventRecorder:
    """``torch.cuda.Event`` recorded on a stream (the current one unless named), from a recycled pool.

    ``enable_timing``: events that ``elapsed_time`` can measure (``GPUStepTimer`` on a real GPU,
    through ``CudaTimeline``); a clock request's boundary needs none (cheaper to record)."""

    def __init__(self, enable_timing: bool = False) -> None:
        import torch

        if not torch.cuda.is_available():
            raise GPUError("CudaEventRecorder needs a CUDA build of torch and a visible GPU")
        self._torch = torch
        self._event_cls = torch.cuda.Event
        self.enable_timing = enable_timing
        self.device = int(torch.cuda.current_device())  # the events' device, the training thread's
        self._pool: deque[Any] = deque()
        # The current stream as (id, device, type): 0.3-0.4 µs on the H200, where torch.cuda.current_stream
        # builds a Stream each call (3.1 µs); each stream's Stream is built once (``current_stream``).
        self._raw_current: Callable[[int], tuple[int, int, int]] | None = getattr(
            getattr(torch, "_C", None), "_cuda_getCurrentStream", None)
        self._streams: dict[tuple[int, int, int], Any] = {}

    def bind_thread(self) -> None:
        """Make the events' device current on the calling thread (the follower's, at its start): a
        thread's first CUDA call otherwise creates a context on GPU 0, memory on a GPU not its rank's."""
        self._torch.cuda.set_device(self.device)

    def current_stream(self) -> Any:
        """The calling thread's current stream on the events' device (``ComputeStream`` reads it at
        each hook), the same object for the same stream."""
        if self._raw_current is None:
            return self._torch.cuda.current_stream(self.device)
        key = self._raw_current(self.device)
        stream = self._streams.get(key)
        if stream is None:
            stream = self._streams[key] = self._torch.cuda.Stream(stream_id=key[0], device_index=key[1],
                                                                  device_type=key[2])
        return stream

    def record(self, stream: Any = None) -> BoundaryEvent:
        """An event at the end of ``stream`` (None: the current stream, ``torch.cuda.Event.record``'s;
        on the H200 a named stream costs 2-3 µs, the current one 7-10 µs: torch looks it up)."""
        try:
            ev = self._pool.pop()
        except IndexError:
            ev = self._event_cls(enable_timing=self.enable_timing)
        ev.record(stream)
        return ev

    def recycle(self, event: BoundaryEvent) -> None:
        """A completed event may be recorded again (the follower gives it back)."""
        self._pool.append(event)


@dataclass(frozen=True)
class Followed:
    """One followed boundary: when the follower saw the GPU there, when it acted and when the action
    was due (``seen_s`` + its ``after_s``), CLOCK_MONOTONIC s: ``acted_s − due_s`` is the follower's
    own lateness, what a loaded host adds to the stream's timing."""

    seen_s: float
    acted_s: float
    due_s: float = math.nan


class _Item:
    __slots__ = ("action", "after_s", "event", "seen_s")

    def __init__(self, event: BoundaryEvent, action: Callable[[float], None], after_s: float) -> None:
        self.event, self.action, self.after_s = event, action, after_s
        self.seen_s = 0.0  # when the follower saw the GPU reach ``event``: set once it has


class StreamFollower:
    """A thread that runs each handed action once the GPU reaches its event, in stream order.

    ``follow`` is the training thread's whole cost. Actions run on the follower's thread, in the
    order handed, get the time the GPU was seen at the boundary, and must not block (a clock
    request is a pipe write). That time is taken when the GPU gets there, also while an earlier
    action waits for its ``after_s`` (``_observe``).
    Any exception on the thread fails the follower (the module docstring): ``error`` keeps it and
    every action from then on is dropped. ``on_start`` runs first on the thread (binding its CUDA
    device: ``CudaEventRecorder.bind_thread``); its exception fails the follower too.
    """

    def __init__(self, mechanism: FollowMechanism = FollowMechanism.POLL, poll_s: float = DEFAULT_POLL_S,
                 clock: Callable[[], float] = time.monotonic, on_done: Callable[[BoundaryEvent], None] | None = None,
                 keep_log: bool = False, on_start: Callable[[], None] | None = None) -> None:
        if not 0 < poll_s <= 0.01:
            raise GPUInvalidArgumentError(f"poll_s is the event poll period in seconds, in (0, 0.01], got {poll_s!r}")
        self.mechanism = mechanism
        self.poll_s = poll_s
        self._clock = clock
        self._on_done = on_done
        self._on_start = on_start
        self._items: deque[_Item] = deque()
        self._wake = threading.Event()
        self._stop = False
        self.error: BaseException | None = None
        self.log: list[Followed] | None = [] if keep_log else None
        self.followed = 0
        self.handed = 0  # actions handed so far (training thread); ``followed`` of them ran
        self.cpu_s = 0.0  # the follower thread's CPU time, updated as it runs
        self._thread = threading.Thread(target=self._run, name="perseus-stream-follower", daemon=True)
        self._thread.start()

    def follow(self, event: BoundaryEvent, action: Callable[[float], None], after_s: float = 0.0) -> None:
        """Run ``action(seen_s)`` when the GPU reaches ``event`` (+ ``after_s`` of GPU time); dropped
        once the follower failed."""
        if self.error is not None:
            return
        self._items.append(_Item(event, action, after_s))
        self.handed += 1
        if not self._wake.is_set():
            self._wake.set()

    @property
    def failed(self) -> bool:
        """Whether an exception stopped the following (``error``): no action runs any more."""
        return self.error is not None

    def pending(self) -> int:
        return len(self._items)

    def drain(self, timeout_s: float = 5.0) -> bool:
        """Wait until every handed action ran (shutdown, tests; never on the hot path); False when
        some did not (timeout, or the follower failed and dropped them)."""
        deadline = self._clock() + timeout_s
        while self._items and self.error is None and self._clock() < deadline:
            time.sleep(max(self.poll_s, 1e-4))
        return not self._items and self.error is None

    def close(self) -> None:
        """Stop the thread; actions not yet due are dropped."""
        self._stop = True
        self._wake.set()
        self._thread.join()

    # ---------------------------------------------------------------- follower thread
    def _run(self) -> None:
        cpu0 = time.thread_time()
        items, clock, poll = self._items, self._clock, self.poll_s
        if self._on_start is not None:
            try:
                self._on_start()
            except BaseException as exc:  # noqa: BLE001 - the owner reads ``failed``
                self._fail(exc)
        seen_upto = 0  # the leading items whose event the GPU was seen to reach (their ``seen_s`` set)
        while not self._stop:
            if not items:
                seen_upto = 0
                self._wake.clear()
                if not items:
                    self._wake.wait(0.005)
                self.cpu_s = time.thread_time() - cpu0
                continue
            if self.error is not None:  # failed: an item handed in the race with ``_fail`` is dropped
                items.clear()
                seen_upto = 0
                continue
            try:
                item = items[0]
                if seen_upto == 0:
                    if self.mechanism is FollowMechanism.BLOCK:
                        item.event.synchronize()
                    elif not item.event.query():
                        time.sleep(poll)
                        continue
                    item.seen_s = clock()
                    seen_upto = self._observe(items, 1)
                seen = item.seen_s
                due = seen + item.after_s
                while not self._stop and clock() < due - poll:
                    time.sleep(min(poll, due - clock()))
                    seen_upto = self._observe(items, seen_upto)
                items.popleft()
                seen_upto -= 1
                item.action(seen)
                acted = clock()
                self.followed += 1
                if self.log is not None:
                    self.log.append(Followed(seen, acted, due))
                if self._on_done is not None:
                    self._on_done(item.event)
            except BaseException as exc:  # noqa: BLE001 - a CUDA error included: the owner reads ``failed``
                self._fail(exc)
        self.cpu_s = time.thread_time() - cpu0

    def _observe(self, items: deque[_Item], k: int) -> int:
        """Notes when the GPU was seen at the events of ``items[k:]`` it has reached (in stream
        order: the first not reached ends it) and returns how many leading items are seen.

        Why: an action may wait for its due time (an untimed switch-ahead request), and the items
        behind it must still be seen when the GPU gets there, not when that action has run: else a
        step's anchor behind such a request is late by its wait (about the first instruction's
        time) and a default-clock step's is not, which biases the guard's A/B between them."""
        clock = self._clock
        while k < len(items):
            item = items[k]
            try:
                if not item.event.query():
                    break
            except Exception:  # noqa: BLE001 - it fails the follower at its own turn, after the actions before it
                break
            item.seen_s = clock()
            k += 1
        return k

    def fail(self, exc: BaseException) -> None:
        """The owner saw the stream fail elsewhere (reading a followed event's time): fail as if
        this thread had."""
        self._fail(exc)

    def _fail(self, exc: BaseException) -> None:
        """Keep the first error and drop everything pending: none of it may run late."""
        if self.error is None:
            self.error = exc
        self._items.clear()
