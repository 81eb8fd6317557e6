"""Driving a single-process runtime through its hooks, as a client whose instructions are plain
CPU work (on a simulated GPU the runtime makes each one a kernel, stretched by the clock)."""

from __future__ import annotations

import time


def train(runtime, steps: int, t: float = 0.001) -> None:
    """``steps`` iterations of the runtime's own stage order; a backward sleeps twice a forward's ``t``."""
    for _ in range(steps):
        runtime.on_step_begin()
        for inst in runtime.schedule.stages[0]:
            runtime.on_instruction_begin(inst.kind, inst.microbatch, inst.chunk)
            time.sleep(t * (2 if inst.kind == "backward" else 1))
            runtime.on_instruction_end(inst.kind, inst.microbatch, inst.chunk)
        runtime.on_step_end()
