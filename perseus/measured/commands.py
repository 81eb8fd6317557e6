"""Merak's 1F1B command stream: which command of a measured run is which instruction.

A measured run's ``power_states`` hold one SM clock per command that a stage executes, not one per
forward or backward: per step a point-to-point exchange (Merak merges a send and a receive that fall
in the same step into one command), ``LoadMicroBatch`` on the first and last stage before a forward,
the forward or backward itself, and after the last step ``ReduceTiedGrads``, ``ReduceGrads`` and
``OptimizerStep``. This module rebuilds that stream (Merak's ``MergeP2PTrainSchedule``, itself
DeepSpeed's ``TrainSchedule`` with merged exchanges) so a clock can be read back as the clock of
one forward or backward. Its length matching each rank's ``power_states`` is what checks the order.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, Sequence

import numpy as np

CommandKind = Literal["exchange", "load", "forward", "backward", "step"]

_KIND_OF: dict[str, CommandKind] = {
    "SendActivation": "exchange", "RecvActivation": "exchange", "SendGrad": "exchange", "RecvGrad": "exchange",
    "SendGradRecvActivation": "exchange", "SendActivationRecvGrad": "exchange",
    "LoadMicroBatch": "load", "ForwardPass": "forward", "BackwardPass": "backward",
    "ReduceTiedGrads": "step", "ReduceGrads": "step", "OptimizerStep": "step",
}


@dataclass(frozen=True, slots=True)
class Command:
    """One command of a stage's stream: Merak's instruction name and the microbatch it serves
    (None for the end-of-batch commands; for a merged exchange, the microbatch it receives for,
    or sends for when it only sends)."""

    name: str
    microbatch: int | None = None

    @property
    def kind(self) -> CommandKind:
        return _KIND_OF[self.name]


def _step_microbatch(step: int, stage: int, stages: int) -> tuple[int, bool]:
    """(microbatch, is_forward) of a step: even stages run forwards on even steps, odd on odd."""
    if step % 2 == stage % 2:
        return (step - stage % 2) // 2 - stage // 2, True
    if stage % 2 == 1:  # even step on an odd stage: a backward
        return step // 2 - stages + (stage + 1) // 2, False
    return (step - 1) // 2 - stages + 1 + stage // 2, False


def command_stream(stages: int, microbatches: int, stage: int) -> tuple[Command, ...]:
    """Every command stage ``stage`` executes in one iteration, in order."""
    if not 0 <= stage < stages or microbatches < 1:
        raise ValueError(f"no stage {stage} in a pipeline of {stages} stages × {microbatches} microbatches")

    def valid(m: int) -> bool:
        return 0 <= m < microbatches

    out: list[Command] = []
    previous = -1
    total = 2 * (microbatches + stages - 1)
    for step in range(total):
        mb, forward = _step_microbatch(step, stage, stages)
        if forward and stage > 0:  # exchange with the previous stage: send a gradient, receive an activation
            if valid(mb):
                out.append(Command("SendGradRecvActivation" if valid(previous) else "RecvActivation", mb))
            elif valid(previous):
                out.append(Command("SendGrad", previous))
        elif not forward and stage < stages - 1:  # with the next stage: send an activation, receive a gradient
            if valid(previous):
                out.append(Command("SendActivationRecvGrad" if valid(mb) else "SendActivation", mb if valid(mb) else previous))
            elif valid(mb):
                out.append(Command("RecvGrad", mb))
        if forward and valid(mb) and stage in (0, stages - 1):
            out.append(Command("LoadMicroBatch", mb))
        if valid(mb):
            out.append(Command("ForwardPass" if forward else "BackwardPass", mb))
        if step == total - 1:
            out.extend((Command("ReduceTiedGrads"), Command("ReduceGrads"), Command("OptimizerStep")))
        previous = mb
    return tuple(out)


def instruction_clocks(power_states: Sequence[int], stages: int, microbatches: int,
                       stage: int) -> tuple[np.ndarray, np.ndarray]:
    """(forward clocks, backward clocks) by microbatch, read from one command-stream clock list.

    Raises ``ValueError`` when the list's length is not the stream's: then the run was not Merak's
    1F1B of this shape, and no clock can be attributed.
    """
    stream = command_stream(stages, microbatches, stage)
    if len(power_states) != len(stream):
        raise ValueError(
            f"{len(power_states)} clocks, but Merak's 1F1B stream of stage {stage} "
            f"({stages} stages × {microbatches} microbatches) has {len(stream)} commands"
        )
    forward = np.zeros(microbatches, dtype=np.int64)
    backward = np.zeros(microbatches, dtype=np.int64)
    for clock, command in zip(power_states, stream):
        if command.kind == "forward":
            forward[command.microbatch] = clock
        elif command.kind == "backward":
            backward[command.microbatch] = clock
    return forward, backward
