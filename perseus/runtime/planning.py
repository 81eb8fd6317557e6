"""Background planning: rank 0 plans in a niced child process while training goes on at default clocks.

Every rank asks at every step end (``share_outcome``), so all ranks learn at the same step that
the plan is ready (or failed) and switch together; only rank 0 has a planner. Once it is ready,
rank 0 sends each rank its own stage's slice of the frontier (``stage_plan.distribute``).
"""

from __future__ import annotations

import subprocess
from dataclasses import dataclass

from perseus.frontier import Frontier
from perseus.planner import PlannerOptions, plan_frontier
from perseus.profile import Profile
from perseus.runtime.collective import Collective
from perseus.runtime.planner_process import NICE, FAILED, PENDING, READY, ProcessPlanner, start_child, stop_child
from perseus.runtime.stage_plan import StagePlan, distribute
from perseus.schedule import Schedule

__all__ = ["FAILED", "PENDING", "READY", "BackgroundPlanner", "PlanOutcome", "share_outcome", "start_child",
           "stop_child"]


class BackgroundPlanner(ProcessPlanner):
    """``plan_frontier`` in a child process at nice 10 (``planner_process``); its result or error.

    The planning function is looked up here when planning starts, so a test (or a caller) that
    replaces ``planning.plan_frontier`` plans with its own function in the child."""

    def __init__(self, schedule: Schedule, profile: Profile, options: PlannerOptions,
                 started: subprocess.Popen[bytes] | None = None, nice: int = NICE) -> None:
        super().__init__(schedule, profile, options, plan_frontier, nice=nice, started=started)


@dataclass(frozen=True)
class PlanOutcome:
    """What every rank learns once rank 0's planning is over: its stage's plan, or why there is none.

    ``plan`` is this rank's own stage slice (``StagePlan``); no rank receives the whole frontier.
    ``planned`` is rank 0's whole frontier (with its solve time), for logging and the cache, that
    the engine drops once saved. ``received_bytes``: what this rank received for its plan.
    """

    plan: StagePlan | None
    error: str | None = None
    planned: Frontier | None = None
    received_bytes: int = 0


def share_outcome(
    collective: Collective, planner: BackgroundPlanner | None, schedule: Schedule, stage: int,
    timing_profile: Profile | None = None,
) -> PlanOutcome | None:
    """Collective, every rank at the same step: ``None`` while rank 0 is still planning.
    ``timing_profile`` (rank 0, when the switch latency is hidden): the profile planned on, so
    each stage's plan carries its planned timeline (``stage_plan.distribute``)."""
    status = planner.status if collective.is_root and planner is not None else PENDING
    status = collective.broadcast_int(status)
    if status == PENDING:
        return None
    if status == FAILED:
        message = collective.broadcast_object(planner.error if planner is not None else None)
        return PlanOutcome(None, message)
    planned = planner.result if collective.is_root and planner is not None else None
    delivered = distribute(collective, planned, schedule, stage, timing_profile)
    return PlanOutcome(delivered.plan, planned=planned, received_bytes=delivered.received_bytes)
