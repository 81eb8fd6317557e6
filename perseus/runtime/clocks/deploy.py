"""Following one stage's frequency plan, instruction by instruction, and noticing when it breaks;
and the hooks that ask for its clock switches at planned times (``TimedSwitches``, made for each
deployed point by ``SwitchTiming``). ``Deployment`` holds both for the point being run, with what
the deployed steps gather for the periodic job check.

The GPU's work between steps (the optimizer, the gradient all-reduce: 30-40 ms at high power on
an H200) is no planned instruction: it runs at default clocks (``BETWEEN_STEPS_MHZ``), asked for
after a step's last instruction, and the next step's first clock is asked for at that step's first
instruction, not ahead across that work (where it would run at a planned, maybe low, clock). A
GPU with no such work (``works_between_steps``: a simulated one without a step tail) keeps one
lock across steps: the next step's first clock is asked for ahead, as for any instruction.

A planned clock may be ``UNLOCKED_MHZ``: default clocks, the card's own DVFS (the GPU stream reads
a clock <= 0 so; on the host it is ``GPUPort.release``, asked once until a locked clock is). No
locked clock above the one this card sustained under the instruction's kind in warm-up is ever
asked for (``capped``): the card would throttle back to it anyway.

The plan is only valid for the instruction order it was made for. ``PlanFollower.next`` is called
on every instruction (the hottest path in perseus): it compares the executed instruction with
the planned one by index — a tuple comparison and a list read, nothing else — and returns the
planned clock, or ``None`` at the first difference (schedule changed, different microbatch
count), after which the follower stays broken so the engine can fall back once.
"""

from __future__ import annotations

import logging
from collections import deque
from concurrent.futures import Future
from statistics import median
from time import monotonic
from typing import Sequence

from perseus.runtime.plane.collective import Collective, PipelineRow
from perseus.runtime.job import PipelineJob
from perseus.runtime.port.gpu_port import GPUPort
from perseus.runtime.port.gpu_timeline import RESET_MHZ
from perseus.runtime.clocks.job_check import JobCheck, job_check, start_check
from perseus.gpu.meter.clock_samples import SustainedClock
from perseus.planner.stage_plan import StagePlan, StagePoint
from perseus.profile.unlocked import UNLOCKED_MHZ
from perseus.schedules import Instruction
from perseus.timeline.switch_timing import TimedRequest, request_schedule

log = logging.getLogger("perseus.runtime")

GAP_STEPS = 5  # steps whose time between steps sets the shift of requests made for the next step
BETWEEN_STEPS_MHZ = RESET_MHZ  # the clock of the GPU's work between steps: default (unlocked) clocks


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


class SwitchTiming:
    """Whether a deployed point's switches are timed for a known switch latency
    (``planner_options.switch_latency_s``), and their ``TimedSwitches``; says once why not."""

    def __init__(self, latency_s: float, switch_ahead: bool, timed_requests: bool, speak: bool) -> None:
        self.latency_s = latency_s
        self.switch_ahead = switch_ahead
        self.hides = switch_ahead and latency_s > 0  # the planner then keeps timelines too
        self.timed_requests = timed_requests  # the controller holds a request until its time
        self.speak = speak  # rank 0 logs the note
        self.note: str | None = None  # why a known latency is not hidden

    def for_point(self, plan: StagePlan, point: StagePoint, clocks: list[int]) -> TimedSwitches | None:
        """The hooks' timed requests for ``point`` (``perseus.timeline.switch_timing``), or None: latency 0,
        ``switch_ahead`` off, a controller that makes every request at once (clockd), or a plan
        without its timeline (a frontier given without a profile); then each clock is asked for
        when the previous instruction ends."""
        if not self.hides or not clocks:
            return None
        timeline = plan.timeline(point)
        why = None
        if not self.timed_requests:
            why = "the clock controller (perseus clockd) makes every request at once"
        elif timeline is None:
            why = "the plan came without its planned timeline (a frontier given without a profile)"
        if why is not None:
            if self.note is None and self.speak:
                log.warning("perseus: switch latency %.1f ms not hidden: %s; each clock is requested when the "
                            "previous instruction ends", 1e3 * self.latency_s, why)
            self.note = why
            return None
        assert timeline is not None
        begin, end = timeline
        requests = request_schedule(begin, end, clocks, self.latency_s, point.time_s)
        return TimedSwitches(requests, len(clocks), float(point.time_s + begin[0] - end[-1]))


def _described(kind: str, microbatch: int, chunk: int, backward: tuple[int, int] | None) -> str:
    text = f"{kind} of microbatch {microbatch} (chunk {chunk})"
    return text if backward is None else f"{text} with the backward of microbatch {backward[0]} (chunk {backward[1]})"


