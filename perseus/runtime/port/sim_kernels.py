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

In the simulated GPU's asynchronous mode (``stream_depth`` ≥ 1) an instruction's kernel is
launched onto its stream at ``end`` instead, with that same max-clock work, and the hook returns
at once: the host runs ahead of the GPU as it does on a real one, and the clock the kernel runs
at is the one in force when the stream's device thread reaches it.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from perseus.gpu.sim.device import SimulatedGPU


class SimulatedKernels:
    """Busy sections of one simulated GPU, one per observed instruction.

    ``activity`` and ``compute_fraction`` (SM activity and compute-bound share α, see
    ``SimulatedGPU.begin_busy``) apply to every kernel; a client may set them before training.
    """

    def __init__(self, device: SimulatedGPU, activity: float = 1.0, compute_fraction: float = 0.8) -> None:
        self.device = device
        self.activity = activity
        self.compute_fraction = compute_fraction
        self._open = False
        self._min_s = 0.0
        self._t0 = 0.0
        self.launched = 0  # kernels launched onto the stream (asynchronous mode)
        self._stream = device.stream if device.asynchronous else None

    def begin(self) -> None:
        """An instruction starts: its kernel starts (one left open by an instruction that never
        ended, e.g. an exception in the framework, is closed first at no simulated cost)."""
        if self._open:
            self.close()
        if self._stream is not None:
            self._t0 = time.perf_counter()
        else:
            self.device.begin_busy(self.activity, self.compute_fraction)
        self._open, self._min_s = True, 0.0

    def pad(self, t_max_s: float) -> None:
        """The open instruction takes at least ``t_max_s`` at the max clock (a nominal kernel time)."""
        self._min_s = t_max_s

    def end(self) -> None:
        """The instruction ends: wait until its kernel, stretched by the clock, has finished."""
        if self._open:
            self._open = False
            stream = self._stream
            if stream is not None:  # asynchronous: onto the stream, the host goes on
                work = max(time.perf_counter() - self._t0, self._min_s)
                stream.launch(work, activity=self.activity, compute_fraction=self.compute_fraction)
                self.launched += 1
            else:
                self.device.end_busy(min_s=self._min_s)

    def close(self) -> None:
        """End an open kernel at once (no waiting); for shutdown and abandoned instructions."""
        if self._open:
            self._open = False
            if self._stream is None:
                self.device.end_busy(0.0)
