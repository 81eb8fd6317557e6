"""Pipeline schedules as explicit data.

A schedule is, per pipeline stage, the ordered list of compute instructions that stage executes
in one training iteration. Everything else (the instruction DAG, the planner, the runtime's plan
check) is derived from this data, so adding a schedule means writing one order generator.

Orders reproduce the frameworks exactly:

- ``1f1b``: megatron-core ``forward_backward_pipelining_without_interleaving`` and DeepSpeed
  ``TrainSchedule`` (both: ``min(S - s - 1, M)`` warm-up forwards, then forward/backward pairs,
  then cool-down backwards).
- ``interleaved``: megatron-core ``forward_backward_pipelining_with_interleaving`` (virtual
  pipeline chunks, its ``get_schedule_table`` order and warm-up count).
- ``gpipe``: all forwards, then all backwards.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Literal, Sequence

from perseus.errors import ScheduleError

InstructionKind = Literal["forward", "backward"]
KINDS: tuple[InstructionKind, ...] = ("forward", "backward")
# Bumped whenever the dependency rules change (2: interleaved joint receives; 3: none on a stage
# whose microbatches are all in warm-up), so that plans made under older rules are not reused.
DAG_MODEL_VERSION = 3


@dataclass(frozen=True, slots=True)
class Instruction:
    """One compute instruction of one stage: a forward or backward of a microbatch on a chunk."""

    kind: InstructionKind
    microbatch: int
    chunk: int = 0

    def short(self) -> str:
        """Compact label such as ``F3`` or ``B1.c1`` (chunk shown only when nonzero)."""
        label = f"{self.kind[0].upper()}{self.microbatch}"
        return label if self.chunk == 0 else f"{label}.c{self.chunk}"


@dataclass(frozen=True)
class Schedule:
    """Per-stage instruction orders of one pipeline iteration.

    ``joint_receives[stage]`` lists ``(i, j)`` pairs, ``i < j``: that stage receives the inputs
    of instructions ``i`` and ``j`` in one blocking exchange before running ``i``, so ``i`` also
    waits for ``j``'s input. megatron-core's interleaved 1F1B does this (``send_forward_backward_
    recv_forward_backward`` after every forward/backward pair); a DAG without these edges shows
    slack that is not there, and a plan that uses it runs slower than planned.
    """

    name: str
    num_stages: int
    num_microbatches: int
    num_chunks: int
    stages: tuple[tuple[Instruction, ...], ...]
    joint_receives: tuple[tuple[tuple[int, int], ...], ...] = ()

    @property
    def num_instructions(self) -> int:
        return sum(len(stage) for stage in self.stages)

    def virtual_stage(self, stage: int, chunk: int) -> int:
        """Position of (stage, chunk) along the model: chunk-major, as megatron-core lays it out."""
        return chunk * self.num_stages + stage

    def dependencies(self) -> list[tuple[tuple[int, int], tuple[int, int]]]:
        """Edges ``((stage, index), (stage, index))``: program order plus cross-stage data flow.

        Forward of a microbatch on virtual stage v feeds virtual stage v+1 and backward flows the
        other way. The last virtual stage's backward needing its own forward is implied by that
        stage's program order.
        """
        position: dict[tuple[int, Instruction], int] = {}
        for s, stage in enumerate(self.stages):
            for i, inst in enumerate(stage):
                position[(s, inst)] = i
        edges: list[tuple[tuple[int, int], tuple[int, int]]] = []
        for s, stage in enumerate(self.stages):
            for i in range(1, len(stage)):
                edges.append(((s, i - 1), (s, i)))
        num_virtual = self.num_stages * self.num_chunks
        for s, stage in enumerate(self.stages):
            for i, inst in enumerate(stage):
                v = self.virtual_stage(s, inst.chunk)
                if inst.kind == "forward" and v + 1 < num_virtual:
                    ns, nc = (v + 1) % self.num_stages, (v + 1) // self.num_stages
                    j = position[(ns, Instruction("forward", inst.microbatch, nc))]
                    edges.append(((s, i), (ns, j)))
                elif inst.kind == "backward" and v > 0:
                    ps, pc = (v - 1) % self.num_stages, (v - 1) // self.num_stages
                    j = position[(ps, Instruction("backward", inst.microbatch, pc))]
                    edges.append(((s, i), (ps, j)))
        if self.joint_receives:
            inputs: dict[tuple[int, int], list[tuple[int, int]]] = {}
            for src, dst in edges:
                if src[0] != dst[0]:
                    inputs.setdefault(dst, []).append(src)
            for s, pairs in enumerate(self.joint_receives):
                for i, j in pairs:
                    edges.extend((src, (s, i)) for src in inputs.get((s, j), ()))
        return edges


def _check_sizes(num_stages: int, num_microbatches: int, num_chunks: int) -> None:
    for name, value in (
        ("stages", num_stages),
        ("microbatches", num_microbatches),
        ("chunks", num_chunks),
    ):
        if not isinstance(value, int) or value < 1:
            raise ScheduleError(f"number of {name} must be a positive integer, got {value!r}")


def one_f_one_b_order(stage: int, num_stages: int, num_microbatches: int) -> list[Instruction]:
    """Synchronous 1F1B order of one stage (megatron-core non-interleaved, DeepSpeed TrainSchedule)."""
    warmup = min(num_stages - stage - 1, num_microbatches)
    order = [Instruction("forward", m) for m in range(warmup)]
    for i in range(num_microbatches - warmup):
        order.append(Instruction("forward", warmup + i))
        order.append(Instruction("backward", i))
    order.extend(Instruction("backward", m) for m in range(num_microbatches - warmup, num_microbatches))
    return order


def gpipe_order(stage: int, num_stages: int, num_microbatches: int) -> list[Instruction]:
    """All forwards, then all backwards in microbatch order."""
    del stage, num_stages
    return [Instruction("forward", m) for m in range(num_microbatches)] + [
        Instruction("backward", m) for m in range(num_microbatches)
    ]


def _interleaved_table(num_microbatches: int, num_chunks: int, group: int) -> list[tuple[int, int]]:
    """(microbatch, chunk) per virtual microbatch id, as megatron-core's ``get_schedule_table``."""
    table: list[tuple[int, int]] = []
    for first in range(0, num_microbatches, group):
        last = num_microbatches if first + group >= num_microbatches else first + group
        table.extend((m, c) for c in range(num_chunks) for m in range(first, last))
    return table


