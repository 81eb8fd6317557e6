"""``SimulatedKernels``: on a simulated GPU, every instruction the hooks observe is one of its kernels.

Why: a real GPU slows an instruction down when its clock is lowered whatever the framework does;
a simulated one only stretches work run as a busy section (``SimulatedGPU.begin_busy`` /
``end_busy``). The runtime therefore makes each instruction a busy section itself, from
``on_instruction_begin`` to ``on_instruction_end``, in every phase: the CPU time in between is
the instruction's time at the max clock, and ``end`` waits out the rest of its duration at the
clock in force. So a real client (Megatron-LM's ``pretrain_gpt.py``, a DeepSpeed engine) gets
a meaningful profile, plan and saving on ``gpu: "sim"`` without doing anything.

A client that knows its instructions' max-clock time better than the CPU does (a demo with a
nominal kernel time, so CPU noise on a shared machine does not drown the clock's effect) calls
``pad(t_max_s)`` before the instruction ends: its max-clock time is then at least that. On a
real GPU the runtime has no ``SimulatedKernels`` at all (``PerseusRuntime.sim_kernels`` is None).

In the simulated GPU's asynchronous mode (``stream_depth`` ≥ 1) ``begin`` opens the instruction's
kernel on its stream (``SimStream.open_kernel``) and ``end`` closes it with that same max-clock
work and returns at once: the host runs ahead of the GPU as it does on a real one, the clock the
kernel runs at is the one in force when the stream's device thread reaches it, and where the GPU
was idle the kernel starts at the instruction's begin, as a real GPU starts on an instruction's
first kernel while the host still launches the rest (the synchronous mode's timing).

An instruction whose output another stage waits for (a forward's activation, a backward's input
gradient: ``sends``) is different. On a real GPU the framework's send is ordered after the
producing kernel on the stream, so the receiver cannot start before the kernel ended. A simulated
kernel's output is the host's tensor, ready before the kernel ran, and the framework sends it from
the host at once; so ``end`` waits for such an instruction's kernel (the stream's event), and
the pipeline's dependencies stay real. Only stage-local instructions let the host run ahead.

A real step does GPU work after its last instruction: the optimizer and the gradient all-reduce
(31.6 ms of it on a measured H200). A model with a step tail (``DVFSModel.step_tail_s``, the
"H200-hostile" preset) runs it as one kernel at ``step_end``, which the runtime calls at every
step's end (``PerseusRuntime.on_step_end``, before it times the step), so every client on such a
preset shows it, not only the demos; nothing without one.

On the replay preset (``DVFSModel.replays``) the measured runs decide each forward's and
backward's time: ``end`` draws one measured instance of the stage's instruction at the clock set
(``perseus.measured.replay``) and makes it the kernel's work, at least; other kinds keep theirs.
"""

from __future__ import annotations

import time
from collections.abc import Collection
from typing import TYPE_CHECKING, Callable

import numpy as np

from perseus.schedules.dag import InstructionDAG

if TYPE_CHECKING:
    from perseus.gpu.sim.device import SimulatedGPU
    from perseus.measured.replay import ReplaySource
    from perseus.gpu.sim.stream import OpenKernel
    from perseus.schedules import InstructionKind, Schedule

SendKey = tuple[str, int]  # (instruction kind, chunk) as the hooks report it
STEP_TAIL_TAG = "step-tail"  # the stream tag of a step's tail kernel (not an instruction's)


def sending_instructions(schedule: Schedule, stage: int) -> frozenset[SendKey]:
    """``(kind, chunk)`` of ``stage``'s instructions another stage waits for (the DAG's cross-stage edges)."""
    dag = InstructionDAG.from_schedule(schedule)
    stages = dag.node_stage.tolist()
    return frozenset((dag.instructions[u].kind, dag.instructions[u].chunk)
                     for u, v in zip(dag.edge_src.tolist(), dag.edge_dst.tolist())
                     if stages[u] == stage and stages[v] != stage)


