"""Public entry point of the planner: schedule + profile → iteration time–energy frontier."""

from __future__ import annotations

import time
from typing import Callable

import numpy as np

from perseus.dag import InstructionDAG
from perseus.errors import PerseusError
from perseus.frontier import Frontier, FrontierPoint
from perseus.planner.options import build_node_options
from perseus.planner.sweep import Candidates, own_pace, sweep
from perseus.profile import Profile
from perseus.schedule import Schedule
from perseus.simulator import max_frequency_plan, simulate_plan

ProgressCallback = Callable[[float], None]  # fraction done in [0, 1]
_PACED_TOLERANCE = 1e-4  # relative to the baseline energy: see the thinning of paced points


def plan_frontier(
    schedule: Schedule,
    profile: Profile,
    progress: ProgressCallback | None = None,
    *,
    num_anchors: int = 48,
    num_deadlines: int = 1024,
    improve_sweeps: int = 4,
    max_block: int = 2,
    improve_time_s: float = 3.0,
    search_time_s: float = 1.0,
    search_gap: float = 2e-3,
    max_window: int = 10,
    beam_width: int = 500,
    beam_max_width: int = 8000,
    beam_deadlines: int = 64,
    beam_fill: int = 192,
    beam_max_nodes: int = 48,
) -> Frontier:
    """Compute the iteration time–energy Pareto frontier of ``schedule`` on ``profile``.

    Every point's (time, energy) is its frequency plan simulated on the profile's measured values.

    Options (defaults suit up to ~8 stages × 96 microbatches in seconds):

    - ``num_anchors``: deadlines at which the convex-hull LP is solved exactly (more: closer to
      the LP's guidance between anchors, ~10 ms per anchor at 1,500 instructions).
    - ``num_deadlines``: total deadlines repaired to discrete plans (anchors plus interpolated
      ones); sets how dense the frontier is. Repair of all of them runs as one batch.
    - ``improve_sweeps``: passes of block potential descent on the anchor plans (0 disables).
    - ``max_block``: longest run of one stage's instructions shifted together in that descent.
    - ``improve_time_s``: wall-clock cap on that descent (it stops between moves; every plan it
      has reached is kept), so large pipelines stay within seconds.
    - ``search_time_s``: wall-clock budget of the exact window search (small MILPs over bands of
      at most ``max_window`` instructions) on anchor plans; 0 disables it.
    - ``search_gap``: only plans more than this fraction above the LP lower bound are improved
      (block descent) or searched (windows); the bound comes free with the LP, so near-optimal
      pipelines pay nothing.
    - ``beam_width``, ``beam_max_width``, ``beam_deadlines``, ``beam_fill``, ``beam_max_nodes``:
      on pipelines of at most ``beam_max_nodes`` instructions, LP-guided beam search
      (``planner.beam``) builds plans at the anchors plus ``beam_deadlines`` deadlines spaced
      evenly in energy, starting at ``beam_width`` states per deadline and doubling up to
      ``beam_max_width`` where wider beams keep finding better plans, then at ``beam_fill``
      deadlines evenly spaced in time at ``beam_width``. ``beam_width=0`` disables it.
    """
    for name, value, low in (
        ("num_anchors", num_anchors, 2),
        ("num_deadlines", num_deadlines, 1),
        ("improve_sweeps", improve_sweeps, 0),
        ("max_block", max_block, 1),
        ("beam_width", beam_width, 0),
        ("beam_max_width", beam_max_width, 0),
        ("beam_deadlines", beam_deadlines, 0),
        ("beam_fill", beam_fill, 0),
        ("beam_max_nodes", beam_max_nodes, 0),
    ):
        if not isinstance(value, int) or isinstance(value, bool) or value < low:
            raise PerseusError(f"plan_frontier: {name} must be an integer >= {low}, got {value!r}")
    for name, number in (("improve_time_s", improve_time_s), ("search_time_s", search_time_s), ("search_gap", search_gap)):
        if not isinstance(number, (int, float)) or isinstance(number, bool) or not number >= 0:
            raise PerseusError(f"plan_frontier: {name} must be a number >= 0, got {number!r}")
    if beam_width > beam_max_width:
        raise PerseusError(f"plan_frontier: beam_max_width ({beam_max_width}) must be at least beam_width ({beam_width})")
    if not isinstance(max_window, int) or isinstance(max_window, bool) or max_window < 1:
        raise PerseusError(f"plan_frontier: max_window must be an integer >= 1, got {max_window!r}")
    started = time.perf_counter()
    report = progress if progress is not None else (lambda _: None)
    profile.check_matches(schedule)
    p_blocking = profile.require_p_blocking()
    dag = InstructionDAG.from_schedule(schedule)
    base_freqs = max_frequency_plan(dag, profile)
    base = simulate_plan(dag, profile, base_freqs)
    options = build_node_options(dag, profile, p_blocking)
    beamed = beam_width > 0 and dag.num_nodes <= beam_max_nodes

    found = sweep(
        dag,
        options,
        p_blocking,
        extra_deadlines=[base.time_s],
        num_anchors=num_anchors,
        num_deadlines=num_deadlines,
        improve_sweeps=improve_sweeps,
        max_block=max_block,
        improve_time_s=improve_time_s,
        progress=report,
        search_time_s=search_time_s,
        search_gap=search_gap,
        max_window=max_window,
        beam_width=beam_width if beamed else 0,
        beam_max_width=beam_max_width,
        beam_deadlines=beam_deadlines,
        beam_fill=beam_fill,
    )

    # Candidates were simulated (perseus.simulator.simulate_many) and cost-filtered in sweep.
    kept, paced = _split_points(found, options.node_freqs(found.choices), _PACED_TOLERANCE * base.energy_j)
    report(1.0)
    return Frontier(
        schedule=schedule,
        p_blocking_w=p_blocking,
        baseline_time_s=base.time_s,
        baseline_energy_j=base.energy_j,
        points=kept,
        paced_points=paced,
        gpu_name=profile.gpu_name,
        solve_time_s=time.perf_counter() - started,
        metadata={
            "planner": "hull-lp+repair" + ("+beam" if beamed else ""),
            "num_anchors": num_anchors,
            "num_deadlines": num_deadlines,
            "improve_sweeps": improve_sweeps,
            "max_block": max_block,
            "improve_time_s": improve_time_s,
            "search_time_s": search_time_s,
            "search_gap": search_gap,
            "max_window": max_window,
            "beam_width": beam_width,
            "beam_max_width": beam_max_width,
            "beam_deadlines": beam_deadlines,
            "beam_fill": beam_fill,
            "beam_max_nodes": beam_max_nodes,
        },
    )


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


__all__ = ["plan_frontier", "ProgressCallback"]
