"""Instruction orders of megatron-core and DeepSpeed, reproduced exactly.

- ``1f1b``: megatron-core ``forward_backward_pipelining_without_interleaving`` and DeepSpeed
  ``TrainSchedule`` (both: ``min(S - s - 1, M)`` warm-up forwards, then forward/backward pairs,
  then cool-down backwards); torch.distributed.pipelining's ``Schedule1F1B`` runs it too.
- ``interleaved``: megatron-core ``forward_backward_pipelining_with_interleaving`` (virtual
  pipeline chunks, its ``get_schedule_table`` order and warm-up count).
- ``gpipe``: all forwards, then all backwards (torch's ``ScheduleGPipe``).
- ``megatron-combined-1f1b``: megatron-core's combined 1F1B (``overlap_moe_expert_parallel_comm``,
  ``pipeline_parallel/combined_1f1b.py``): the interleaved order with one more warm-up forward,
  each steady forward/backward pair run as one fused unit; one stage is ``combined_1f1b_schedule_
  for_no_pipelining`` (F0, F1+B0, ..., B(M-1)), which the same rule gives.

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


def _interleaved_parts(stage: int, num_stages: int, num_microbatches: int, num_chunks: int,
                       group_size: int | None, extra_warmup: int) -> tuple[list[Instruction], list[Instruction], int]:
    """(forwards, backwards, warm-up count) of megatron-core's interleaved order: the k-th forward
    and k-th backward by virtual microbatch id, and how many forwards run before the first backward."""
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
    warmup = min(interleaved_warmup(stage, num_stages, num_chunks, group) + extra_warmup, total)
    forwards = [Instruction("forward", m, c) for m, c in table]
    backwards = [Instruction("backward", m, num_chunks - 1 - c) for m, c in table]
    return forwards, backwards, warmup


def combined_1f1b_order(
    stage: int,
    num_stages: int,
    num_microbatches: int,
    num_chunks: int,
    group_size: int | None = None,
) -> list[Instruction]:
    """megatron-core's combined 1F1B of one stage (``overlap_moe_expert_parallel_comm``).

    ``get_pp_rank_microbatches`` adds one warm-up forward ("so that the forward and backward
    computations are independent in all 1f1b steps"); every steady step then calls
    ``combined_1f1b_schedule_for_interleaved_pipelining`` with the forward of virtual microbatch
    ``k + warmup`` and the backward of ``k``: one fused unit. Warm-up forwards and cool-down
    backwards run alone. With one stage (no pipelining) this is F0, F1+B0, ..., B(M-1).
    ``delay_wgrad_compute`` runs the weight gradients inside the fused unit (per layer), so it
    does not change the order.
    """
    forwards, backwards, warmup = _interleaved_parts(stage, num_stages, num_microbatches, num_chunks, group_size, 1)
    total = len(forwards)
    order = forwards[:warmup]
    for k in range(total - warmup):
        f, b = forwards[k + warmup], backwards[k]
        order.append(Instruction.fused(f.microbatch, f.chunk, b.microbatch, b.chunk))
    return order + backwards[total - warmup:]


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
    forwards, backwards, warmup = _interleaved_parts(stage, num_stages, num_microbatches, num_chunks, group_size, 0)
    total = len(forwards)
    order = forwards[:warmup]
    for k in range(total - warmup):
        order.append(forwards[k + warmup])
        order.append(backwards[k])
    return order + backwards[total - warmup:]


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