def interleaved_warmup(stage: int, num_stages: int, num_chunks: int, group: int) -> int:
    """megatron-core's interleaved warm-up forward count before capping at the total (``get_pp_rank_microbatches``)."""
    return (num_stages - stage - 1) * 2 + (num_chunks - 1) * group


def interleaved_order(
    stage: int,
    num_stages: int,
    num_microbatches: int,
    num_chunks: int,
    group_size: int | None = None,
) -> list[Instruction]:
    """Interleaved 1F1B order of one stage (megatron-core with virtual pipeline chunks).

    ``group_size`` is megatron-core's ``microbatch_group_size_per_vp_stage`` (default: stages).
    """
    group = num_stages if group_size is None else group_size
    if not num_stages <= group <= num_microbatches:
        raise ScheduleError(
            f"interleaved schedule needs stages ({num_stages}) <= microbatch group size ({group}) "
            f"<= microbatches ({num_microbatches}); use more microbatches or the 1f1b schedule"
        )
    remainder = num_microbatches % group
    if 0 < remainder < num_stages:
        raise ScheduleError(
            f"interleaved schedule: microbatches ({num_microbatches}) modulo group size ({group}) "
            f"must be 0 or at least the number of stages ({num_stages}), as megatron-core requires"
        )
    table = _interleaved_table(num_microbatches, num_chunks, group)
    total = num_microbatches * num_chunks
    warmup = min(interleaved_warmup(stage, num_stages, num_chunks, group), total)

    def forward(k: int) -> Instruction:
        microbatch, chunk = table[k]
        return Instruction("forward", microbatch, chunk)

    def backward(k: int) -> Instruction:
        microbatch, chunk = table[k]
        return Instruction("backward", microbatch, num_chunks - 1 - chunk)

    order = [forward(k) for k in range(warmup)]
    for k in range(total - warmup):
        order.append(forward(k + warmup))
        order.append(backward(k))
    order.extend(backward(k) for k in range(total - warmup, total))
    return order


def interleaved_joint_receives(order: Sequence[Instruction], all_warmup: bool = False) -> tuple[tuple[int, int], ...]:
    """megatron-core's interleaved exchanges (no p2p overlap): each steady forward waits for the
    input of the backward right after it too — the last warm-up forward and every steady pair
    end in one ``send_forward_backward_recv_forward_backward``.

    A stage whose microbatches are all in warm-up (``all_warmup``: megatron's
    ``are_all_microbatches_in_warmup``) has no steady pair and no joint exchange: its last
    forward only sends, then it receives gradients one by one. Its order alone cannot tell
    (one steady pair looks the same), so the caller says so.
    """
    if all_warmup:
        return ()
    warmup = next((i for i, inst in enumerate(order) if inst.kind == "backward"), len(order)) - 1
    pairs = []
    for i in range(max(warmup, 0), len(order) - 1, 2):
        if order[i].kind == "forward" and order[i + 1].kind == "backward":
            pairs.append((i, i + 1))
    return tuple(pairs)


ScheduleName = Literal["1f1b", "interleaved", "gpipe"]
SCHEDULES: tuple[str, ...] = ("1f1b", "interleaved", "gpipe")


def build_schedule(
    name: str,
    num_stages: int,
    num_microbatches: int,
    num_chunks: int = 1,
    group_size: int | None = None,
) -> Schedule:
    """Build a named schedule; raises ``ScheduleError`` for impossible configurations."""
    _check_sizes(num_stages, num_microbatches, num_chunks)
    make: Callable[[int], Sequence[Instruction]]
    if name == "1f1b" or name == "gpipe":
        if num_chunks != 1:
            raise ScheduleError(f"schedule {name!r} has no virtual chunks; use --chunks 1 or 'interleaved'")
        order_fn = one_f_one_b_order if name == "1f1b" else gpipe_order
        make = lambda s: order_fn(s, num_stages, num_microbatches)  # noqa: E731
    elif name == "interleaved":
        if num_chunks < 2:
            raise ScheduleError("interleaved schedule needs at least 2 chunks (--chunks)")
        make = lambda s: interleaved_order(s, num_stages, num_microbatches, num_chunks, group_size)  # noqa: E731
    else:
        raise ScheduleError(f"unknown schedule {name!r}; choose one of {', '.join(SCHEDULES)}")
    stages = tuple(tuple(make(s)) for s in range(num_stages))
    joint: tuple[tuple[tuple[int, int], ...], ...] = ()
    if name == "interleaved":
        group = num_stages if group_size is None else group_size
        joint = tuple(
            interleaved_joint_receives(
                order, interleaved_warmup(s, num_stages, num_chunks, group) >= num_microbatches * num_chunks
            )
            for s, order in enumerate(stages)
        )
    return Schedule(name, num_stages, num_microbatches, num_chunks, stages, joint)
