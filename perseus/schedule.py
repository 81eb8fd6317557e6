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

torch.distributed.pipelining (torch 2.13, TorchTitan) executes the ``1f1b`` and ``gpipe`` orders above
for ``Schedule1F1B`` and ``ScheduleGPipe``, and:

- ``torch-interleaved``: ``ScheduleInterleaved1F1B`` (rounds of ``M // (M // S)`` microbatches;
  no joint receives: every receive waits for its own input only).
- ``zb-interleaved``: ``ScheduleInterleavedZeroBubble`` (ZB1P): backwards split into
  ``backward_input`` (I, the input gradient sent upstream) and ``backward_weight`` (W, local).
- ``zbv``: ``ScheduleZBVZeroBubble``: two chunks per rank in a V (rank r holds torch stages r and
  2S-1-r); the hop from torch stage S-1 to S (both on rank S-1) is local, no P2P.

The torch orders are ports of torch's own ``pipeline_order`` generators (compute actions, idle
slots dropped); ``tests/torch`` checks them against torch's schedule objects.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Literal, Sequence

from perseus.errors import ScheduleError
from perseus.exchanges import megatron_interleaved_waits

InstructionKind = Literal["forward", "backward", "backward_input", "backward_weight"]
# forward, full backward, and zero-bubble's split backward: input gradient (I), weight gradient (W).
KINDS: tuple[InstructionKind, ...] = ("forward", "backward", "backward_input", "backward_weight")
SPLIT_BACKWARD: tuple[InstructionKind, ...] = ("backward_input", "backward_weight")
SHORT_KIND = {"forward": "F", "backward": "B", "backward_input": "I", "backward_weight": "W"}
# Kinds whose output (an activation gradient) flows to the previous virtual stage.
_GRAD_SENDING = ("backward", "backward_input")
# Bumped whenever the dependency rules change (2: interleaved joint receives; 3: none on a stage
# whose microbatches are all in warm-up; 4: zero-bubble kinds and placements; 5: megatron-core's
# interleaved exchanges in full, perseus/exchanges.py), so that plans made under older rules are
# not reused from a cache.
DAG_MODEL_VERSION = 5


