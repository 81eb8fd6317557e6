"""Discrete repair: turn continuous target durations into feasible choices.

All functions work on a batch of plans at once (one row per deadline) and walk the DAG one
topological level at a time.

``round_with_carry`` walks forward: a node may take the slowest choice that finishes by its
latest finish under the *targets* of its descendants, given the actual finishes of its
predecessors. Time a node gives up by rounding down is carried to its successors (they start
earlier), so a chain of nodes whose target lies between two choices ends up with the right mix of
the two, like error diffusion. Every step keeps "chosen prefix + targets for the rest" within the
deadline, so the result always meets it.

``fill_slack`` then alternates backward and forward passes that slow each node into whatever
float remains, until no node can be slowed alone. Slower choices are always cheaper (choices are
filtered that way), so each pass can only lower energy.
"""

from __future__ import annotations

import numpy as np

from perseus.schedules.dag import LevelGraph
from perseus.planner.choices import NodeChoices

# Relative slack allowed when comparing a budget with a choice's time, so that a target equal to
# a choice's time (up to float rounding) selects that choice. Deadlines are shrunk by
# DEADLINE_MARGIN, far more than the tolerance can accumulate along any path.
FIT_TOLERANCE = 1e-12
DEADLINE_MARGIN = 1e-9


def _choose(level_times: np.ndarray, level_last: np.ndarray, budgets: np.ndarray) -> np.ndarray:
    """Slowest fitting choice per (row, node) of one level.

    ``level_times`` (nodes, choices + 1) holds each node's choice times, +inf padded, then a NaN
    column; times rise along a row, so the first choice that does not fit (NaN never does) is
    the count of those that do. One comparison for the whole level whatever its mix of choice
    tables (a per-table ``searchsorted`` cost one Python step per table and level: about half
    the repair time on 16-stage interleaved pipelines).
    """
    tol = budgets * (1 + FIT_TOLERANCE) + 1e-15
    fits = np.argmin(level_times[None, :, :] <= tol[:, :, None], axis=2) - 1
    return np.minimum(np.maximum(fits, 0), level_last)


class LevelChooser:
    """Per-level choice times of the level's nodes, precomputed once per DAG."""

    def __init__(self, graph: LevelGraph, node_choices: NodeChoices) -> None:
        self.graph = graph
        self.node_choices = node_choices
        self.level_times: list[np.ndarray] = []
        self.level_last: list[np.ndarray] = []
        for level in graph.levels:
            tables = node_choices.node_table[level.nodes]
            self.level_times.append(np.pad(node_choices.times[tables], ((0, 0), (0, 1)), constant_values=np.nan))
            self.level_last.append(node_choices.num_choices[tables] - 1)

    def _pick(self, index: int, budgets: np.ndarray) -> np.ndarray:
        return _choose(self.level_times[index], self.level_last[index], budgets)

    def round_with_carry(self, targets: np.ndarray, deadlines: np.ndarray) -> np.ndarray:
        """Choices (batch, n) meeting ``deadlines`` that follow continuous ``targets``."""
        g, opts = self.graph, self.node_choices
        deadlines = deadlines * (1 - DEADLINE_MARGIN)
        latest = g.latest_finish(targets, deadlines)
        batch = targets.shape[0]
        finish = np.zeros((batch, g.num_nodes + 1))
        choice = np.zeros((batch, g.num_nodes), dtype=np.int64)
        for i, level in enumerate(g.levels):
            start = finish[:, level.preds].max(axis=2)
            picked = self._pick(i, latest[:, level.nodes] - start)
            choice[:, level.nodes] = picked
            finish[:, level.nodes] = start + opts.times[opts.node_table[level.nodes], picked]
        return choice

    def round_with_carry_backward(self, targets: np.ndarray, deadlines: np.ndarray) -> np.ndarray:
        """Mirror of ``round_with_carry``: latest nodes choose first, carrying time to predecessors."""
        g, opts = self.graph, self.node_choices
        deadlines = deadlines * (1 - DEADLINE_MARGIN)
        earliest_finish = g.finish_times(targets)
        batch = targets.shape[0]
        latest_start = np.empty((batch, g.num_nodes + 1))
        latest_start[:, g.num_nodes] = deadlines
        choice = np.zeros((batch, g.num_nodes), dtype=np.int64)
        for i in reversed(range(len(g.levels))):
            level = g.levels[i]
            lf = latest_start[:, level.succs].min(axis=2)
            earliest_start = earliest_finish[:, level.preds].max(axis=2)
            picked = self._pick(i, lf - earliest_start)
            choice[:, level.nodes] = picked
            latest_start[:, level.nodes] = lf - opts.times[opts.node_table[level.nodes], picked]
        return choice

    def fill_backward(self, choice: np.ndarray, deadlines: np.ndarray) -> np.ndarray:
        """Slow nodes into remaining float, latest nodes first."""
        g, opts = self.graph, self.node_choices
        deadlines = deadlines * (1 - DEADLINE_MARGIN)
        durations = opts.node_times(choice)
        finish = g.finish_times(durations)
        latest_start = np.empty_like(finish)
        latest_start[:, g.num_nodes] = deadlines
        choice = choice.copy()
        for i in reversed(range(len(g.levels))):
            level = g.levels[i]
            lf = latest_start[:, level.succs].min(axis=2)
            start = finish[:, level.preds].max(axis=2)
            picked = np.maximum(self._pick(i, lf - start), choice[:, level.nodes])
            choice[:, level.nodes] = picked
            latest_start[:, level.nodes] = lf - opts.times[opts.node_table[level.nodes], picked]
        return choice

    def fill_forward(self, choice: np.ndarray, deadlines: np.ndarray) -> np.ndarray:
        """Slow nodes into remaining float, earliest nodes first."""
        g, opts = self.graph, self.node_choices
        deadlines = deadlines * (1 - DEADLINE_MARGIN)
        latest = g.latest_finish(opts.node_times(choice), deadlines)
        finish = np.zeros_like(latest)
        choice = choice.copy()
        for i, level in enumerate(g.levels):
            start = finish[:, level.preds].max(axis=2)
            picked = np.maximum(self._pick(i, latest[:, level.nodes] - start), choice[:, level.nodes])
            choice[:, level.nodes] = picked
            finish[:, level.nodes] = start + opts.times[opts.node_table[level.nodes], picked]
        return choice

    def fill_slack(self, choice: np.ndarray, deadlines: np.ndarray, max_rounds: int = 4) -> np.ndarray:
        """Alternate backward/forward fills until no node can be slowed alone.

        Rows that a round left unchanged are final, so later rounds only revisit the others.
        """
        choice = choice.copy()
        deadlines = np.broadcast_to(np.asarray(deadlines, dtype=float), (choice.shape[0],))
        active = np.arange(choice.shape[0])
        for _ in range(max_rounds):
            old = choice[active]
            new = self.fill_forward(self.fill_backward(old, deadlines[active]), deadlines[active])
            changed = np.any(new != old, axis=1)
            choice[active] = new
            active = active[changed]
            if not len(active):
                break
        return choice