class PlanFollower:
    """Planned clock per executed instruction of one stage; detects a diverging order."""

    __slots__ = ("_expected", "_freqs", "_pos", "broken", "problem", "stage")

    def __init__(self, plan: Sequence[tuple[Instruction, int]], stage: int = 0) -> None:
        self._expected = [(inst.kind, inst.microbatch, inst.chunk, inst.backward_pair()) for inst, _ in plan]
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

    def next(self, kind: str, microbatch: int, chunk: int, backward: tuple[int, int] | None = None) -> int | None:
        """The planned clock of this instruction, or None if it is not the one the plan expects
        (``backward``: a fused unit's backward (microbatch, chunk), checked too)."""
        pos = self.advance(kind, microbatch, chunk, backward)
        return self._freqs[pos] if pos >= 0 else None

    def advance(self, kind: str, microbatch: int, chunk: int, backward: tuple[int, int] | None = None) -> int:
        """This instruction's position in the plan's step, or -1 if it is not the one the plan
        expects (the follower is broken from then on): ``next`` for callers that index their own
        per-position tables."""
        if self.broken:
            return -1
        pos = self._pos
        if pos < len(self._expected) and self._expected[pos] == (kind, microbatch, chunk, backward):
            self._pos = pos + 1
            return pos
        if pos < len(self._expected):
            wanted = _described(*self._expected[pos])
        else:
            wanted = f"no more instructions (the plan has {len(self._expected)})"
        self._break(
            f"stage {self.stage}, instruction #{pos}: executed {_described(kind, microbatch, chunk, backward)} "
            f"but the plan expects {wanted}"
        )
        return -1

    def peek(self) -> int | None:
        """The clock of the instruction after the last one followed: what to request ahead, so the
        switch lands before it starts; None after the step's last (the work between steps runs at
        default clocks, and the next step's first clock is asked for at its own begin)."""
        pos = self._pos
        return self._freqs[pos] if pos < len(self._freqs) else None

    @property
    def first(self) -> int:
        """The clock of a step's first instruction (0 for a plan of none: nothing to ask for)."""
        return self._freqs[0] if self._freqs else 0

    @property
    def index(self) -> int:
        """Position in the step of the instruction last followed."""
        return self._pos - 1

    def planned(self) -> int:
        """The planned clock of the instruction last followed (for traces, not the hot path)."""
        return self._freqs[self._pos - 1]

    def end_step(self) -> bool:
        """True when the step executed exactly the planned instructions."""
        if not self.broken and self._pos == 0 and self._expected:
            self._break(
                f"stage {self.stage}: no instruction hook ran in the step (a CUDA graph replaying the whole "
                "iteration, e.g. megatron-core's cuda_graph_impl=\"full_iteration\", runs no hook): a "
                "per-instruction plan cannot be followed; capture the iteration without the pipeline schedule "
                "or run without CUDA graphs"
            )
        elif not self.broken and self._pos != len(self._expected):
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


