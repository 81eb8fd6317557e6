"""Following one stage's frequency plan, instruction by instruction, and noticing when it breaks;
and the hooks that ask for its clock switches at planned times (``TimedSwitches``).

The plan is only valid for the instruction order it was made for. ``PlanFollower.next`` is called
on every instruction (the hottest path in perseus): it compares the executed instruction with
the planned one by index — a tuple comparison and a list read, nothing else — and returns the
planned clock, or ``None`` at the first difference (schedule changed, different microbatch
count), after which the follower stays broken so the engine can fall back once.
"""

from __future__ import annotations

from collections import deque
from statistics import median
from typing import Sequence

from perseus.schedules import Instruction
from perseus.timeline.switch_timing import TimedRequest

GAP_STEPS = 5  # steps whose time between steps sets the shift of requests made for the next step


class TimedSwitches:
    """Which instruction hook asks for which clock switch, and when, on a GPU with a switch latency.

    ``requests`` come from ``perseus.timeline.switch_timing.request_schedule`` on the plan's timeline: each
    hook sends its requests to be made ``delay`` after it (the controller holds them until then),
    so every switch lands between its two instructions. Requests for the next step's first
    instructions are made near the end of a step; between steps the host does work no plan knows
    (the optimizer step), so those are delayed by how much longer than planned the time from a
    step's last instruction to the next step's first was (``shift_s``: the median of the last
    ``GAP_STEPS`` steps; ``end_step`` updates it, never the hooks).
    """

    __slots__ = ("at_begin", "at_end", "planned_gap_s", "shift_s", "_last", "_last_end", "_gaps")

    def __init__(self, requests: Sequence[TimedRequest], instructions: int, planned_gap_s: float) -> None:
        begin: list[list[tuple[float, int, bool]]] = [[] for _ in range(instructions)]
        end: list[list[tuple[float, int, bool]]] = [[] for _ in range(instructions)]
        for r in sorted(requests, key=lambda r: r.delay_s):
            (end if r.at_end else begin)[r.anchor].append((r.delay_s, r.clock_mhz, r.next_step))
        # per instruction: its hook's requests, or () (the hot path tests truthiness only)
        self.at_begin: list[tuple[tuple[float, int, bool], ...]] = [tuple(x) for x in begin]
        self.at_end: list[tuple[tuple[float, int, bool], ...]] = [tuple(x) for x in end]
        self.planned_gap_s = planned_gap_s  # from the last instruction's end to the next step's first begin
        self.shift_s = 0.0
        self._last = instructions - 1
        self._last_end: float | None = None
        self._gaps: deque[float] = deque(maxlen=GAP_STEPS)

    def begin(self, index: int, now: float) -> list[tuple[int, float]]:
        """(clock, CLOCK_MONOTONIC time to ask for it) for the begin hook of instruction ``index``."""
        if index == 0 and self._last_end is not None:
            self._gaps.append(now - self._last_end - self.planned_gap_s)
        shift = self.shift_s
        return [(clock, now + delay + (shift if nxt else 0.0)) for delay, clock, nxt in self.at_begin[index]]

    def end(self, index: int, now: float) -> list[tuple[int, float]]:
        """The same for the end hook of instruction ``index``."""
        if index == self._last:
            self._last_end = now
        shift = self.shift_s
        return [(clock, now + delay + (shift if nxt else 0.0)) for delay, clock, nxt in self.at_end[index]]

    def watches(self, index: int, at_end: bool) -> bool:
        """Whether that hook has requests to send or a time to note (the engine then reads the clock)."""
        return bool(self.at_end[index] if at_end else self.at_begin[index]) or index == (self._last if at_end else 0)

    def end_step(self) -> None:
        if self._gaps:
            self.shift_s = median(self._gaps)


class PlanFollower:
    """Planned clock per executed instruction of one stage; detects a diverging order."""

    __slots__ = ("_expected", "_freqs", "_pos", "broken", "problem", "stage")

    def __init__(self, plan: Sequence[tuple[Instruction, int]], stage: int = 0) -> None:
        self._expected = [(inst.kind, inst.microbatch, inst.chunk) for inst, _ in plan]
        self._freqs = [int(f) for _, f in plan]
        self._pos = 0
        self.stage = stage
        self.broken = False
        self.problem = ""

    @property
    def frequencies(self) -> list[int]:
        return list(self._freqs)

    def start_step(self) -> None:
        self._pos = 0

    def next(self, kind: str, microbatch: int, chunk: int) -> int | None:
        """The planned clock of this instruction, or None if it is not the one the plan expects."""
        if self.broken:
            return None
        pos = self._pos
        if pos < len(self._expected) and self._expected[pos] == (kind, microbatch, chunk):
            self._pos = pos + 1
            return self._freqs[pos]
        if pos < len(self._expected):
            k, m, c = self._expected[pos]
            wanted = f"{k} of microbatch {m} (chunk {c})"
        else:
            wanted = f"no more instructions (the plan has {len(self._expected)})"
        self._break(
            f"stage {self.stage}, instruction #{pos}: executed {kind} of microbatch {microbatch} (chunk {chunk}) "
            f"but the plan expects {wanted}"
        )
        return None

    def peek(self) -> int:
        """The clock of the instruction after the last one followed (the next step's first at the
        end of a step): what to request ahead, so the switch lands before it starts."""
        pos = self._pos
        return self._freqs[pos] if pos < len(self._freqs) else self._freqs[0]

    @property
    def index(self) -> int:
        """Position in the step of the instruction last followed."""
        return self._pos - 1

    def planned(self) -> int:
        """The planned clock of the instruction last followed (for traces, not the hot path)."""
        return self._freqs[self._pos - 1]

    def end_step(self) -> bool:
        """True when the step executed exactly the planned instructions."""
        if not self.broken and self._pos != len(self._expected):
            self._break(
                f"stage {self.stage}: the step ended after {self._pos} instructions "
                f"but the plan has {len(self._expected)}"
            )
        return not self.broken

    def _break(self, problem: str) -> None:
        self.broken = True
        self.problem = problem

    def step_clocks(self, default_mhz: int) -> dict[int, int]:
        """Instructions of the current step per clock (step end only, never the hot path): the
        planned clocks of those followed; after a divergence, the rest of the plan's count at
        ``default_mhz`` (the clock it falls back to)."""
        counts: dict[int, int] = {}
        for freq in self._freqs[: self._pos]:
            counts[freq] = counts.get(freq, 0) + 1
        rest = len(self._freqs) - self._pos
        if self.broken and rest:
            counts[default_mhz] = counts.get(default_mhz, 0) + rest
        return counts