class SimulatedKernels:
    """Busy sections of one simulated GPU, one per observed instruction.

    ``activity`` and ``compute_fraction`` (SM activity and compute-bound share α, see
    ``SimulatedGPU.begin_busy``) apply to every kernel; a client may set them before training.
    ``sends``: ``(kind, chunk)`` of the instructions whose kernel ``end`` waits for on the stream
    (``sending_instructions``); nothing waits on a synchronous GPU, whose kernel ends in ``end``.
    """

    def __init__(self, device: SimulatedGPU, activity: float = 1.0, compute_fraction: float = 0.8, *,
                 sends: Collection[SendKey] = ()) -> None:
        self.device = device
        self.sends = frozenset(sends)
        self.waits = 0  # kernels the host waited for before a send (asynchronous mode)
        self.activity = activity
        self.compute_fraction = compute_fraction
        self._open = False
        self._min_s = 0.0
        self._t0 = 0.0
        self._kernel: OpenKernel | None = None  # asynchronous mode: the open instruction's kernel
        self.launched = 0  # kernels put on the stream, step tails included (asynchronous mode)
        self._stream = device.stream if device.asynchronous else None
        m = device.model  # the replay preset: measured runs decide each forward's and backward's time
        self._replay: ReplaySource | None = None
        if m.replays:
            from perseus.measured.replay import load_replay  # numpy, scipy: only where a GPU replays

            self._replay = load_replay(m.replay_dir, m.replay_time_scale)
        self._rng = np.random.default_rng([device.seed, device.index])

    def begin(self) -> None:
        """An instruction starts: its kernel starts (one left open by an instruction that never
        ended, e.g. an exception in the framework, is closed first at no simulated cost)."""
        if self._open:
            self.close()
        if self._stream is not None:
            self._kernel = self._stream.open_kernel(activity=self.activity, compute_fraction=self.compute_fraction)
            self._t0 = time.perf_counter()
            self.launched += 1
        else:
            self.device.begin_busy(self.activity, self.compute_fraction)
        self._open, self._min_s = True, 0.0

    def pad(self, t_max_s: float) -> None:
        """The open instruction takes at least ``t_max_s`` at the max clock (a nominal kernel time)."""
        self._min_s = t_max_s

    def end(self, kind: InstructionKind | None = None, chunk: int = 0) -> None:
        """The instruction ends: wait until its kernel, stretched by the clock, has finished
        (asynchronous: launch it, and wait for it only if another stage needs its output)."""
        if self._open:
            self._open = False
            if self._replay is not None and kind in ("forward", "backward"):
                self._min_s = max(self._min_s, self._replayed_work_s(kind))
            stream = self._stream
            if stream is not None and self._kernel is not None:  # asynchronous: close it, the host goes on
                self._kernel.close(max(time.perf_counter() - self._t0, self._min_s))
                self._kernel = None
                if (kind, chunk) in self.sends:  # the framework sends the output next: as if after the kernel
                    stream.synchronize()
                    self.waits += 1
            else:
                self.device.end_busy(min_s=self._min_s)

    def _replayed_work_s(self, kind: str) -> float:
        """One measured instance of this stage's ``kind`` at the clock set now, as max-clock work: the
        GPU's slowdown at that clock stretches it back (a clock that lands mid-kernel changes the rest)."""
        m = self.device.model
        clock = self.device.locked_sm_clock_mhz() or m.sm_max_mhz
        assert self._replay is not None
        return self._replay.draw_s(m.replay_stage, kind, clock, self._rng) / m.slowdown(clock, self.compute_fraction)

    def step_end(self, before: Callable[[], None] | None = None) -> None:
        """After a step's last instruction: the model's optimizer + all-reduce tail as one kernel
        (launched on the stream, or run here on a synchronous GPU); nothing if it has none.
        ``before`` runs first where there is a tail (the host step clock's mark, so the synchronous
        tail's energy is its own: ``HostSteps.mark_tail``)."""
        m = self.device.model
        if m.step_tail_s <= 0:
            return
        if self._open:
            self.close()
        if before is not None:
            before()
        if self._stream is not None:
            self._stream.launch(m.step_tail_s, activity=m.step_tail_activity,
                                compute_fraction=m.step_tail_compute_fraction, tag=STEP_TAIL_TAG)
            self.launched += 1
        else:
            self.device.begin_busy(m.step_tail_activity, m.step_tail_compute_fraction)
            self.device.end_busy(m.step_tail_s)

    def close(self) -> None:
        """End an open kernel at once (no waiting); for shutdown and abandoned instructions."""
        if self._open:
            self._open = False
            if self._kernel is not None:
                self._kernel.close(0.0)
                self._kernel = None
            if self._stream is None:
                self.device.end_busy(0.0)
