"""The one table of schedules Perseus plans: names, CLI choices and validation derive from it.

Each ``ScheduleSpec`` says which framework runs the schedule, how its chunks sit along the model,
what shapes it accepts and how it orders a stage's instructions. ``build_schedule`` looks a name
up here (as torch.distributed.pipelining's ``get_schedule_class`` does) and nowhere else, so
adding a schedule is one order generator and one entry.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Sequence

from perseus.errors import ScheduleError
from perseus.schedules.model import FUSED, Instruction, Placement, Schedule
from perseus.schedules.orders import combined_1f1b_order, gpipe_order, interleaved_joint_receives, interleaved_order, interleaved_warmup, one_f_one_b_order
from perseus.schedules.torch_orders import torch_order

# (stage, stages, microbatches, chunks, microbatch group size or None) -> that stage's order
OrderFn = Callable[[int, int, int, int, "int | None"], Sequence[Instruction]]


@dataclass(frozen=True)
class ScheduleSpec:
    """One plannable schedule."""

    name: str
    runs_in: str  # the frameworks' own names for it, for help texts
    order: OrderFn
    placement: Placement = Placement.LOOP
    # chunks: exactly this many (``exact_chunks``) or at least ``min_chunks``; errors say which flag
    exact_chunks: int | None = None
    min_chunks: int = 1
    chunks_error: str = ""
    # torch's interleaved schedules need at least as many microbatches as stages
    microbatches_at_least_stages: bool = False
    # megatron-core's interleaved 1F1B and combined 1F1B: blocking exchanges (joint receives where
    # the order has forward/backward pairs), microbatch group size, overlapped p2p
    megatron_exchanges: bool = False
    # one stage takes only this many chunks (megatron-core's combined 1F1B without pipelining)
    single_stage_chunks: int | None = None

    def check(self, num_stages: int, num_microbatches: int, num_chunks: int) -> None:
        """Raise ``ScheduleError`` where this schedule cannot take the shape."""
        if self.exact_chunks is not None and num_chunks != self.exact_chunks:
            raise ScheduleError(self.chunks_error.format(name=self.name, chunks=num_chunks))
        if num_chunks < self.min_chunks:
            raise ScheduleError(self.chunks_error.format(name=self.name, chunks=num_chunks))
        if num_stages == 1 and self.single_stage_chunks is not None and num_chunks != self.single_stage_chunks:
            raise ScheduleError(f"{self.name}: one stage runs without virtual chunks; use --chunks "
                                f"{self.single_stage_chunks}, got {num_chunks}")
        if self.microbatches_at_least_stages and num_microbatches < num_stages:
            raise ScheduleError(f"{self.name}: needs at least as many microbatches ({num_microbatches}) "
                                f"as stages ({num_stages})")


def _torch(name: str) -> OrderFn:
    return lambda s, S, M, C, group: torch_order(name, s, S, M, C)


REGISTRY: dict[str, ScheduleSpec] = {spec.name: spec for spec in (
    ScheduleSpec("1f1b", "megatron-core (no virtual pipeline), DeepSpeed TrainSchedule, torch Schedule1F1B",
                 lambda s, S, M, C, group: one_f_one_b_order(s, S, M), exact_chunks=1,
                 chunks_error="schedule {name!r} has no virtual chunks; use --chunks 1 or 'interleaved'"),
    ScheduleSpec("interleaved", "megatron-core with virtual pipeline chunks",
                 lambda s, S, M, C, group: interleaved_order(s, S, M, C, group), min_chunks=2,
                 chunks_error="interleaved schedule needs at least 2 chunks (--chunks)", megatron_exchanges=True),
    ScheduleSpec("gpipe", "torch ScheduleGPipe", lambda s, S, M, C, group: gpipe_order(s, S, M), exact_chunks=1,
                 chunks_error="schedule {name!r} has no virtual chunks; use --chunks 1 or 'interleaved'"),
    ScheduleSpec("torch-interleaved", "torch ScheduleInterleaved1F1B", _torch("torch-interleaved"), min_chunks=2,
                 chunks_error="torch-interleaved schedule needs at least 2 chunks (--chunks); use 1f1b for one",
                 microbatches_at_least_stages=True),
    ScheduleSpec("zb-interleaved", "torch ScheduleInterleavedZeroBubble", _torch("zb-interleaved"),
                 microbatches_at_least_stages=True),
    ScheduleSpec("zbv", "torch ScheduleZBVZeroBubble", _torch("zbv"), placement=Placement.V, exact_chunks=2,
                 chunks_error="zbv places exactly 2 chunks per stage in a V; use --chunks 2, got {chunks}"),
    ScheduleSpec("dualpipev", "torch ScheduleDualPipeV (OVERLAP_F_B: fused forward+backward units)", _torch("dualpipev"),
                 placement=Placement.V, exact_chunks=2,
                 chunks_error="dualpipev places exactly 2 chunks per stage in a V; use --chunks 2, got {chunks}"),
    ScheduleSpec("megatron-combined-1f1b",
                 "megatron-core overlap_moe_expert_parallel_comm (combined 1F1B: fused forward+backward units)",
                 lambda s, S, M, C, group: combined_1f1b_order(s, S, M, C, group), megatron_exchanges=True,
                 single_stage_chunks=1),
)}

SCHEDULES: tuple[str, ...] = tuple(REGISTRY)
# Schedules Perseus cannot plan, with the reason (one line each).
UNSUPPORTED: dict[str, str] = {}


def get_schedule_spec(name: str) -> ScheduleSpec:
    """The registry entry of ``name``; a one-line ``ScheduleError`` for unsupported or unknown names."""
    spec = REGISTRY.get(name)
    if spec is not None:
        return spec
    if name.lower() in UNSUPPORTED:
        raise ScheduleError(UNSUPPORTED[name.lower()])
    raise ScheduleError(f"unknown schedule {name!r}; choose one of {', '.join(SCHEDULES)}")


def _check_sizes(num_stages: int, num_microbatches: int, num_chunks: int) -> None:
    for what, value in (("stages", num_stages), ("microbatches", num_microbatches), ("chunks", num_chunks)):
        if not isinstance(value, int) or value < 1:
            raise ScheduleError(f"number of {what} must be a positive integer, got {value!r}")


def build_schedule(
    name: str,
    num_stages: int,
    num_microbatches: int,
    num_chunks: int = 1,
    group_size: int | None = None,
    overlap_p2p: bool = False,
) -> Schedule:
    """Build a named schedule; raises ``ScheduleError`` for impossible configurations.

    ``group_size``: megatron-core's ``microbatch_group_size_per_vp_stage`` (megatron-core's interleaved and combined 1F1B;
    None or the stage count is the default order). ``overlap_p2p``: megatron-core's
    ``overlap_p2p_comm`` (interleaved only): the exchanges' waits, not the order.
    """
    _check_sizes(num_stages, num_microbatches, num_chunks)
    megatron = name in REGISTRY and REGISTRY[name].megatron_exchanges
    if group_size is not None and not megatron:
        raise ScheduleError(f"a microbatch group size applies to megatron-core's interleaved schedule only (interleaved, megatron-combined-1f1b), not {name!r}")
    if overlap_p2p and not megatron:
        raise ScheduleError(f"overlapped p2p (megatron-core's overlap_p2p_comm) applies to megatron-core's interleaved schedule only "
                            f"(interleaved, megatron-combined-1f1b), not {name!r}")
    if group_size is not None and (not isinstance(group_size, int) or isinstance(group_size, bool)):
        raise ScheduleError(f"microbatch group size must be an integer, got {group_size!r}")
    spec = get_schedule_spec(name)
    spec.check(num_stages, num_microbatches, num_chunks)
    stages = tuple(tuple(spec.order(s, num_stages, num_microbatches, num_chunks, group_size)) for s in range(num_stages))
    joint: tuple[tuple[tuple[int, int], ...], ...] = ()
    group = num_stages if group_size is None else group_size
    fused = any(inst.kind == FUSED for order in stages for inst in order)
    if spec.megatron_exchanges and not fused:  # a fused unit receives both its inputs itself
        joint = tuple(
            interleaved_joint_receives(
                order, interleaved_warmup(s, num_stages, num_chunks, group) >= num_microbatches * num_chunks
            )
            for s, order in enumerate(stages)
        )
    return Schedule(name, num_stages, num_microbatches, num_chunks, stages, joint, spec.placement,
                    None if group == num_stages else group, bool(overlap_p2p), spec.megatron_exchanges)
