"""Public entry point of the planner: schedule + profile → iteration time–energy frontier."""

from __future__ import annotations

import time
from typing import Callable

import numpy as np

from perseus.schedules.dag import InstructionDAG
from perseus.errors import PerseusError
from perseus.frontier import NO_NON_COMPUTE, Frontier, FrontierPoint, NonCompute
from perseus.planner.choices import build_node_choices
from perseus.planner.deadlines import Candidates, evaluate, own_pace, pareto, search_deadlines
from perseus.planner.latency import land_switches, late_plans, with_lag
from perseus.planner.settings import PlannerOptions
from perseus.profile import Profile
from perseus.schedules import Schedule
from perseus.planner.unlocked import reference_plan
from perseus.timeline.simulator import simulate_plan

ProgressCallback = Callable[[float], None]  # fraction done in [0, 1]
_PACED_TOLERANCE = 1e-4  # relative to the baseline energy: see the thinning of paced points


def plan_frontier(
    schedule: Schedule,
    profile: Profile,
    options: PlannerOptions | None = None,
    *,
    progress: ProgressCallback | None = None,
    non_compute: NonCompute = NO_NON_COMPUTE,
) -> Frontier:
    """Compute the iteration time–energy Pareto frontier of ``schedule`` on ``profile``.

    Every point's (time, energy) is its frequency plan simulated on the profile's measured values.
    ``options`` sets how hard the planner works (``PlannerOptions``; the defaults plan 16 stages
    × 4 chunks × 128 microbatches in about half a minute on 2 cores); ``progress`` hears the fraction done.
    ``non_compute``: each iteration's time outside the instructions; it moves no point (every plan
    has it) but the frontier's slowdowns, savings and ``lookup_slowdown`` count it.
    """
    options = PlannerOptions() if options is None else options
    if not isinstance(options, PlannerOptions):
        raise PerseusError(
            f"plan_frontier: options must be a PlannerOptions, got {type(options).__name__}; "
            "use PlannerOptions.from_mapping for a dict"
        )
    started = time.perf_counter()
    report = progress if progress is not None else (lambda _: None)
    profile.check_matches(schedule)
    p_blocking = profile.require_p_blocking()
    dag = InstructionDAG.from_schedule(schedule)
    base_freqs = reference_plan(dag, profile)  # the unlocked card where measured: "no slowdown" means against it
    base = simulate_plan(dag, profile, base_freqs)
    node_choices = build_node_choices(dag, profile, p_blocking)
    beamed = options.beam_runs_on(dag.num_nodes) and options.lp_runs_on(dag.num_nodes)

    found = search_deadlines(dag, node_choices, p_blocking, [base.time_s], options, report)
    if options.switch_latency_s > 0:
        latency = options.switch_latency_s
        held = np.unique(land_switches(dag, node_choices, found.choices, latency, options.switch_cost_w), axis=0)
        landed = evaluate(dag, node_choices, held, p_blocking)
        found = pareto(with_lag(landed, late_plans(dag, node_choices, held, latency), dag, node_choices, profile, latency))

    # Candidates were simulated (perseus.timeline.simulator.simulate_many) and cost-filtered in search_deadlines.
    kept, paced = _split_points(found, node_choices.node_freqs(found.choices), _PACED_TOLERANCE * base.energy_j)
    report(1.0)
    return Frontier(
        schedule=schedule,
        p_blocking_w=p_blocking,
        baseline_time_s=base.time_s,
        baseline_energy_j=base.energy_j,
        points=kept,
        paced_points=paced,
        non_compute=non_compute,
        gpu_name=profile.gpu_name,
        solve_time_s=time.perf_counter() - started,
        metadata={
            "planner": _planner_name(options, dag.num_nodes) + ("+beam" if beamed else ""),
            **options.as_dict(),
        },
    )


def _planner_name(options: PlannerOptions, num_instructions: int) -> str:
    """What guided the repair: the hull LP by HiGHS or by network simplex, or the price sweep."""
    if not options.lp_runs_on(num_instructions):
        return "prices+repair"
    return "flow-lp+repair" if options.flow_runs_on(num_instructions) else "hull-lp+repair"


def _split_points(found: Candidates, freqs: np.ndarray, slack_j: float) -> tuple[list[FrontierPoint], list[FrontierPoint]]:
    """The frontier's points (less energy than every faster plan) and its paced points.

    Paced points are thinned: one is kept only if its cost (what a wait cannot change) undercuts
    every faster kept plan by ``slack_j``, so paced_lookup loses at most that while the file stays
    a fraction of the size (A100 8×96 with 0.01 % of the baseline energy: 611 → 207 plans).
    """
    own = own_pace(found)
    points: list[FrontierPoint] = []
    paced: list[FrontierPoint] = []
    least = np.inf
    for i, (time_s, energy_j, cost) in enumerate(zip(found.times_s, found.energies_j, found.costs)):
        if own[i] or cost < least - slack_j:
            (points if own[i] else paced).append(FrontierPoint(float(time_s), float(energy_j), freqs[i]))
            least = min(least, cost)
    return points, paced


__all__ = ["plan_frontier", "PlannerOptions", "ProgressCallback"]
