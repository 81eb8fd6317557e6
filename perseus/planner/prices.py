"""Price sweep: continuous targets for pipelines too large for the hull LP.

Why: on 4,096+ instructions one hull-LP solve takes seconds to minutes (thousands of simplex
pivots per anchor even warm-started), which alone misses the planner's time targets. A price
μ ≥ 0 on time instead picks, for every instruction independently, the hull vertex minimising
c + μ·t (its tangent of slope −μ): on a single critical chain that is exactly the LP optimum for
the chain's resulting length, and instructions off the critical path get their float back when
the repair fills slack. Sweeping μ from above the steepest hull slope (all fastest) to 0 (all
slowest) gives plans spread over [fastest, slowest]; the deadline search interpolates between
them and repairs, as it does between LP anchors (a convex combination of two plans' durations
finishes no later than the same combination of their times: the longest path is convex).

Costs O(prices × instructions) numpy work plus one batched simulation; no solver.
"""

from __future__ import annotations

import numpy as np

from perseus.schedules.dag import InstructionDAG
from perseus.planner.choices import NodeChoices


def price_grid(node_choices: NodeChoices, count: int) -> np.ndarray:
    """``count`` prices from above the steepest hull slope down to 0, at quantiles of the slopes.

    Quantiles (not an even grid) so that consecutive prices change similar numbers of choices.
    """
    slopes = []
    for table in node_choices.tables:
        ht, hc = table.times_s[table.hull], table.costs[table.hull]
        if len(ht) > 1:
            slopes.append(-np.diff(hc) / np.diff(ht))
    if not slopes:
        return np.array([0.0])
    magnitudes = np.concatenate(slopes)
    inner = np.quantile(magnitudes, np.linspace(0.0, 1.0, max(count - 2, 1)))
    return np.unique(np.concatenate([[0.0], inner, [magnitudes.max() * 2 + 1.0]]))[::-1]


def tangent_choices(node_choices: NodeChoices, prices: np.ndarray) -> np.ndarray:
    """Per price (row) and node: the choice index of the hull vertex minimising c + μ·t."""
    per_table = np.empty((len(prices), len(node_choices.tables)), dtype=np.int64)
    for k, table in enumerate(node_choices.tables):
        hull = table.hull
        values = table.costs[hull][None, :] + prices[:, None] * table.times_s[hull][None, :]
        per_table[:, k] = hull[np.argmin(values, axis=1)]  # ties: the faster vertex
    return per_table[:, node_choices.node_table]


def price_anchors(
    dag: InstructionDAG, node_choices: NodeChoices, count: int, extra_deadlines: list[float]
) -> tuple[np.ndarray, np.ndarray]:
    """(deadlines, target durations) of the price sweep's plans, fastest first, deduplicated.

    Each ``extra_deadlines`` entry within range is added with durations interpolated between the
    two plans around it (feasible by convexity), so the all-max-frequency time gets its own row.
    """
    choices = tangent_choices(node_choices, price_grid(node_choices, count))
    durations = node_choices.node_times(choices)
    times = dag.levels.finish_times(durations)[:, : dag.num_nodes].max(axis=1)
    times, first = np.unique(times, return_index=True)
    durations = durations[first]
    extra_times, extra_targets = [], []
    for deadline in extra_deadlines:
        hi = int(np.searchsorted(times, deadline))
        if 0 < hi < len(times) and times[hi] != deadline:
            f = (deadline - times[hi - 1]) / (times[hi] - times[hi - 1])
            extra_times.append(deadline)
            extra_targets.append((1 - f) * durations[hi - 1] + f * durations[hi])
    if extra_times:
        times = np.concatenate([times, extra_times])
        durations = np.concatenate([durations, np.asarray(extra_targets)])
        order = np.argsort(times, kind="stable")
        times, durations = times[order], durations[order]
    return times, durations


def spread_float(dag: InstructionDAG, durations: np.ndarray, deadlines: np.ndarray, slowest: np.ndarray) -> np.ndarray:
    """Stretch each node by the ratio of its row's deadline to the longest path through it.

    Why: interpolated targets leave float that slack filling would give to whichever node it
    visits first, while costs are convex and favour sharing it. Scaling node v by T / P_v (P_v:
    longest path through v) shares it along every path and stays feasible: on any path p each
    P_v ≥ len(p), so the stretched path is at most T. Capped at each node's slowest time.
    (16 × 32 1F1B: 0.6 % less energy at the all-max time than without.)
    """
    graph = dag.levels
    n = dag.num_nodes
    finish = graph.finish_times(durations)[:, :n]
    latest = graph.latest_finish(durations, deadlines)[:, :n]
    through = finish + (deadlines[:, None] - latest)
    factor = np.where(through > 0, deadlines[:, None] / np.maximum(through, 1e-300), 1.0)
    return np.minimum(durations * np.maximum(factor, 1.0), slowest[None, :])


__all__ = ["price_anchors", "price_grid", "spread_float", "tangent_choices"]
