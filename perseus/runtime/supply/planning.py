"""Background planning: rank 0 plans in a niced child process while training goes on at default clocks.

Every rank asks at every step end (``share_outcome``), so all ranks learn at the same step that
the plan is ready (or failed) and switch together; only rank 0 has a planner. Once it is ready,
rank 0 sends each rank its own stage's slice of the frontier (``stage_plan.distribute``): bytes
the planner process encoded, so rank 0's training thread only passes them on.
"""

from __future__ import annotations

import logging
import subprocess
from dataclasses import dataclass
from time import monotonic

from perseus.frontier import NO_NON_COMPUTE, NonCompute
from perseus.store.cache import RunCache
from perseus.planner import PlannerOptions, plan_frontier
from perseus.profile import Profile
from perseus.runtime.plane.collective import Collective
from perseus.planner.process import (NICE, FAILED, PENDING, READY, PlannedStages, ProcessPlanner, start_child,
                                             stop_child)
from perseus.planner.stage_plan import StagePlan, distribute
from perseus.runtime.supply.sources import log_saved
from perseus.schedules import Schedule

log = logging.getLogger("perseus.runtime")

__all__ = ["FAILED", "PENDING", "READY", "BackgroundPlanner", "PlanOutcome", "PlannedStages", "finish_at_close", "log_planned",
           "share_outcome", "start_child", "stop_child"]


class BackgroundPlanner(ProcessPlanner):
    """``plan_frontier`` in a child process at nice 10 (``planner_process``); its result or error.

    The planning function is looked up here when planning starts, so a test (or a caller) that
    replaces ``planning.plan_frontier`` plans with its own function in the child. ``cache``: the
    entry the child writes the frontier to (rank 0's). ``timelines``: every stage's plan carries its
    planned timeline (a switch latency is hidden, ``stage_plan.frontier_timing``)."""

    def __init__(self, schedule: Schedule, profile: Profile, options: PlannerOptions,
                 started: subprocess.Popen[bytes] | None = None, nice: int = NICE,
                 cache: RunCache | None = None, timelines: bool = False, measured_s: float | None = None,
                 non_compute: NonCompute = NO_NON_COMPUTE) -> None:
        super().__init__(schedule, profile, options, plan_frontier, nice=nice, started=started, cache=cache,
                         timelines=timelines, measured_s=measured_s, non_compute=non_compute)


@dataclass(frozen=True)
class PlanOutcome:
    """What every rank learns once rank 0's planning is over: its stage's plan, or why there is none.

    ``plan`` is this rank's own stage slice (``StagePlan``); no rank receives the whole frontier.
    ``planned`` is rank 0's hand-over from the planner process (every stage's bytes, the
    frontier's size, solve time and cache file), for logging, that the engine drops.
    ``received_bytes``: what this rank received for its plan.
    """

    plan: StagePlan | None
    error: str | None = None
    planned: PlannedStages | None = None
    received_bytes: int = 0


def share_outcome(
    collective: Collective, planner: BackgroundPlanner | None, schedule: Schedule, stage: int
) -> PlanOutcome | None:
    """Collective, every rank at the same step: ``None`` while rank 0 is still planning."""
    status = planner.status if collective.is_root and planner is not None else PENDING
    status = collective.broadcast_int(status)
    if status == PENDING:
        return None
    if status == FAILED:
        message = collective.broadcast_object(planner.error if planner is not None else None)
        return PlanOutcome(None, message)
    planned = planner.result if collective.is_root and planner is not None else None
    delivered = distribute(collective, planned.bytes_of if planned is not None else None, schedule, stage)
    return PlanOutcome(delivered.plan, planned=planned, received_bytes=delivered.received_bytes)


def log_planned(planned: PlannedStages, cached: bool) -> None:
    """Rank 0's lines for a plan that is ready: its size and solve time, and where the planner
    process saved it (``planner_process.hand_over``) when there is a cache."""
    log.info("perseus: frontier with %d points planned in %.1f s", planned.num_points, planned.solve_time_s)
    handoff_s = planned.metadata.get("handoff_s")
    if handoff_s:
        log.info("perseus: planned with a hand-off of %.2f ms per instruction (the warm-up steps ran longer than "
                 "the profile's all-max plan: the time between a stage's instructions)", 1e3 * handoff_s)
    if cached:
        log_saved("frontier", planned.saved_to, planned.save_error)


def finish_at_close(planner: ProcessPlanner, wait_s: float, caching: bool) -> bool:
    """Training ended while rank 0 was planning: keep the work, within a bound.

    With a cache, the planner process gets up to ``wait_s`` (``close_plan_wait_s``) to finish: it
    writes the frontier into the cache itself (atomically, ``planner_process.hand_over``), so the
    next run with the same key deploys it after warm-up instead of planning again. Training's exit
    waits at most that long, said in one log line; a planner still running then is stopped (the
    next run plans again from the cached profile). Without a cache there is nothing to keep: it is
    stopped at once. True when the frontier was written to the cache."""
    waited = caching and wait_s > 0 and planner.status == PENDING
    finished = False
    if waited:
        log.info("perseus: training ended while planning; waiting up to %g s (close_plan_wait_s) for the planner "
                 "to write the frontier to the cache", wait_s)
        t0 = monotonic()
        finished = planner.wait(wait_s)
    planner.close()
    result = planner.result
    saved = result is not None and result.saved_to is not None
    if not waited:
        return saved
    if saved:
        assert result is not None
        log.info("perseus: frontier planned %.1f s after training ended, saved to %s; the next run uses it",
                 monotonic() - t0, result.saved_to)
    elif result is not None:
        log.warning("perseus: could not save the frontier to the cache (%s); the next run plans again",
                    result.save_error)
    elif finished:
        log.warning("perseus: planning failed (%s); the next run plans again", planner.error)
    else:
        log.warning("perseus: the planner did not finish within close_plan_wait_s (%g s); stopped it, the next "
                    "run plans again from the cached profile", wait_s)
    return saved
