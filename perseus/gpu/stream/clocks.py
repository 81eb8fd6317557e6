"""Planned clocks that take effect when the GPU reaches each instruction, not when the host
runs its hook.

Why: the host runs instructions ahead of the GPU, so a request made at the hook lands on an
earlier instruction (on the measured H200 not one instruction of a 1F1B step ran at its own
clock). ``StreamClocks.instruction`` is called at each instruction's begin hook with its planned
clock, its planned duration and the next instruction's clock; it records the boundary event and
hangs the *next* instruction's request on it, due ``duration − switch latency − lead`` of GPU time
later: the request goes out when the GPU is ``latency`` (plus a margin for the follower and the
controller) before the end of instruction i, so instruction i+1 starts at its clock.

Why the next one, from i's hook, and not i+1's own from i+1's hook: when the host does not run
ahead (it waited for i's output to send it, or for i+1's input to arrive, as a pipeline stage
does at every hand-off), i+1's hook runs when the GPU is idle and its kernel starts microseconds
later, before any request made there can land (the simulated asynchronous GPU showed 40–60 % of a
1F1B plan's instructions at the previous one's clock that way). From i's hook the request has i's
whole duration to land. Without a duration for i (its first instruction ever, an unprofiled kind)
nothing is hung on it, and i+1's own request hangs on i+1's boundary and lands one follower delay
(~0.1 ms) late.

A controller that can hold a request until a given time (``timed=True``) gets it as soon as
i is seen to begin, stamped with the time it is due; otherwise the follower waits until then.

No request is handed where the clock does not change, and no event is recorded at a boundary
nothing hangs on (an instruction whose clock and next clock are the one already asked for), unless
the caller keeps it (the step timer's): an event is the hook's largest cost on a real card.

A request for ``mhz`` <= 0 is one for default clocks (the controller's reset): the GPU's work
between steps runs there (``ahead``), and counts as the highest clock when a switch's direction
sets its lead.
"""

from __future__ import annotations

from collections.abc import Callable

from perseus.gpu.errors import GPUInvalidArgumentError
from perseus.gpu.stream.follow import BoundaryEvent, EventRecorder, StreamFollower

# The request is due this long before the GPU boundary: the follower's poll and the controller's
# delivery (~0.3 ms), plus a share of the previous instruction's duration for its timing noise.
DEFAULT_LEAD_S = 0.001
DEFAULT_LEAD_FRACTION = 0.05

ClockRequest = Callable[[int, "float | None"], None]  # (mhz, at CLOCK_MONOTONIC or None = now)


class StreamClocks:
    """Per-instruction clock requests ordered with the stream (training-thread side)."""

    def __init__(self, recorder: EventRecorder, follower: StreamFollower, request: ClockRequest, *,
                 switch_latency_s: float = 0.0, timed: bool = False, lead_s: float = DEFAULT_LEAD_S,
                 lead_fraction: float = DEFAULT_LEAD_FRACTION) -> None:
        if switch_latency_s < 0 or lead_s < 0 or not 0 <= lead_fraction < 1:
            raise GPUInvalidArgumentError("switch latency and lead are seconds >= 0, lead_fraction in [0, 1)")
        self.recorder = recorder
        self.follower = follower
        self._request = request
        self.switch_latency_s = switch_latency_s
        self.timed = timed
        self.lead_s = lead_s
        self.lead_fraction = lead_fraction
        self._prev: tuple[BoundaryEvent, float | None] | None = None
        self._last_mhz: int | None = None
        self.requests = 0

    def instruction(self, mhz: int, planned_s: float | None, next_mhz: int | None = None,
                    keep: bool = False) -> BoundaryEvent | None:
        """Instruction i begins on the host: its clock ``mhz``, its planned GPU time ``planned_s``
        (None: unknown), the next instruction's clock ``next_mhz`` (None: unknown, asked for at its
        own hook). Returns its begin event, for the timer to share, or None where none was
        recorded: an event costs the host ~5 µs on a real card, so one is recorded only where a
        request hangs on it (a clock that changes here or at the next instruction, or one the next
        hook may hang on it: ``next_mhz`` unknown) or the caller ``keep``s it (a step's first)."""
        last = self._last_mhz
        if mhz == last and not keep and (planned_s is None or next_mhz == mhz):
            self._prev = None  # nothing hangs on it: a later request hangs on its own boundary
            return None
        event = self.recorder.record()
        prev, self._prev = self._prev, (event, planned_s)
        if mhz != last:  # not asked for ahead: now, or hung on the one before
            self._last_mhz = mhz
            self.requests += 1
            if prev is None or prev[1] is None:
                self.follower.follow(event, lambda seen: self._request(mhz, None))
            else:
                self._hang(prev, mhz, down=_lower(mhz, last))
        if next_mhz is not None and planned_s is not None and next_mhz != mhz:
            self._last_mhz = next_mhz
            self.requests += 1
            self._hang((event, planned_s), next_mhz, down=_lower(next_mhz, mhz))
        return event

    def ahead(self, mhz: int) -> None:
        """The clock of the GPU's work after the last instruction handed (at step end: the work
        between steps, at default clocks), requested as if it followed that instruction, so it is
        in effect when the instruction is done. Nothing hangs on the work after it: the next
        ``instruction`` asks for its own clock at its own begin, and sends nothing if it is this one."""
        prev, self._prev = self._prev, None
        last = self._last_mhz
        if mhz == last:
            return
        self._last_mhz = mhz
        self.requests += 1
        if prev is None or prev[1] is None:
            self.follower.follow(self.recorder.record(), lambda seen: self._request(mhz, None))
            return
        self._hang(prev, mhz, down=_lower(mhz, last))

    def _hang(self, prev: tuple[BoundaryEvent, float | None], mhz: int, down: bool = False) -> None:
        """The request for ``mhz`` on ``prev`` (an instruction's begin event, its planned time).

        ``down``: a lower clock than the instruction's own. Landing early runs the end of that
        instruction slower than planned (seen on the asynchronous simulated GPU: +0.2–0.4 ms on
        each instruction before a switch down, on the critical path too), while a switch up that
        lands early only runs it faster; so a switch down leads by ``lead_s`` alone (the
        follower's and the controller's delay), a switch up also by ``lead_fraction`` of the
        instruction (its timing noise)."""
        planned = prev[1] or 0.0
        lead = self.lead_s if down else self.lead_s + self.lead_fraction * planned
        ahead = max(0.0, planned - self.switch_latency_s - lead)
        if self.timed:
            self.follower.follow(prev[0], lambda seen: self._request(mhz, seen + ahead))
        else:
            self.follower.follow(prev[0], lambda seen: self._request(mhz, None), after_s=ahead)

    def boundary(self, mhz: int) -> None:
        """A clock for the GPU's next work that is not a planned instruction (a step's default
        clock for a probe, a new plan's first clock): it lands when the GPU reaches this point."""
        event = self.recorder.record()
        self._prev = (event, None)
        self._last_mhz = mhz
        self.requests += 1
        self.follower.follow(event, lambda seen: self._request(mhz, None))

    def forget(self) -> None:
        """The next instruction starts a fresh chain (after a fallback or a plan change)."""
        self._prev = None
        self._last_mhz = None


def _lower(mhz: int, than: int | None) -> bool:
    """Whether a switch from ``than`` to ``mhz`` goes down (default clocks, <= 0, are the highest)."""
    if than is None or mhz <= 0:
        return False
    return than <= 0 or mhz < than
