"""Pipeline schedules as explicit data: per-stage instruction orders (``orders`` for megatron-core
and DeepSpeed, ``torch_orders`` for torch.distributed.pipelining), the one table of plannable
schedules (``registry``), the dependency edges between instructions (``dependencies``, with
``exchanges`` for megatron-core's blocking exchanges) and the DAG derived from them (``dag``)."""

from perseus.schedules.dependencies import DAG_MODEL_VERSION, dependencies
from perseus.schedules.model import FUSED, KINDS, SHORT_KIND, SPLIT_BACKWARD, Instruction, InstructionKind, Placement, Schedule
from perseus.schedules.orders import (
    gpipe_order,
    interleaved_joint_receives,
    combined_1f1b_order,
    interleaved_order,
    interleaved_warmup,
    one_f_one_b_order,
)
from perseus.schedules.registry import REGISTRY, SCHEDULES, UNSUPPORTED, ScheduleSpec, build_schedule, get_schedule_spec
from perseus.schedules.torch_orders import torch_rank_order

__all__ = ["DAG_MODEL_VERSION", "FUSED", "KINDS", "REGISTRY", "SCHEDULES", "SHORT_KIND", "SPLIT_BACKWARD", "UNSUPPORTED", "Instruction",
           "InstructionKind", "Placement", "Schedule", "ScheduleSpec", "build_schedule", "combined_1f1b_order", "dependencies", "get_schedule_spec",
           "gpipe_order", "interleaved_joint_receives", "interleaved_order", "interleaved_warmup", "one_f_one_b_order",
           "torch_rank_order"]
