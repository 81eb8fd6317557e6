"""Exact large-neighbourhood search: re-optimise a window of instructions by a small MILP.

Rounding and block shifts change one or two instructions at a time; the last fraction of a
percent to the discrete optimum needs several instructions changed together. A *window* is the
set of nodes at consecutive topological depths [a, b] (at most ``max_window`` of them). With
every other node's choice fixed, the window's problem is exact and small:

- nodes shallower than ``a`` are never descendants of the window, so their earliest finishes
  are constants (their own ancestors are fixed too);
- nodes deeper than ``b`` are never ancestors of the window, so their latest starts under the
  deadline are constants.

So the window is a MILP over its own nodes only: a binary per (node, choice), a start time per
node, precedence inside the window, start ≥ earliest finish of outside predecessors, finish ≤
latest start of outside successors (or the deadline). Minimising the window's Σ effective cost
minimises the plan's energy at that deadline over every plan that differs only inside the window.
Windows slide over the depths; each accepted solution is simulated and kept only if it really
meets the deadline and costs less.
"""

from __future__ import annotations

import time

import numpy as np
from scipy.optimize import Bounds, LinearConstraint, milp
from scipy.sparse import coo_matrix

from perseus.schedules.dag import InstructionDAG
from perseus.planner.choices import NodeChoices

_IMPROVEMENT = 1e-9  # relative: smaller changes are solver noise