@dataclass(frozen=True, slots=True)
class Instruction:
    """One compute instruction of one stage: a forward or backward of a microbatch on a chunk."""

    kind: InstructionKind
    microbatch: int
    chunk: int = 0

    def short(self) -> str:
        """Compact label such as ``F3``, ``B1.c1`` or ``W2`` (chunk shown only when nonzero)."""
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
    (``perseus.exchanges``).
    """

    name: str
    num_stages: int
    num_microbatches: int
    num_chunks: int
    stages: tuple[tuple[Instruction, ...], ...]
    joint_receives: tuple[tuple[tuple[int, int], ...], ...] = ()
    # How chunks sit along the model: "loop" (chunk-major: megatron-core, torch interleaved) or
    # "v" (two chunks; rank s holds virtual stages s and 2S-1-s: torch's ZBV).
    placement: str = "loop"
    # megatron-core's microbatch_group_size_per_vp_stage where it is not the default (the stage
    # count): it changes the interleaved order, so it is part of the schedule's identity. None for
    # the default and for every other schedule, so default schedules compare, key and save as before.
    group_size: int | None = None
    # megatron-core's overlap_p2p_comm (Megatron-LM's default for interleaved runs): in the steady
    # state each output is sent right after its instruction and each instruction waits for its own
    # input only, not for a joint exchange (perseus.exchanges). Same order, other dependencies.
    overlap_p2p: bool = False

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
        megatron-core and torch's interleaved schedules lay it out, or a V for ``placement="v"``."""
        if self.placement == "v" and chunk == 1:
            return 2 * self.num_stages - 1 - stage
        return chunk * self.num_stages + stage

    def locate(self, virtual: int) -> tuple[int, int]:
        """(stage, chunk) holding a virtual stage; the inverse of :meth:`virtual_stage`."""
        chunk, stage = divmod(virtual, self.num_stages)
        if self.placement == "v" and chunk == 1:
            stage = self.num_stages - 1 - stage
        return stage, chunk

    def dependencies(self) -> list[tuple[tuple[int, int], tuple[int, int]]]:
        """Edges ``((stage, index), (stage, index))``: program order plus cross-stage data flow.

        Forward of a microbatch on virtual stage v feeds virtual stage v+1 and backward (or the
        input-gradient part I of a split backward) flows the other way. A weight-gradient part W
        needs its own I. The last virtual stage's backward needing its own forward is implied by
        that stage's program order. An edge between two virtual stages on one rank (ZBV's turn)
        is an ordinary edge within that stage. With joint receives (megatron-core's interleaved
        exchanges) the cross-stage edges are the exchanges' waits instead, which imply the data
        flow (``perseus.exchanges.megatron_interleaved_waits``).
        """
        position: dict[tuple[int, Instruction], int] = {}
        for s, stage in enumerate(self.stages):
            for i, inst in enumerate(stage):
                position[(s, inst)] = i
        edges: list[tuple[tuple[int, int], tuple[int, int]]] = []
        for s, stage in enumerate(self.stages):
            for i in range(1, len(stage)):
                edges.append(((s, i - 1), (s, i)))
        if self.joint_receives and self.num_stages > 1:
            # megatron-core's blocking exchanges: they imply the data flow and add the waits it misses
            return edges + megatron_interleaved_waits(self)
        num_virtual = self.num_stages * self.num_chunks

        def gradient_step(stage: int, microbatch: int, chunk: int) -> int:
            found = position.get((stage, Instruction("backward", microbatch, chunk)))
            return position[(stage, Instruction("backward_input", microbatch, chunk))] if found is None else found

        for s, stage in enumerate(self.stages):
            for i, inst in enumerate(stage):
                v = self.virtual_stage(s, inst.chunk)
                if inst.kind == "forward" and v + 1 < num_virtual:
                    ns, nc = self.locate(v + 1)
                    j = position[(ns, Instruction("forward", inst.microbatch, nc))]
                    edges.append(((s, i), (ns, j)))
                elif inst.kind in _GRAD_SENDING and v > 0:
                    ps, pc = self.locate(v - 1)
                    edges.append(((s, i), (ps, gradient_step(ps, inst.microbatch, pc))))
                elif inst.kind == "backward_weight":
                    j = position[(s, Instruction("backward_input", inst.microbatch, inst.chunk))]
                    edges.append(((s, j), (s, i)))
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


# ---------------------------------------------------------------- torch.distributed.pipelining
#
# Ports of torch 2.13's ``pipeline_order`` generators (``_get_1f1b_rank_ops``, ``_get_warmup_ops``,
# ``ScheduleZBVZeroBubble._calculate_single_rank_operations``) reduced to the compute order of one
# rank: torch pads ranks with idle slots (None) to line the ranks up in time, which the DAG
# derives from the dependencies instead. Actions are (torch stage index, kind, microbatch).

_Action = tuple[int, InstructionKind, int]


