"""Instruction orders of megatron-core and DeepSpeed, reproduced exactly.

- ``1f1b``: megatron-core ``forward_backward_pipelining_without_interleaving`` and DeepSpeed
  ``TrainSchedule`` (both: ``min(S - s - 1, M)`` warm-up forwards, then forward/backward pairs,
  then cool-down backwards); torch.distributed.pipelining's ``Schedule1F1B`` runs it too.
- ``interleaved``: megatron-core ``forward_backward_pipelining_with_interleaving`` (virtual
  pipeline chunks, its ``get_schedule_table`` order and warm-up count).
- ``gpipe``: all forwards, then all backwards (torch's ``ScheduleGPipe``).

Each generator gives one stage's order; ``tests/megatron`` and ``tests/deepspeed`` record the real
orders and compare.
"""

from __future__ import annotations

from typing import Sequence

from perseus.errors import ScheduleError
from perseus.schedules.model import Instruction


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
