"""``ClockTrace``: optional per-instruction events that say whether each planned clock was in time.

Why: a deployed plan can run slower than its frontier point for several reasons that look the same
in an iteration time: a clock switch that landed after its instruction started, the runtime's own
hook time, the simulated GPU waking up late from its stretch sleep, the controller process taking
CPU from the trainers. With ``trace_clocks: true`` the runtime records, per instruction, the times
it needs to tell them apart (CLOCK_MONOTONIC seconds, the simulated GPU's time base):

- when the clock it runs at was requested (``requested_at``), and the plan's clock;
- when the hooks began and ended and how long the runtime spent in them (``hook_s``, without the
  wait for the kernel);
- on a simulated GPU, its kernel (``KernelRecord``): start, duration, max-clock work, the clocks set
  at its start and end and when the latter took effect; and when the wait for it returned.

and, per step, the controller process's CPU time; and every clock change the host made at a step
boundary and watched land (``SwitchSample``: requested, last seen at the old clock, first seen at
the new one), read off the device's reported clock: the switch latency on any backend that
reports its applied clock (NVML too), where the kernel records are the simulator's only. Off by
default: the hot path then pays one ``is None`` test. ``breakdown`` (pure) turns a trace into the
numbers docs/runtime.md tabulates; ``benchmarks/bench_switch_latency.py`` aggregates them over
ranks and runs.
"""

from __future__ import annotations

import os
from collections import deque
from dataclasses import asdict, dataclass
from statistics import median
from time import monotonic
from typing import TYPE_CHECKING, Any, Callable, Iterable, Mapping

from perseus.profile.unlocked import UNLOCKED_MHZ

if TYPE_CHECKING:
    from perseus.gpu.sim.device import SimulatedGPU

MAX_INSTRUCTIONS = 100_000  # a long run keeps the latest ones (about 10 MB)


@dataclass(frozen=True)
class InstructionTrace:
    """One instruction as the runtime saw it (times: CLOCK_MONOTONIC seconds)."""

    step: int
    index: int  # position in the step
    kind: str
    microbatch: int
    chunk: int
    planned_mhz: int | None  # the plan's clock; None when no plan was followed (baseline)
    requested_mhz: int | None  # the last clock requested before the instruction began
    requested_at: float | None  # ... and when (None: nothing requested yet)
    begin: float  # the begin hook was entered
    end: float  # the end hook returned
    hook_s: float  # time in the runtime's hooks, without the wait for the kernel
    wait_returned: float | None = None  # the wait for the simulated kernel returned
    kernel_start: float | None = None  # simulated GPU only: its KernelRecord
    kernel_s: float | None = None
    work_s: float | None = None
    start_mhz: int | None = None
    end_mhz: int | None = None
    clock_applied_at: float | None = None
    model_s: float | None = None  # the kernel's work held at the planned clock (the planner's model)


@dataclass(frozen=True)
class SwitchSample:
    """A clock change the host asked for and watched land (``GPUPort.apply``; CLOCK_MONOTONIC s):
    asked for at ``requested_s``; the device last reported another clock at ``before_s`` (the
    request itself when its first read already saw the new one) and first reported ``to_mhz`` at
    ``seen_s``."""

    from_mhz: int
    to_mhz: int
    requested_s: float
    before_s: float
    seen_s: float

    @property
    def latency_s(self) -> float:
        """Request to applied: the change happened between the two reads, so their midpoint
        (half the polling granularity off the first read that saw it)."""
        return max(0.0, 0.5 * (self.before_s + self.seen_s) - self.requested_s)


@dataclass(frozen=True)
class StepTrace:
    step: int
    phase: str
    begin: float
    end: float
    controller_cpu_s: float | None  # CPU time of the clock controller process during the step
    trainer_cpu_s: float  # CPU time of this (trainer) process during the step


