"""Public entry point of the planner."""

from __future__ import annotations

import time
from typing import Callable

from perseus.dag import InstructionDAG
from perseus.frontier import Frontier, FrontierPoint
from perseus.profile import Profile
from perseus.schedule import Schedule
from perseus.simulator import max_frequency_plan, simulate_plan

ProgressCallback = Callable[[float], None]  # fraction done in [0, 1]


def plan_frontier(schedule: Schedule, profile: Profile, progress: ProgressCallback | None = None) -> Frontier:
    """Compute the iteration time–energy frontier of ``schedule`` on ``profile``.

    PLACEHOLDER until the solver lands: returns only the all-max-frequency point.
    """
    started = time.perf_counter()
    profile.check_matches(schedule)
    dag = InstructionDAG.from_schedule(schedule)
    freqs = max_frequency_plan(dag, profile)
    base = simulate_plan(dag, profile, freqs)
    if progress is not None:
        progress(1.0)
    return Frontier(
        schedule=schedule,
        p_blocking_w=profile.require_p_blocking(),
        baseline_time_s=base.time_s,
        baseline_energy_j=base.energy_j,
        points=[FrontierPoint(base.time_s, base.energy_j, freqs)],
        gpu_name=profile.gpu_name,
        solve_time_s=time.perf_counter() - started,
    )
