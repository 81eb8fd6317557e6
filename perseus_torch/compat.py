"""Which torch.distributed.pipelining schedules Perseus supports, and how a rank maps to Perseus.

Identified by class name along the MRO (no torch import), so a subclass of a supported schedule
is supported as its base. The Perseus name is a ``perseus.schedules.build_schedule`` name whose
per-rank orders equal what the torch class executes (``tests/torch`` checks both the unrun
``pipeline_order`` objects and real gloo runs).
"""

from __future__ import annotations

from typing import Any

from perseus import versions
from perseus.errors import PerseusError

# The torch release the schedules were tested on (perseus/versions.py, the one table): {"torch": "2.13"}.
TESTED_VERSIONS = {"torch": ", ".join(f"{major}.{minor}" for major, minor in versions.supported("torch").lines)}

SCHEDULE_NAMES = {
    "Schedule1F1B": "1f1b",
    "ScheduleGPipe": "gpipe",
    "ScheduleInterleaved1F1B": "torch-interleaved",
    "ScheduleInterleavedZeroBubble": "zb-interleaved",
    "ScheduleZBVZeroBubble": "zbv",
    "ScheduleDualPipeV": "dualpipev",
}
OVERLAP = "OVERLAP_F_B"  # torch's _ComputationType.OVERLAP_F_B (a str enum): DualPipeV's fused units
HOOK_METHODS = ("forward_one_chunk", "backward_one_chunk", "backward_weight_one_chunk")


class UnsupportedTorchSchedule(PerseusError):
    """A pipelining schedule (or stage) Perseus cannot follow."""


def schedule_name(schedule: Any) -> str:
    """The Perseus schedule name of a torch schedule instance, or ``UnsupportedTorchSchedule``."""
    for cls in type(schedule).__mro__:
        if cls.__name__ in SCHEDULE_NAMES:
            return SCHEDULE_NAMES[cls.__name__]
    supported = ", ".join(SCHEDULE_NAMES)
    raise UnsupportedTorchSchedule(
        f"perseus_torch: {type(schedule).__name__} is not a supported pipelining schedule ({supported}); "
        "schedules loaded from CSV or with custom functions are not supported"
    )


def schedule_stages(schedule: Any) -> list[Any]:
    """The stage objects a schedule runs on this rank (``_stages`` of multi-stage, ``_stage`` of single)."""
    stages = getattr(schedule, "_stages", None)
    if stages is None:
        stage = getattr(schedule, "_stage", None)
        stages = [] if stage is None else [stage]
    return list(stages)


def check_stage(stage: Any) -> None:
    for attr in ("stage_index", "num_stages", "group_size", "group_rank", *HOOK_METHODS):
        if not hasattr(stage, attr):
            raise UnsupportedTorchSchedule(
                f"perseus_torch: {type(stage).__name__} has no {attr}; expected a torch.distributed.pipelining "
                f"PipelineStage (tested with torch {TESTED_VERSIONS['torch']})"
            )


def fused_units(schedule: Any, rank: int, chunks: dict[int, int]) -> dict[tuple[int, int], tuple[int, int]]:
    """This rank's fused units as torch's own action list has them (``pipeline_order_with_comms``,
    what ``step()`` executes): (forward's chunk, its microbatch) -> (backward's microbatch, its
    chunk) for every ``OVERLAP_F_B`` action. torch 2.13 runs such an action's forward then its full
    backward; the tracker reports the two calls as one unit. Empty for schedules without them."""
    actions = (getattr(schedule, "pipeline_order_with_comms", None) or {}).get(rank) or []
    units: dict[tuple[int, int], tuple[int, int]] = {}
    for action in actions:
        if action is None or str(getattr(action.computation_type, "value", action.computation_type)) != OVERLAP:
            continue
        forward, backward = action.sub_actions
        units[(chunks[int(forward.stage_index)], int(forward.microbatch_index))] = (
            int(backward.microbatch_index), chunks[int(backward.stage_index)])
    return units


def chunk_map(stages: list[Any]) -> dict[int, int]:
    """Torch stage index -> Perseus chunk: the stage's position among this rank's stages in
    ascending torch stage index. Interleaved: torch stage ``c*S + r`` is chunk ``c`` of rank ``r``;
    ZBV: rank ``r``'s stages ``r`` and ``2S-1-r`` are chunks 0 and 1."""
    return {index: chunk for chunk, index in enumerate(sorted(int(s.stage_index) for s in stages))}