def process_cpu_s(pid: int | None) -> float | None:
    """User + system CPU seconds of process ``pid`` (Linux /proc; None where unreadable)."""
    if pid is None:
        return None
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            fields = f.read().rsplit(b")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError, ValueError):
        return None


class ClockTrace:
    """Collects ``InstructionTrace`` and ``StepTrace`` records; the engine calls it from its hooks."""

    def __init__(self, device: SimulatedGPU | None = None, controller_pid: int | None = None) -> None:
        self.device = device
        self.controller_pid = controller_pid
        self.instructions: deque[InstructionTrace] = deque(maxlen=MAX_INSTRUCTIONS)
        self.steps: deque[StepTrace] = deque(maxlen=MAX_INSTRUCTIONS)
        self.switches: deque[SwitchSample] = deque(maxlen=MAX_INSTRUCTIONS)
        self._step = -1
        self._phase = ""
        self._index = 0
        self._step_t0 = 0.0
        self._ctrl0: float | None = None
        self._cpu0 = 0.0
        self._req_mhz: int | None = None
        self._req_at: float | None = None
        self._open: tuple[Any, ...] | None = None
        self._kernel: dict[str, Any] = {}

    def step_begin(self, phase: str) -> None:
        """A step begins (numbered from 0 at the first traced one, like the demo's iterations)."""
        self._step, self._phase, self._index = self._step + 1, phase, 0
        self._ctrl0 = process_cpu_s(self.controller_pid)
        self._cpu0 = os.times().user + os.times().system
        self._step_t0 = monotonic()

    def step_end(self) -> None:
        t = monotonic()
        ctrl1 = process_cpu_s(self.controller_pid)
        times = os.times()
        ctrl = ctrl1 - self._ctrl0 if ctrl1 is not None and self._ctrl0 is not None else None
        self.steps.append(StepTrace(self._step, self._phase, self._step_t0, t, ctrl,
                                    times.user + times.system - self._cpu0))

    def requested(self, mhz: int, at: float) -> None:
        self._req_mhz, self._req_at = mhz, at

    def switched(self, sample: SwitchSample) -> None:
        """A step boundary's clock change, watched until the device reported it."""
        self.switches.append(sample)

    def begin(self, kind: str, microbatch: int, chunk: int, planned_mhz: int | None, t0: float, t1: float) -> None:
        """The begin hook ran from ``t0`` to ``t1`` (just before the kernel starts)."""
        self._open = (kind, microbatch, chunk, planned_mhz, self._req_mhz, self._req_at, t0, t1 - t0)

    def kernel_ended(self, t_waited: float) -> None:
        """The wait for the simulated kernel returned at ``t_waited`` (before any request of the
        end hook, so the kernel's record is its own)."""
        if self._open is None or self.device is None:
            return
        planned = self._open[3]
        k = self.device.last_kernel()
        self._kernel = {"wait_returned": t_waited, "kernel_start": k.start, "kernel_s": k.duration_s,
                        "work_s": k.work_s, "start_mhz": k.start_mhz, "end_mhz": k.end_mhz,
                        "clock_applied_at": k.clock_applied_at,
                        # unplanned or unlocked (the card's own clock): the model at the clock it ran at
                        "model_s": self.device.kernel_time_s(k.work_s, k.end_mhz if planned in (None, UNLOCKED_MHZ)
                                                             else planned)}

    def end(self, t0: float, t1: float) -> None:
        """The end hook ran from ``t0`` to ``t1``."""
        if self._open is None:
            return
        kind, mb, chunk, planned, req_mhz, req_at, begin, hook_begin = self._open
        self._open = None
        kernel, self._kernel = self._kernel, {}
        waited = kernel["wait_returned"] - t0 if kernel else 0.0
        hook_s = hook_begin + (t1 - t0) - waited
        self.instructions.append(InstructionTrace(self._step, self._index, kind, mb, chunk, planned, req_mhz, req_at,
                                                  begin, t1, hook_s, **kernel))
        self._index += 1

    def to_dict(self) -> dict[str, list[dict[str, Any]]]:
        return {"instructions": [asdict(i) for i in self.instructions], "steps": [asdict(s) for s in self.steps],
                "switches": [asdict(s) for s in self.switches]}


# ---------------------------------------------------------------- aggregation (pure)


@dataclass(frozen=True)
class Breakdown:
    """Per step of one rank (medians over its steps): where its instructions' time went.

    ``late_*``: instructions that started below their planned clock (a switch up not landed yet:
    they cost time). ``faster_share``: those that started above it (a switch down not landed yet,
    or raised early for the next instruction: they cost energy only).
    ``stretch_s``: kernel time beyond the planned clock's (late switches and CPU work beyond the
    nominal time both show here). ``overshoot_s``: the wait for the kernel returned after it ended.
    """

    steps: int
    instructions: int
    late_share: float
    faster_share: float
    late_median_s: float  # how long after the kernel's start the planned clock took effect
    late_max_s: float
    stretch_s: float
    overshoot_s: float
    hook_s: float
    controller_cpu_s: float | None
    trainer_cpu_s: float
    step_s: float


def from_dict(data: Mapping[str, Iterable[Mapping[str, Any]]]) -> tuple[list[InstructionTrace], list[StepTrace]]:
    """A trace saved with ``ClockTrace.to_dict`` (e.g. in a JSON result)."""
    return ([InstructionTrace(**i) for i in data["instructions"]], [StepTrace(**s) for s in data["steps"]])


def switches_from_dict(data: Mapping[str, Iterable[Mapping[str, Any]]]) -> list[SwitchSample]:
    """The watched clock changes of a saved trace (none in a trace saved before they were kept)."""
    return [SwitchSample(**s) for s in data.get("switches", ())]


def lateness_s(inst: InstructionTrace) -> float:
    """How long after its kernel started at a lower clock than planned the planned clock took
    effect (0 when the kernel started at or above it).

    Needs a simulated GPU's record (elsewhere the trace's ``switches`` give the latency itself, not
    where it landed in a kernel); a clock that was never in force during the kernel counts the
    whole kernel."""
    if (inst.planned_mhz is None or inst.kernel_start is None or inst.start_mhz is None
            or inst.start_mhz >= inst.planned_mhz):
        return 0.0
    assert inst.kernel_s is not None and inst.clock_applied_at is not None
    if inst.end_mhz != inst.planned_mhz:
        return inst.kernel_s
    return min(max(inst.clock_applied_at - inst.kernel_start, 0.0), inst.kernel_s)


def kernel_on_model(inst: InstructionTrace, cost: Callable[[int], tuple[float, float]]) -> tuple[float, float]:
    """(time, energy) of a traced simulated kernel on the GPU model, at its clocks as they were:
    ``cost(mhz)`` gives the instruction's (time, energy) held at a clock (its nominal work, e.g. the
    simulated GPU's true profile), the kernel ran at ``start_mhz`` until ``clock_applied_at`` (a
    switch landing inside it) and at ``end_mhz`` after, progressing at ``1 / time`` of its work per
    second. Independent of how busy the host was, except for where the switch landed in the kernel."""
    if inst.start_mhz is None or inst.end_mhz is None or inst.kernel_start is None:
        raise ValueError("kernel_on_model needs a simulated GPU's kernel record (trace_clocks on a simulated GPU)")
    t1, e1 = cost(inst.end_mhz)
    if inst.start_mhz == inst.end_mhz or inst.clock_applied_at is None or inst.clock_applied_at <= inst.kernel_start:
        return t1, e1
    t0, e0 = cost(inst.start_mhz)
    head = min(inst.clock_applied_at - inst.kernel_start, t0)
    done = head / t0
    return head + (1 - done) * t1, done * e0 + (1 - done) * e1


def breakdown(instructions: Iterable[InstructionTrace], steps: Iterable[StepTrace],
              phase: Callable[[str], bool] = lambda p: True) -> Breakdown:
    """Medians over the steps whose phase ``phase`` accepts."""
    chosen = {s.step: s for s in steps if phase(s.phase)}
    per_step: dict[int, list[InstructionTrace]] = {}
    for inst in instructions:
        if inst.step in chosen:
            per_step.setdefault(inst.step, []).append(inst)
    if not per_step:
        return Breakdown(0, 0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, None, 0.0, 0.0)
    all_inst = [i for rows in per_step.values() for i in rows]
    traced = [i for i in all_inst if i.planned_mhz is not None and i.start_mhz is not None]
    late = [lateness_s(i) for i in traced]
    late_pos = [x for x in late if x > 0]
    faster = sum(1 for i in all_inst if i.planned_mhz is not None and i.start_mhz is not None
                 and i.planned_mhz != UNLOCKED_MHZ  # default clocks: no card runs above them
                 and i.start_mhz > i.planned_mhz)  # the traced ones (clocks narrowed to int)

    def per(fn: Callable[[InstructionTrace], float]) -> float:
        return median(sum(fn(i) for i in rows) for rows in per_step.values())

    ctrl = [s.controller_cpu_s for n, s in chosen.items() if n in per_step and s.controller_cpu_s is not None]
    return Breakdown(
        steps=len(per_step), instructions=len(all_inst),
        late_share=len(late_pos) / len(late) if late else 0.0,
        faster_share=faster / len(traced) if traced else 0.0,
        late_median_s=median(late_pos) if late_pos else 0.0, late_max_s=max(late_pos, default=0.0),
        stretch_s=per(lambda i: (i.kernel_s or 0.0) - (i.model_s if i.model_s is not None else (i.kernel_s or 0.0))),
        overshoot_s=per(lambda i: max((i.wait_returned or 0.0) - ((i.kernel_start or 0.0) + (i.kernel_s or 0.0)), 0.0)
                        if i.kernel_start is not None else 0.0),
        hook_s=per(lambda i: i.hook_s),
        # CPU times: means (the kernel counts them in 10 ms ticks, a median would be 0 or 10 ms)
        controller_cpu_s=sum(ctrl) / len(ctrl) if ctrl else None,
        trainer_cpu_s=sum(chosen[n].trainer_cpu_s for n in per_step) / len(per_step),
        step_s=median(chosen[n].end - chosen[n].begin for n in per_step),
    )
