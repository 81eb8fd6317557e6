"""Deadline sweep: LP anchors, discrete repair, local improvement, Pareto filtering.

1. Solve the hull LP at ``num_anchors`` deadlines spread over [fastest, slowest] plus the
   all-max-frequency time (warm-started dual simplex; only the deadline changes).
2. Between adjacent anchors, interpolate the LP durations (a convex combination of two LP optima
   is feasible for the interpolated deadline and exact inside one linear piece of the LP's value
   curve), giving ``num_deadlines`` continuous targets in total.
3. Round every target to options with carry, forward and backward, then fill slack — all
   deadlines at once, one topological level per numpy step.
4. Improve the anchor plans by block potential descent.
5. Keep the Pareto-optimal (time, energy) plans over all candidates.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np

from perseus.dag import InstructionDAG
from perseus.planner.levels import LevelGraph
from perseus.planner.options import NodeOptions
from perseus.planner.potentials import PotentialDescent
from perseus.planner.relaxation import HullRelaxation
from perseus.planner.repair import DEADLINE_MARGIN, LevelChooser

Progress = Callable[[float], None]


@dataclass(frozen=True)
class Candidates:
    """Discrete plans (option indices) with their iteration times and energies."""

    choices: np.ndarray  # (k, n)
    times_s: np.ndarray
    energies_j: np.ndarray


def evaluate(options: NodeOptions, graph: LevelGraph, choices: np.ndarray, p_blocking_w: float, stages: int) -> Candidates:
    """Longest path and energy at that time of each plan (the simulator's formula, batched)."""
    durations = options.node_times(choices)
    times = graph.iteration_times(durations)
    energies = options.node_energies(choices).sum(axis=1) + p_blocking_w * (stages * times - durations.sum(axis=1))
    return Candidates(choices, times, energies)


def pareto(c: Candidates) -> Candidates:
    """Plans with strictly less energy than every faster plan, fastest first."""
    order = np.lexsort((c.energies_j, c.times_s))
    keep = []
    best = np.inf
    for i in order.tolist():
        if c.energies_j[i] < best * (1 - 1e-12):
            keep.append(i)
            best = c.energies_j[i]
    idx = np.asarray(keep, dtype=np.int64)
    return Candidates(c.choices[idx], c.times_s[idx], c.energies_j[idx])


def sweep(
    dag: InstructionDAG,
    options: NodeOptions,
    p_blocking_w: float,
    extra_deadlines: list[float],
    num_anchors: int,
    num_deadlines: int,
    improve_sweeps: int,
    max_block: int,
    improve_time_s: float,
    progress: Progress,
) -> Candidates:
    graph = LevelGraph.from_dag(dag)
    chooser = LevelChooser(graph, options)
    stages = dag.schedule.num_stages
    fastest = options.fastest_times()
    t_fast = float(graph.iteration_times(fastest[None])[0])
    t_slow = float(graph.iteration_times(options.node_times(options.slowest_choice())[None])[0])

    anchors = np.unique(np.concatenate([np.linspace(t_fast, t_slow, max(num_anchors, 2)), extra_deadlines]))
    anchors = anchors[(anchors >= t_fast) & (anchors <= t_slow)]
    relaxation = HullRelaxation(dag, options)
    targets = np.empty((len(anchors), dag.num_nodes))
    for i, deadline in enumerate(anchors):
        # Solve slightly inside the deadline so float rounding never pushes a plan past it.
        targets[i] = relaxation.solve(deadline * (1 - DEADLINE_MARGIN))[0]
        progress(0.5 * (i + 1) / len(anchors))

    # Interpolated targets between adjacent anchors.
    per_gap = max(0, int(np.ceil(num_deadlines / max(len(anchors) - 1, 1))) - 1)
    fractions = np.arange(1, per_gap + 1) / (per_gap + 1)
    dense_deadlines = [anchors]
    dense_targets = [targets]
    if per_gap and len(anchors) > 1:
        lo_t, hi_t = targets[:-1], targets[1:]
        lo_d, hi_d = anchors[:-1], anchors[1:]
        for f in fractions:
            dense_deadlines.append(lo_d + f * (hi_d - lo_d))
            dense_targets.append(lo_t + f * (hi_t - lo_t))
    deadlines = np.concatenate(dense_deadlines)
    all_targets = np.concatenate(dense_targets)

    plans = [chooser.fill_slack(chooser.round_with_carry(all_targets, deadlines), deadlines)]
    progress(0.6)
    plans.append(chooser.fill_slack(chooser.round_with_carry_backward(targets, anchors), anchors))
    # All-fastest plan with its free slack filled: the fastest achievable iteration.
    plans.append(chooser.fill_slack(np.zeros((1, dag.num_nodes), dtype=np.int64), np.array([t_fast])))
    progress(0.7)

    if improve_sweeps > 0:
        descent = PotentialDescent(dag, options, max_block=max_block)
        anchor_plans = np.concatenate([plans[0][: len(anchors)], plans[1]])
        anchor_deadlines = np.concatenate([anchors, anchors]) * (1 - DEADLINE_MARGIN)
        durations = options.node_times(anchor_plans)
        starts = graph.finish_times(durations)[:, : dag.num_nodes] - durations
        starts = descent.improve(starts, anchor_deadlines, sweeps=improve_sweeps, time_limit_s=improve_time_s)
        improved = descent.plan(starts, anchor_deadlines)
        plans.append(chooser.fill_slack(improved, anchor_deadlines))
    progress(0.9)
    return pareto(evaluate(options, graph, np.concatenate(plans), p_blocking_w, stages))