class WindowSearch:
    """Slides depth-band windows over the DAG and solves each exactly."""

    def __init__(self, dag: InstructionDAG, node_choices: NodeChoices, max_window: int = 16) -> None:
        self.dag = dag
        self.node_choices = node_choices
        self.graph = dag.levels
        self.preds = dag.predecessors
        self.succs = dag.successors
        self.windows = _depth_windows([len(level.nodes) for level in self.graph.levels], max_window)

    def improve(self, choice: np.ndarray, deadline: float, max_windows: int, time_limit_s: float = float("inf"),
                rounds: int = 2) -> tuple[np.ndarray, int]:
        """Better choice (n,) within ``deadline`` by window MILPs, until a pass finds nothing or
        ``max_windows`` MILPs were solved (the work budget; ``time_limit_s`` is a safety cap).
        Returns the plan and the number of MILPs solved."""
        stop_at = time.perf_counter() + time_limit_s
        choice = choice.copy()
        solved = 0
        bounds = self._time_bounds(choice, deadline)  # recomputed only when a window changes the plan
        for _ in range(rounds):
            changed = False
            for first, last in self.windows:
                if solved >= max_windows or time.perf_counter() > stop_at:
                    return choice, solved
                new = self._solve_window(choice, deadline, first, last, stop_at - time.perf_counter(), bounds)
                solved += 1
                if new is not None:
                    choice, changed = new, True
                    bounds = self._time_bounds(choice, deadline)
            if not changed:
                break
        return choice, solved

    def _time_bounds(self, choice: np.ndarray, deadline: float) -> tuple[np.ndarray, np.ndarray]:
        """Every node's earliest finish and latest start under the plan, in the windows' time unit.

        Times in units of 1e-4 × deadline: HiGHS's absolute feasibility tolerance (1e-7) then
        is 1e-11 of the deadline, so rounded solutions keep to it.
        """
        g = self.graph
        durations = self.node_choices.node_times(choice)
        scale = 1e4 / deadline
        earliest_finish = g.finish_times(durations[None])[0] * scale
        latest_start = (g.latest_finish(durations[None], np.array([deadline]))[0] - np.append(durations, 0.0)) * scale
        return earliest_finish, latest_start

    def _solve_window(self, choice: np.ndarray, deadline: float, first: int, last: int, budget_s: float,
                      bounds: tuple[np.ndarray, np.ndarray]) -> np.ndarray | None:
        opts, g = self.node_choices, self.graph
        n = g.num_nodes
        scale = 1e4 / deadline
        earliest_finish, latest_start = bounds
        nodes = np.concatenate([level.nodes for level in g.levels[first : last + 1]])
        position = {v: i for i, v in enumerate(nodes.tolist())}
        tables = opts.node_table[nodes]
        counts = opts.num_choices[tables]
        offsets = np.concatenate([[0], np.cumsum(counts)])
        num_binary = int(offsets[-1])
        k = len(nodes)
        col_start = num_binary  # then one start time per window node
        cost = np.zeros(num_binary + k)
        times_of: list[np.ndarray] = []
        for i, table in enumerate(tables.tolist()):
            m = counts[i]
            cost[offsets[i] : offsets[i + 1]] = opts.costs[table, :m]
            times_of.append(opts.times[table, :m] * scale)

        rows: list[int] = []
        cols: list[int] = []
        vals: list[float] = []
        lower: list[float] = []
        upper: list[float] = []
        start_lower = np.zeros(k)

        def add_finish_row(i: int, extra_col: int | None, rhs: float) -> None:
            r = len(lower)
            span = list(range(offsets[i], offsets[i + 1]))
            rows.extend([r] * (len(span) + 1 + (extra_col is not None)))
            cols.extend(span + [col_start + i] + ([extra_col] if extra_col is not None else []))
            vals.extend(times_of[i].tolist() + [1.0] + ([-1.0] if extra_col is not None else []))
            lower.append(-np.inf)
            upper.append(rhs)

        for i, v in enumerate(nodes.tolist()):
            r = len(lower)  # exactly one choice
            rows.extend([r] * counts[i])
            cols.extend(range(offsets[i], offsets[i + 1]))
            vals.extend([1.0] * counts[i])
            lower.append(1.0)
            upper.append(1.0)
            outside_preds = [earliest_finish[u] for u in self.preds[v] if u not in position]
            start_lower[i] = max(outside_preds, default=0.0)
            limit = 1e4 if not self.succs[v] else np.inf
            for w in self.succs[v]:
                if w in position:
                    add_finish_row(i, col_start + position[w], 0.0)
                else:
                    limit = min(limit, float(latest_start[w]))
            if np.isfinite(limit):
                add_finish_row(i, None, float(limit))
        a = coo_matrix((vals, (rows, cols)), shape=(len(lower), num_binary + k)).tocsr()
        integrality = np.concatenate([np.ones(num_binary), np.zeros(k)])
        bounds = Bounds(np.concatenate([np.zeros(num_binary), start_lower]), np.concatenate([np.ones(num_binary), np.full(k, np.inf)]))
        res = milp(
            cost,
            constraints=LinearConstraint(a, lower, upper),
            integrality=integrality,
            bounds=bounds,
            options={"time_limit": max(budget_s, 0.01), "mip_rel_gap": 2e-4, "disp": False},  # HiGHS stays quiet
        )
        if res.x is None:
            return None
        picked = np.array([int(np.argmax(res.x[offsets[i] : offsets[i + 1]])) for i in range(k)])
        current = opts.costs[tables, choice[nodes]].sum()
        proposed = opts.costs[tables, picked].sum()
        if proposed >= current - _IMPROVEMENT * abs(current):
            return None
        new = choice.copy()
        new[nodes] = picked
        finish = g.finish_times(opts.node_times(new)[None])[0, :n]
        if finish.max() > deadline:
            return None  # solver tolerance let a path overshoot: keep the old plan
        return new


def _depth_windows(widths: list[int], max_window: int) -> list[tuple[int, int]]:
    """Bands [first, last] of consecutive depths holding at most ``max_window`` nodes, starting
    at every depth, keeping only bands not contained in another."""
    bands: list[tuple[int, int]] = []
    for first in range(len(widths)):
        total, last = 0, first - 1
        while last + 1 < len(widths) and total + widths[last + 1] <= max_window:
            last += 1
            total += widths[last]
        if last >= first and (not bands or last > bands[-1][1]):
            bands.append((first, last))
    return bands