class Deployment:
    """One rank's deployed plan: the follower and timed switches of the point it runs (what the
    hooks read), the (natural time, energy) of the deployed steps since the last job check, and
    why it fell back (the first problem only; one warning per run)."""

    def __init__(self, stage: int, switches: SwitchTiming, check_every: int, gpu: GPUPort) -> None:
        self.stage = stage
        self.gpu = gpu
        self.switches = switches
        self.check_every = check_every  # deployed steps between job checks (0: none)
        self.follower: PlanFollower | None = None
        self.timed: TimedSwitches | None = None
        # With a GPU timeline, per position in the step: (its clock, its planned GPU time or None
        # without the plan's timeline, the next instruction's clock): ``GPUTimeline.clock``'s
        # arguments, so the hook makes one list read (docs/runtime.md, "GPU time").
        self.stream_requests: list[tuple[int, float | None, int]] = []
        self.watches_end = False  # whether ``end_instruction`` has anything to do (the engine skips it)
        self.window: list[tuple[float, float]] = []
        self.steps = 0
        # An overlapped job check asked at a check and answered at the next: (answer, step asked).
        self._pending: tuple[Future[list[PipelineRow]], int] | None = None
        self.problem: str | None = None  # why this rank runs default clocks; None while it follows
        self._warned = False
        self._unlocked: bool | None = None  # whether the host asked for default clocks last (None: unknown)
        self.between_steps = works_between_steps(gpu)  # default clocks after a step's last instruction

    def restart(self) -> None:
        """A (new) deployment: the job check counts from here."""
        self.steps = 0
        self.window = []
        self._pending = None  # every rank restarts at the same step: the answer is dropped everywhere

    def follow(self, plan: StagePlan, point: StagePoint) -> None:
        """Follow ``point``'s clocks of this stage from the next instruction on (``capped``)."""
        pairs = capped(plan.stage_plan(point, self.stage), getattr(self.gpu, "sustained", None))
        self.follower = PlanFollower(pairs, self.stage)
        self._unlocked = None
        if self.gpu.timeline is not None:  # requests follow the stream (gpu_timeline.py), in GPU time
            self.timed = None
            timeline = plan.timeline(point)
            clocks = [int(f) for _, f in pairs]
            planned: list[float | None] = ([float(e - b) for b, e in zip(*timeline)] if timeline is not None
                                           else [None] * len(clocks))
            # the last one's next clock: the work between steps' (default), the next step's first is
            # asked for at its own begin (``step_ending``)
            after = [BETWEEN_STEPS_MHZ] if self.between_steps else clocks[:1]
            self.stream_requests = list(zip(clocks, planned, clocks[1:] + after))
            self.watches_end = False
            if pairs:  # between steps (the GPU passed the last one's end): the first clock, in effect now
                first = pairs[0][1]
                if first == UNLOCKED_MHZ:
                    self.gpu.reset()
                else:
                    self.gpu.apply(first)
            return
        self.timed = self.switches.for_point(plan, point, [f for _, f in pairs])
        self.watches_end = self.timed is not None or self.switches.switch_ahead
        if self.timed is not None and pairs:
            # The new plan's first clock at once (and no request of the old plan still held): the
            # requests for a step's first instructions are made in the step before. ``_ask`` with
            # the host's state unknown: ``request_now`` (default clocks: ``release``), not a timed one.
            self._ask(pairs[0][1])

    def _ask(self, freq: int) -> None:
        """A planned clock asked for on the host now: default clocks for ``UNLOCKED_MHZ`` (once
        until a locked clock is asked for), else the clock where it is not the one asked already."""
        gpu = self.gpu
        if freq == UNLOCKED_MHZ:
            if self._unlocked is not True:
                self._unlocked = True
                gpu.release()
        elif self._unlocked is not False:  # released (the port reads default clocks, maybe this one) or unknown
            self._unlocked = False
            gpu.request_now(freq)
        elif freq != gpu.current_mhz:
            gpu.request(freq)

    def _ask_at(self, freq: int, at: float) -> None:
        """A timed switch, held until ``at``. The controller holds clocks, not resets, so an unlocked
        instruction's switch is the card's default clock locked at ``at``: a reset sent now would
        run the instructions before it at default clocks (the unlocked card's clock under their load
        wherever the default clock is above what the power cap sustains)."""
        self._unlocked = False
        self.gpu.request_at(self.gpu.default_mhz if freq == UNLOCKED_MHZ else freq, at)

    # ---------------------------------------------------------------- the hooks (hot path: O(1))

    def begin_instruction(self, kind: str, microbatch: int, chunk: int,
                          backward: tuple[int, int] | None = None) -> int | None:
        """An instruction begins: its planned clock, asked for now (or, timed, the switches due at
        its begin); None where it is not the planned instruction (the follower says why)."""
        follower = self.follower
        stream = self.gpu.timeline
        if stream is not None:  # in effect when the GPU gets there (docs/runtime.md, "GPU time")
            pos = follower.advance(kind, microbatch, chunk, backward)  # type: ignore[union-attr]  # hooks run only while following a point; no check on the hot path
            if pos < 0:
                return None
            mhz, planned_s, next_mhz = self.stream_requests[pos]
            stream.clock(mhz, planned_s, next_mhz)
            return mhz
        freq = follower.next(kind, microbatch, chunk, backward)  # type: ignore[union-attr]  # as above
        if freq is None:
            return None
        timed = self.timed
        if timed is not None:
            # Switches asked for at planned times (docs/runtime.md, "Clock-switch latency").
            index = follower.index  # type: ignore[union-attr]  # as above: a point is followed
            if timed.watches(index, False):
                for clock, at in timed.begin(index, monotonic()):
                    self._ask_at(clock, at)
        else:
            self._ask(freq)
        return freq

    def end_instruction(self) -> None:
        """An instruction ended: the timed switches due at its end, or (``switch_ahead``) the next
        instruction's clock now, so the switch latency overlaps the wait for its input instead of
        delaying it (docs/runtime.md, "Clock-switch latency"). Called only where ``watches_end``:
        never with a GPU timeline, whose requests were all handed at the begin hooks."""
        timed = self.timed
        if timed is not None:
            index = self.follower.index  # type: ignore[union-attr]  # hooks run only while following a point
            if timed.watches(index, True):
                for clock, at in timed.end(index, monotonic()):
                    self._ask_at(clock, at)
        elif self.switches.switch_ahead:
            follower = self.follower
            freq = follower.peek()  # type: ignore[union-attr]  # hooks run only while following a point
            if freq is None and not self.between_steps:  # nothing runs between steps: the next step's first
                freq = follower.first  # type: ignore[union-attr]  # as above
            if freq is not None:  # None: the step's last, default clocks next (``step_ending``)
                self._ask(freq)

    def step_ending(self) -> None:
        """The step's last instruction was handed (before the step's end and its work between
        steps): default clocks for that work, with a GPU timeline in GPU time, in effect when the
        GPU finishes the last instruction (``StreamClocks.ahead``); on the host at once, unless
        timed switches hold the plan's own requests across the gap. A GPU with no work between
        steps (``works_between_steps``) gets the next step's first clock ahead instead."""
        stream, follower = self.gpu.timeline, self.follower
        if follower is None or follower.broken:
            return
        if not self.between_steps:  # no work between steps: the next step's first clock, in GPU time
            if stream is not None:
                stream.ahead(follower.first)
            return
        if stream is not None:
            stream.ahead(BETWEEN_STEPS_MHZ)
        elif self.timed is None:
            self._ask(UNLOCKED_MHZ)  # once: not again after an unlocked last instruction

    def fall_back(self, problem: str, *, between_steps: bool = False) -> None:
        """Default clocks from now on, for ``problem``: from a hook without waiting, for the work
        launched from here on; ``between_steps`` (the GPU passed the step's end) at once, dropping
        the requests still on their way."""
        self.problem = problem
        if between_steps:
            self.gpu.reset()
        else:
            self.gpu.release()

    def diverged(self) -> None:
        """The executed instructions left the plan (the follower says where): noted, warned once."""
        assert self.follower is not None
        self.fall_back(self.follower.problem)
        if not self._warned:
            self._warned = True
            log.warning(
                "perseus: executed instructions no longer match the plan (%s); the schedule or microbatch count "
                "changed. Falling back to default clocks until replanned (restart to re-profile this configuration)",
                self.problem,
            )

    def end_step(self, natural_s: float, energy_j: float, collective: Collective, job: PipelineJob,
                 step: int) -> JobCheck | None:
        """After a deployed (or fallen back) step: every ``check_every`` of them, the periodic job
        check of the steps since the last (a collective: every rank at the same step), else None.
        On an overlapped control plane the check asked now is answered at the next check, and the
        one asked then is what this returns (None at the first)."""
        if self.timed is not None:
            self.timed.end_step()
        self.window.append((natural_s, energy_j))
        self.steps += 1
        if not self.check_every or self.steps % self.check_every:
            return None
        window, self.window = self.window, []
        asked = start_check(collective, job, window, self.problem is not None)
        if not collective.overlapped:
            return job_check(asked.result(), job, step, collective.is_root)
        previous, self._pending = self._pending, (asked, step)
        if previous is None:
            return None
        # Asked a whole check period ago: answered by now (gloo's timeout bounds it if a rank died).
        return job_check(previous[0].result(), job, previous[1], collective.is_root, answered_step=step)


def capped(pairs: Sequence[tuple[Instruction, int]], sustained: SustainedClock | None) -> list[tuple[Instruction, int]]:
    """The plan's clocks with none above the one this card sustained under the instruction's kind
    in warm-up (``SustainedClock.by_key``; a kind without one keeps its clocks): a locked clock
    there runs at that one anyway. Unlocked instructions stay unlocked."""
    by_key = sustained.by_key if sustained is not None else {}
    out: list[tuple[Instruction, int]] = []
    for inst, freq in pairs:
        load = by_key.get((inst.chunk, inst.kind))
        top = load.clock.mhz if load is not None else None
        out.append((inst, min(int(freq), top) if top is not None and freq != UNLOCKED_MHZ else int(freq)))
    return out


def works_between_steps(gpu: object) -> bool:
    """Whether the GPU runs work between steps that no instruction times (after a step's last
    instruction, before the next one's first): a real GPU's optimizer and gradient all-reduce,
    always assumed; a simulated GPU's only where its model has a step tail (the runtime runs it)."""
    sim = getattr(gpu, "sim_device", None)
    return sim is None or sim.model.step_tail_s > 0
