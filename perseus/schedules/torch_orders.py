"""Instruction orders of torch.distributed.pipelining (torch 2.13, TorchTitan).

Besides the ``1f1b`` and ``gpipe`` orders of ``orders`` (``Schedule1F1B``, ``ScheduleGPipe``):

- ``torch-interleaved``: ``ScheduleInterleaved1F1B`` (rounds of ``M // (M // S)`` microbatches;
  no joint receives: every receive waits for its own input only).
- ``zb-interleaved``: ``ScheduleInterleavedZeroBubble`` (ZB1P): backwards split into
  ``backward_input`` (I, the input gradient sent upstream) and ``backward_weight`` (W, local).
- ``zbv``: ``ScheduleZBVZeroBubble``: two chunks per rank in a V (rank r holds torch stages r and
  2S-1-r); the hop from torch stage S-1 to S (both on rank S-1) is local, no P2P.
- ``dualpipev``: ``ScheduleDualPipeV`` (DeepSeek's DualPipe in a V, same placement as ZBV): its
  ``OVERLAP_F_B`` actions (the forward of one chunk's microbatch with the full backward of the
  other chunk's) are fused units (``Instruction.fused``); some backwards split into I and W.

These are ports of torch's own ``pipeline_order`` generators (compute actions, idle slots
dropped); ``tests/torch`` checks them against torch's schedule objects.
"""

from __future__ import annotations

from perseus.errors import ScheduleError
from perseus.schedules.model import Instruction, InstructionKind

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


def dualpipev_order(rank: int, num_stages: int, num_microbatches: int) -> list[Instruction]:
    """``ScheduleDualPipeV._calculate_single_rank_operations`` as Perseus instructions (chunk 0 is
    torch stage ``rank``, chunk 1 is ``2S-1-rank``).

    Eight steps: forwards on chunk 0, then F0 F1 pairs, then zero-bubble I1 W F1, the main fused
    F0+B1 / F1+B0 steps (the last rank runs its first pair unfused), B1 with F1+B0, then B1 B0
    (from the middle on split into I, odd ranks one instruction earlier), W with B0, and the
    remaining W. A W runs the oldest pending I's weight gradient. torch counts microbatches per
    (torch stage, kind); a full backward advances both the I and the W count.
    """
    if num_microbatches < 2 * num_stages:
        raise ScheduleError(f"dualpipev: needs at least as many microbatches ({num_microbatches}) as torch stages "
                            f"({2 * num_stages} = 2 x {num_stages} ranks), as torch's ScheduleDualPipeV requires")
    forwards = [0, 0]
    backwards = [0, 0]  # the I count: full backwards and I both advance it
    pending: list[tuple[int, int]] = []  # (chunk, microbatch) of I whose W has not run
    order: list[Instruction] = []

    def forward(chunk: int) -> None:
        order.append(Instruction("forward", forwards[chunk], chunk))
        forwards[chunk] += 1

    def backward(chunk: int, split: bool = False) -> None:
        order.append(Instruction("backward_input" if split else "backward", backwards[chunk], chunk))
        if split:
            pending.append((chunk, backwards[chunk]))
        backwards[chunk] += 1

    def weight() -> None:
        if pending:
            chunk, microbatch = pending.pop(0)
            order.append(Instruction("backward_weight", microbatch, chunk))

    def fused(forward_chunk: int) -> None:
        back = 1 - forward_chunk
        order.append(Instruction.fused(forwards[forward_chunk], forward_chunk, backwards[back], back))
        forwards[forward_chunk] += 1
        backwards[back] += 1

    ranks, last = num_stages, num_stages - 1
    for _ in range((ranks - rank - 1) * 2):
        forward(0)
    for _ in range(rank + 1):
        forward(0)
        forward(1)
    for _ in range(ranks - rank - 1):
        backward(1, split=True)
        weight()
        forward(1)
    for i in range(num_microbatches - ranks * 2 + rank + 1):
        if i == 0 and rank == last:
            forward(0)
            backward(1)
        else:
            fused(0)
        fused(1)
    for _ in range(ranks - rank - 1):
        backward(1)
        fused(1)
    split = False
    steps = rank + 1
    for i in range(steps):
        if i == steps // 2 and rank % 2 == 1:
            split = True
        backward(1, split)
        if i == steps // 2 and rank % 2 == 0:
            split = True
        backward(0, split)
    for _ in range(ranks - rank - 1):
        weight()
        backward(0, split)
    for _ in range(rank + 1):
        weight()
    return order


def torch_rank_order(name: str, rank: int, num_stages: int, num_microbatches: int,
                     num_chunks: int) -> list[tuple[int, InstructionKind, int]]:
    """One rank's compute actions ``(torch stage index, kind, microbatch)`` under a torch schedule."""
    if name == "zbv":
        return _torch_zbv_rank_ops(rank, num_stages, num_microbatches)
    return _torch_rank_ops(rank, num_stages, num_microbatches, num_chunks, zero_bubble=name == "zb-interleaved")


def torch_order(name: str, rank: int, num_stages: int, num_microbatches: int, num_chunks: int) -> list[Instruction]:
    """A torch rank's order as Perseus instructions: chunk = position of the torch stage among the
    rank's stages in ascending torch stage index (``stage // S`` interleaved; 0 and 1 along the V)."""
    if name == "dualpipev":
        return dualpipev_order(rank, num_stages, num_microbatches)
    local = sorted({stage for stage, _, _ in torch_rank_order(name, rank, num_stages, num_microbatches, num_chunks)})
    chunk_of = {stage: i for i, stage in enumerate(local)}
    return [Instruction(kind, mb, chunk_of[stage])
            for stage, kind, mb in torch_rank_order(name, rank, num_stages, num_microbatches, num_chunks)]