def _torch_rounds(num_stages: int, num_microbatches: int, what: str) -> int:
    """Microbatches per round of torch's interleaved schedules (``M // max(1, M // S)``)."""
    rounds = max(1, num_microbatches // num_stages)
    if num_microbatches % rounds:
        raise ScheduleError(
            f"{what}: microbatches ({num_microbatches}) must be a multiple of the number of rounds "
            f"({rounds} = microbatches // stages), as torch.distributed.pipelining requires"
        )
    return num_microbatches // rounds


def _torch_rank_ops(rank: int, num_stages: int, num_microbatches: int, num_chunks: int,
                    zero_bubble: bool) -> list[_Action]:
    """``_get_1f1b_rank_ops`` of ``ScheduleInterleaved1F1B`` / ``ScheduleInterleavedZeroBubble``."""
    per_round = _torch_rounds(num_stages, num_microbatches,
                              "zb-interleaved" if zero_bubble else "torch-interleaved")
    factor = 1 if zero_bubble else 2
    warmup = min((num_chunks - 1) * per_round + factor * (num_stages - 1 - rank), num_microbatches * num_chunks)
    total_mb_ops = num_chunks * num_microbatches
    fwd_bwd = total_mb_ops - warmup
    total = warmup + fwd_bwd + warmup  # warm-up + steady + cool-down (cool-down = warm-up)
    num_1f1b = rank  # zero bubble: the first `rank` steady pairs run without a W

    def fwd_stage(step: int) -> int:
        return ((step // per_round) % num_chunks) * num_stages + rank

    def bwd_stage(step: int) -> int:
        return (num_chunks - 1 - ((step - warmup) // per_round) % num_chunks) * num_stages + rank

    fwd_mb: dict[int, int] = {}
    bwd_mb: dict[int, int] = {}
    w_mb: dict[int, int] = {}
    ops: list[_Action] = []
    backward_steps: list[int] = []
    weights = 0
    bkind: InstructionKind = "backward_input" if zero_bubble else "backward"

    def take(counter: dict[int, int], stage: int) -> int:
        counter[stage] = counter.get(stage, 0) + 1
        return counter[stage] - 1

    def weight() -> None:
        nonlocal weights
        stage = bwd_stage(backward_steps[weights])
        ops.append((stage, "backward_weight", take(w_mb, stage)))
        weights += 1

    for op in range(total):
        if op < warmup + fwd_bwd:
            stage = fwd_stage(op)
            ops.append((stage, "forward", take(fwd_mb, stage)))
            if op < warmup:
                continue
        stage = bwd_stage(op)
        ops.append((stage, bkind, take(bwd_mb, stage)))
        backward_steps.append(op)
        if zero_bubble and op - warmup >= num_1f1b:
            weight()
    while zero_bubble and weights < len(backward_steps):
        weight()
    return ops


def _torch_zbv_rank_ops(rank: int, num_stages: int, num_microbatches: int) -> list[_Action]:
    """``ScheduleZBVZeroBubble._calculate_single_rank_operations`` (two chunks per rank, in a V)."""
    n_micro = max(2 * num_stages - 1, num_microbatches)
    chunk0, chunk1 = rank, 2 * num_stages - 1 - rank
    f0 = f1 = b0 = b1 = 0
    ops: list[_Action] = []
    for _ in range(2 * (num_stages - rank) - 1):
        ops.append((chunk0, "forward", f0))
        f0 += 1
    for _ in range(rank):
        ops += [(chunk1, "forward", f1), (chunk0, "forward", f0)]
        f1, f0 = f1 + 1, f0 + 1
    for _ in range(num_stages - rank):
        ops += [(chunk1, "forward", f1), (chunk1, "backward_input", b1), (chunk1, "backward_weight", b1)]
        f1, b1 = f1 + 1, b1 + 1
    while f1 < f0 or f0 < n_micro:
        if f0 < n_micro:
            ops.append((chunk0, "forward", f0))
            f0 += 1
        ops += [(chunk0, "backward_input", b0), (chunk0, "backward_weight", b0)]
        b0 += 1
        ops += [(chunk1, "forward", f1), (chunk1, "backward_input", b1), (chunk1, "backward_weight", b1)]
        f1, b1 = f1 + 1, b1 + 1
    w0, w1 = b0, b1
    for _ in range(rank):
        ops += [(chunk0, "backward_input", b0), (chunk1, "backward_input", b1)]
        b0, b1 = b0 + 1, b1 + 1
    for _ in range(num_stages - rank):
        ops += [(chunk0, "backward_input", b0), (chunk0, "backward_weight", w0)]
        b0, w0 = b0 + 1, w0 + 1
    ops += [(chunk1, "backward_weight", m) for m in range(w1, b1)]
    ops += [(chunk0, "backward_weight", m) for m in range(w0, b0)]
    return [op for op in ops if op[2] < num_microbatches]


def torch_rank_order(name: str, rank: int, num_stages: int, num_microbatches: int,
                     num_chunks: int) -> list[tuple[int, InstructionKind, int]]:
    """One rank's compute actions ``(torch stage index, kind, microbatch)`` under a torch schedule."""
    if name == "zbv":
        return _torch_zbv_rank_ops(rank, num_stages, num_microbatches)
    return _torch_rank_ops(rank, num_stages, num_microbatches, num_chunks, zero_bubble=name == "zb-interleaved")


def _torch_order(name: str, rank: int, num_stages: int, num_microbatches: int, num_chunks: int) -> list[Instruction]:
    """A torch rank's order as Perseus instructions: chunk = position of the torch stage among the
    rank's stages in ascending torch stage index (``stage // S`` interleaved; 0 and 1 along the V)."""
    local = sorted({stage for stage, _, _ in torch_rank_order(name, rank, num_stages, num_microbatches, num_chunks)})
    chunk_of = {stage: i for i, stage in enumerate(local)}
    return [Instruction(kind, mb, chunk_of[stage])
            for stage, kind, mb in torch_rank_order(name, rank, num_stages, num_microbatches, num_chunks)]


ScheduleName = Literal["1f1b", "interleaved", "gpipe", "torch-interleaved", "zb-interleaved", "zbv"]
SCHEDULES: tuple[str, ...] = ("1f1b", "interleaved", "gpipe", "torch-interleaved", "zb-interleaved", "zbv")
# Schedules Perseus cannot plan, with the reason (one line each).
UNSUPPORTED = {
    "dualpipev": "DualPipeV overlaps a forward with a backward in one action (OVERLAP_F_B), so its "
                 "instructions cannot be clocked one at a time; Perseus does not support it",
}


def build_schedule(
    name: str,
    num_stages: int,
    num_microbatches: int,
    num_chunks: int = 1,
    group_size: int | None = None,
    overlap_p2p: bool = False,
) -> Schedule:
    """Build a named schedule; raises ``ScheduleError`` for impossible configurations.

    ``group_size``: megatron-core's ``microbatch_group_size_per_vp_stage`` (interleaved only;
    None or the stage count is the default order). ``overlap_p2p``: megatron-core's
    ``overlap_p2p_comm`` (interleaved only): the exchanges' waits, not the order.
    """
    _check_sizes(num_stages, num_microbatches, num_chunks)
    if group_size is not None and name != "interleaved":
        raise ScheduleError(f"a microbatch group size applies to the interleaved schedule only, not {name!r}")
    if overlap_p2p and name != "interleaved":
        raise ScheduleError(f"overlapped p2p (megatron-core's overlap_p2p_comm) applies to the interleaved schedule only, not {name!r}")
    if group_size is not None and (not isinstance(group_size, int) or isinstance(group_size, bool)):
        raise ScheduleError(f"microbatch group size must be an integer, got {group_size!r}")
    make: Callable[[int], Sequence[Instruction]]
    placement = "loop"
    if name == "1f1b" or name == "gpipe":
        if num_chunks != 1:
            raise ScheduleError(f"schedule {name!r} has no virtual chunks; use --chunks 1 or 'interleaved'")
        order_fn = one_f_one_b_order if name == "1f1b" else gpipe_order
        make = lambda s: order_fn(s, num_stages, num_microbatches)  # noqa: E731
    elif name == "interleaved":
        if num_chunks < 2:
            raise ScheduleError("interleaved schedule needs at least 2 chunks (--chunks)")
        make = lambda s: interleaved_order(s, num_stages, num_microbatches, num_chunks, group_size)  # noqa: E731
    elif name in ("torch-interleaved", "zb-interleaved", "zbv"):
        if name == "zbv" and num_chunks != 2:
            raise ScheduleError(f"zbv places exactly 2 chunks per stage in a V; use --chunks 2, got {num_chunks}")
        if name == "torch-interleaved" and num_chunks < 2:
            raise ScheduleError("torch-interleaved schedule needs at least 2 chunks (--chunks); use 1f1b for one")
        if name != "zbv" and num_microbatches < num_stages:
            raise ScheduleError(f"{name}: needs at least as many microbatches ({num_microbatches}) as stages ({num_stages})")
        placement = "v" if name == "zbv" else "loop"
        make = lambda s: _torch_order(name, s, num_stages, num_microbatches, num_chunks)  # noqa: E731
    elif name.lower() in UNSUPPORTED:
        raise ScheduleError(UNSUPPORTED[name.lower()])
    else:
        raise ScheduleError(f"unknown schedule {name!r}; choose one of {', '.join(SCHEDULES)}")
    stages = tuple(tuple(make(s)) for s in range(num_stages))
    joint: tuple[tuple[tuple[int, int], ...], ...] = ()
    group = num_stages if group_size is None else group_size
    if name == "interleaved":
        joint = tuple(
            interleaved_joint_receives(
                order, interleaved_warmup(s, num_stages, num_chunks, group) >= num_microbatches * num_chunks
            )
            for s, order in enumerate(stages)
        )
    return Schedule(name, num_stages, num_microbatches, num_chunks, stages, joint, placement,
                    None if group == num_stages else group, bool(overlap_p2p))
