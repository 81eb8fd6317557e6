"""The schedule data: instructions and a ``Schedule``, per-stage instruction orders of one iteration.

A schedule is, per pipeline stage, the ordered list of compute instructions that stage executes
in one training iteration. Everything else (the dependency edges of ``dependencies``, the DAG,
the planner, the runtime's plan check) is derived from this data. The orders themselves come
from ``orders`` and ``torch_orders``; ``registry`` names them.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from typing import Any, Literal

InstructionKind = Literal["forward", "backward", "backward_input", "backward_weight", "forward_backward"]
# forward, full backward, zero-bubble's split backward: input gradient (I), weight gradient (W), and
# the fused unit of overlapped schedules (torch's DualPipeV OVERLAP_F_B, megatron-core's combined
# 1F1B): the forward of one microbatch and the full backward of another, executed as one unit.
KINDS: tuple[InstructionKind, ...] = ("forward", "backward", "backward_input", "backward_weight", "forward_backward")
SPLIT_BACKWARD: tuple[InstructionKind, ...] = ("backward_input", "backward_weight")
FUSED: InstructionKind = "forward_backward"
SHORT_KIND = {"forward": "F", "backward": "B", "backward_input": "I", "backward_weight": "W", "forward_backward": "FB"}


class Placement(str, Enum):
    """How a stage's chunks sit along the model: ``loop`` (chunk-major: megatron-core, torch's
    interleaved schedules) or ``v`` (two chunks; rank s holds virtual stages s and 2S-1-s: torch's
    ZBV). A ``str`` so that it compares, prints and serialises as the bare name."""

    LOOP = "loop"
    V = "v"

    def __str__(self) -> str:
        return self.value


@dataclass(frozen=True, slots=True)
class Instruction:
    """One compute instruction of one stage: a forward or backward of a microbatch on a chunk.

    A fused unit (kind ``forward_backward``) is the forward of ``microbatch`` on ``chunk`` and the
    full backward of ``backward_microbatch`` on ``backward_chunk``, clocked and timed as one
    instruction; every other kind leaves those two None. Its profile key is its forward's chunk.
    """

    kind: InstructionKind
    microbatch: int
    chunk: int = 0
    backward_microbatch: int | None = None
    backward_chunk: int | None = None

    def __post_init__(self) -> None:
        fused = self.kind == FUSED
        if fused != (self.backward_microbatch is not None) or fused != (self.backward_chunk is not None):
            raise ValueError(f"a {FUSED} instruction, and only it, names its backward's microbatch and chunk: {self!r}")

    @classmethod
    def fused(cls, forward_microbatch: int, forward_chunk: int, backward_microbatch: int,
              backward_chunk: int) -> Instruction:
        """The fused unit: forward of one microbatch overlapped with the backward of another."""
        return cls(FUSED, forward_microbatch, forward_chunk, backward_microbatch, backward_chunk)

    def parts(self) -> tuple[Instruction, ...]:
        """What the unit computes, as plain instructions: itself, or a fused unit's forward and backward."""
        if self.kind != FUSED:
            return (self,)
        assert self.backward_microbatch is not None and self.backward_chunk is not None
        return Instruction("forward", self.microbatch, self.chunk), Instruction("backward", self.backward_microbatch,
                                                                              self.backward_chunk)

    def backward_pair(self) -> tuple[int, int] | None:
        """(microbatch, chunk) of a fused unit's backward; None for other kinds (the hooks' ``backward``)."""
        return None if self.backward_microbatch is None else (self.backward_microbatch, self.backward_chunk or 0)

    def short(self) -> str:
        """Compact label such as ``F3``, ``B1.c1``, ``W2`` or ``F3+B1.c1`` (chunk shown only when nonzero)."""
        if self.kind == FUSED:
            return "+".join(part.short() for part in self.parts())
        label = f"{SHORT_KIND.get(self.kind, self.kind[:1].upper())}{self.microbatch}"
        return label if self.chunk == 0 else f"{label}.c{self.chunk}"


@dataclass(frozen=True)
class Schedule:
    """Per-stage instruction orders of one pipeline iteration.

    ``joint_receives[stage]`` lists ``(i, j)`` pairs, ``i < j``: that stage receives the inputs
    of instructions ``i`` and ``j`` in one blocking exchange before running ``i``, so ``i`` also
    waits for ``j``'s input. megatron-core's interleaved 1F1B does this (``send_forward_backward_
    recv_forward_backward`` after every forward/backward pair); a DAG without these edges shows
    slack that is not there, and a plan that uses it runs slower than planned. A schedule with
    joint receives runs megatron's blocking exchanges, whose other waits (outputs sent after the
    paired backward, early receives on the first and last stage) ``dependencies`` adds too
    (``perseus.schedules.exchanges``).
    """

    name: str
    num_stages: int
    num_microbatches: int
    num_chunks: int
    stages: tuple[tuple[Instruction, ...], ...]
    joint_receives: tuple[tuple[tuple[int, int], ...], ...] = ()
    placement: Placement = Placement.LOOP
    # megatron-core's microbatch_group_size_per_vp_stage where it is not the default (the stage
    # count): it changes the interleaved order, so it is part of the schedule's identity. None for
    # the default and for every other schedule, so default schedules compare, key and save as before.
    group_size: int | None = None
    # megatron-core's overlap_p2p_comm (Megatron-LM's default for interleaved runs): in the steady
    # state each output is sent right after its instruction and each instruction waits for its own
    # input only, not for a joint exchange (perseus.schedules.exchanges). Same order, other dependencies.
    overlap_p2p: bool = False
    # megatron-core's blocking exchanges decide the cross-stage waits (perseus.schedules.exchanges):
    # its interleaved 1F1B (with ``joint_receives``) and its combined 1F1B (fused units, none).
    megatron_exchanges: bool = False

    @property
    def num_instructions(self) -> int:
        return sum(len(stage) for stage in self.stages)

    def describe(self) -> str:
        """One line naming the schedule's shape, e.g. for an error saying two shapes differ."""
        text = f"{self.name} {self.num_stages} stages × {self.num_microbatches} microbatches"
        if self.num_chunks > 1:
            text += f" × {self.num_chunks} chunks"
        if self.group_size is not None:
            text += f", microbatch group size {self.group_size}"
        return f"{text}, overlapped p2p" if self.overlap_p2p else text

    def variant_fields(self) -> dict[str, Any]:
        """The identity fields that are not the default (``group_size``, ``overlap_p2p``), for
        cache keys and files: a default schedule keys and saves as it did before they existed."""
        fields: dict[str, Any] = {}
        if self.group_size is not None:
            fields["group_size"] = self.group_size
        if self.overlap_p2p:
            fields["overlap_p2p"] = True
        return fields

    def virtual_stage(self, stage: int, chunk: int) -> int:
        """Position of (stage, chunk) along the model (torch's stage index): chunk-major, as
        megatron-core and torch's interleaved schedules lay it out, or a V for ``Placement.V``."""
        if self.placement is Placement.V and chunk == 1:
            return 2 * self.num_stages - 1 - stage
        return chunk * self.num_stages + stage

    def locate(self, virtual: int) -> tuple[int, int]:
        """(stage, chunk) holding a virtual stage; the inverse of :meth:`virtual_stage`."""
        chunk, stage = divmod(virtual, self.num_stages)
        if self.placement is Placement.V and chunk == 1:
            stage = self.num_stages - 1 - stage
        return stage, chunk
