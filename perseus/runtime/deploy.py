"""Following one stage's frequency plan, instruction by instruction, and noticing when it breaks.

The plan is only valid for the instruction order it was made for. ``PlanFollower.next`` is called
on every instruction (the hottest path in perseus): it compares the executed instruction with
the planned one by index — a tuple comparison and a list read, nothing else — and returns the
planned clock, or ``None`` at the first difference (schedule changed, different microbatch
count), after which the follower stays broken so the engine can fall back once.
"""

from __future__ import annotations

from typing import Sequence

from perseus.schedule import Instruction


def request_clocks(freqs: Sequence[int], raise_early: bool) -> list[int]:
    """The clock to ask for at each instruction of a step: its planned one; with ``raise_early``,
    the next instruction's when that is faster (the step wraps to the next step's first).

    Why: a switch lands some time after it is asked for. A switch *up* that the runtime asks for
    when the previous instruction ends can land inside the instruction that needed it, slowing it
    (the planner counted it at the faster clock); asked for one instruction earlier, it lands
    during that instruction, which it can only make faster. A switch *down* is never asked early:
    it would slow the instruction still running. The price is energy on the instruction before a
    speed-up, when the switch lands before that one ends.
    """
    out = [int(f) for f in freqs]
    if raise_early and out:
        out = [max(f, out[(i + 1) % len(out)]) for i, f in enumerate(out)]
    return out


class PlanFollower:
    """Planned clock per executed instruction of one stage; detects a diverging order."""

    __slots__ = ("_expected", "_freqs", "_requests", "_pos", "broken", "problem", "stage")

    def __init__(self, plan: Sequence[tuple[Instruction, int]], stage: int = 0, *, raise_early: bool = False) -> None:
        self._expected = [(inst.kind, inst.microbatch, inst.chunk) for inst, _ in plan]
        self._freqs = [int(f) for _, f in plan]
        self._requests = request_clocks(self._freqs, raise_early)
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
        """The clock to ask for at this instruction (its planned one unless ``raise_early``
        raises it, see ``request_clocks``), or None if it is not the one the plan expects."""
        if self.broken:
            return None
        pos = self._pos
        if pos < len(self._expected) and self._expected[pos] == (kind, microbatch, chunk):
            self._pos = pos + 1
            return self._requests[pos]
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
        """The clock to ask for at the instruction after the last one followed (the next step's
        first at the end of a step): what to request ahead, so the switch lands before it starts."""
        pos = self._pos
        return self._requests[pos] if pos < len(self._requests) else self._requests[0]

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
