"""The discrete repair's passes compiled by numba, one plan (row) at a time: large pipelines.

Why: ``planner.repair`` walks topological levels with numpy over all rows at once, which on
16-stage pipelines costs one Python step per level and operation (~3 s of a 16 × 128 plan's
repair). Here each pass is a loop over the nodes in topological order per row, without the GIL:
~4–5× less CPU, and it can run beside the network simplex's thread. The recurrences and float
operations are the numpy passes' own (a deadline's sentinel is neutral in a min, a zero finish
in a max), so every result is equal bit for bit (tests/planner/test_compiled_repair.py).
Used where the network simplex runs (numba is loaded there anyway; its first call costs ~0.4 s,
more than the whole repair of a small pipeline).
"""

from __future__ import annotations

import numpy as np
from numba import njit

from perseus.schedules.dag import LevelGraph
from perseus.planner.choices import NodeChoices
from perseus.planner.repair import DEADLINE_MARGIN, FIT_TOLERANCE, LevelChooser


@njit(cache=True, nogil=True)
def _pick(times, k, count, budget):  # pragma: no cover - compiled
    """Slowest of table k's ``count`` choices (``times[k]`` ascending) that fits ``budget``; 0 if none.

    The tolerance lets a budget equal to a choice's time (up to float rounding) select it.
    """
    tol = budget * (1 + FIT_TOLERANCE) + 1e-15
    # Branch-free binary search for the number of choices no slower than tol (NaN: none).
    base = 0
    length = count
    while length > 1:
        half = length >> 1
        base = base + half if times[k, base + half] <= tol else base
        length -= half
    fitting = base + 1 if times[k, base] <= tol else base
    return max(fitting - 1, 0)


@njit(cache=True, nogil=True)
def _finish_row(order, pred_ptr, pred_idx, durations, finish):  # pragma: no cover - compiled
    """Earliest finish of every node (one row): each starts when its last predecessor finishes."""
    for v in order:
        start = 0.0
        for k in range(pred_ptr[v], pred_ptr[v + 1]):
            start = max(start, finish[pred_idx[k]])
        finish[v] = start + durations[v]


@njit(cache=True, nogil=True)
def _latest_row(order, succ_ptr, succ_idx, durations, deadline, latest, latest_start):  # pragma: no cover - compiled
    """Latest finish (and start) of every node that still meets ``deadline`` (one row)."""
    for i in range(order.shape[0] - 1, -1, -1):
        v = order[i]
        lf = deadline
        for k in range(succ_ptr[v], succ_ptr[v + 1]):
            lf = min(lf, latest_start[succ_idx[k]])
        latest[v] = lf
        latest_start[v] = lf - durations[v]


@njit(cache=True, nogil=True)
def _round_forward(order, pred_ptr, pred_idx, succ_ptr, succ_idx, table, times, counts, targets, deadlines, out):  # pragma: no cover - compiled
    n = order.shape[0]
    latest = np.empty(n)
    latest_start = np.empty(n)
    finish = np.empty(n)
    for r in range(targets.shape[0]):
        _latest_row(order, succ_ptr, succ_idx, targets[r], deadlines[r], latest, latest_start)
        for v in order:
            start = 0.0
            for k in range(pred_ptr[v], pred_ptr[v + 1]):
                start = max(start, finish[pred_idx[k]])
            j = _pick(times, table[v], counts[table[v]], latest[v] - start)
            out[r, v] = j
            finish[v] = start + times[table[v], j]


@njit(cache=True, nogil=True)
def _round_backward(order, pred_ptr, pred_idx, succ_ptr, succ_idx, table, times, counts, targets, deadlines, out):  # pragma: no cover - compiled
    n = order.shape[0]
    earliest_finish = np.empty(n)
    latest_start = np.empty(n)
    for r in range(targets.shape[0]):
        _finish_row(order, pred_ptr, pred_idx, targets[r], earliest_finish)
        for i in range(n - 1, -1, -1):
            v = order[i]
            lf = deadlines[r]
            for k in range(succ_ptr[v], succ_ptr[v + 1]):
                lf = min(lf, latest_start[succ_idx[k]])
            start = 0.0
            for k in range(pred_ptr[v], pred_ptr[v + 1]):
                start = max(start, earliest_finish[pred_idx[k]])
            j = _pick(times, table[v], counts[table[v]], lf - start)
            out[r, v] = j
            latest_start[v] = lf - times[table[v], j]


@njit(cache=True, nogil=True)
def _fill_row_backward(order, pred_ptr, pred_idx, succ_ptr, succ_idx, table, times, counts, choice, deadline, durations, finish,
                       latest_start):  # pragma: no cover - compiled
    for v in order:
        durations[v] = times[table[v], choice[v]]
    _finish_row(order, pred_ptr, pred_idx, durations, finish)
    for i in range(order.shape[0] - 1, -1, -1):
        v = order[i]
        lf = deadline
        for k in range(succ_ptr[v], succ_ptr[v + 1]):
            lf = min(lf, latest_start[succ_idx[k]])
        start = 0.0
        for k in range(pred_ptr[v], pred_ptr[v + 1]):
            start = max(start, finish[pred_idx[k]])
        j = max(_pick(times, table[v], counts[table[v]], lf - start), choice[v])
        choice[v] = j
        latest_start[v] = lf - times[table[v], j]


@njit(cache=True, nogil=True)
def _fill_row_forward(order, pred_ptr, pred_idx, succ_ptr, succ_idx, table, times, counts, choice, deadline, durations, finish,
                      latest, latest_start):  # pragma: no cover - compiled
    for v in order:
        durations[v] = times[table[v], choice[v]]
    _latest_row(order, succ_ptr, succ_idx, durations, deadline, latest, latest_start)
    for v in order:
        start = 0.0
        for k in range(pred_ptr[v], pred_ptr[v + 1]):
            start = max(start, finish[pred_idx[k]])
        j = max(_pick(times, table[v], counts[table[v]], latest[v] - start), choice[v])
        choice[v] = j
        finish[v] = start + times[table[v], j]


@njit(cache=True, nogil=True)
def _fill(order, pred_ptr, pred_idx, succ_ptr, succ_idx, table, times, counts, choice, deadlines, rounds, backward, forward):  # pragma: no cover - compiled
    """Per row: ``rounds`` rounds of (backward if ``backward``) then (forward if ``forward``)
    fills, stopping after a round that changed nothing. ``choice`` is updated in place."""
    n = order.shape[0]
    durations = np.empty(n)
    finish = np.empty(n)
    latest = np.empty(n)
    latest_start = np.empty(n)
    old = np.empty(n, dtype=choice.dtype)
    for r in range(choice.shape[0]):
        row = choice[r]
        for _ in range(rounds):
            old[:] = row
            if backward:
                _fill_row_backward(order, pred_ptr, pred_idx, succ_ptr, succ_idx, table, times, counts, row, deadlines[r], durations,
                                   finish, latest_start)
            if forward:
                _fill_row_forward(order, pred_ptr, pred_idx, succ_ptr, succ_idx, table, times, counts, row, deadlines[r], durations,
                                  finish, latest, latest_start)
            if np.array_equal(old, row):
                break


class CompiledChooser(LevelChooser):
    """``LevelChooser`` with its passes compiled: same results, one row at a time in topological order."""

    def __init__(self, graph: LevelGraph, node_choices: NodeChoices) -> None:
        super().__init__(graph, node_choices)
        n = graph.num_nodes
        self._order = np.concatenate([level.nodes for level in graph.levels]).astype(np.int64) if n else np.zeros(0, np.int64)
        self._pred_ptr, self._pred_idx = _csr(graph, n, "preds")
        self._succ_ptr, self._succ_idx = _csr(graph, n, "succs")
        self._table = np.ascontiguousarray(node_choices.node_table, dtype=np.int64)
        self._times = np.ascontiguousarray(node_choices.times, dtype=float)  # per table: a few kB, stays in cache
        self._counts = np.ascontiguousarray(node_choices.num_choices, dtype=np.int64)

    def _graph_args(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray,
                                   np.ndarray]:
        """The eight graph arrays every kernel takes first (order, CSR predecessors and successors, tables)."""
        return (self._order, self._pred_ptr, self._pred_idx, self._succ_ptr, self._succ_idx, self._table, self._times,
                self._counts)

    def _shrunk(self, deadlines: np.ndarray, rows: int) -> np.ndarray:
        return np.ascontiguousarray(np.broadcast_to(np.asarray(deadlines, dtype=float) * (1 - DEADLINE_MARGIN), (rows,)))

    def round_with_carry(self, targets: np.ndarray, deadlines: np.ndarray) -> np.ndarray:
        """Choices (batch, n) meeting ``deadlines`` that follow continuous ``targets``."""
        targets = np.ascontiguousarray(targets, dtype=float)
        out = np.empty(targets.shape, dtype=np.int64)
        _round_forward(*self._graph_args(), targets, self._shrunk(deadlines, len(targets)), out)
        return out

    def round_with_carry_backward(self, targets: np.ndarray, deadlines: np.ndarray) -> np.ndarray:
        """Mirror of ``round_with_carry``: latest nodes choose first, carrying time to predecessors."""
        targets = np.ascontiguousarray(targets, dtype=float)
        out = np.empty(targets.shape, dtype=np.int64)
        _round_backward(*self._graph_args(), targets, self._shrunk(deadlines, len(targets)), out)
        return out

    def _filled(self, choice: np.ndarray, deadlines: np.ndarray, rounds: int, backward: bool, forward: bool) -> np.ndarray:
        choice = np.array(choice, dtype=np.int64, order="C")
        _fill(*self._graph_args(), choice, self._shrunk(deadlines, len(choice)), rounds, backward, forward)
        return choice

    def fill_backward(self, choice: np.ndarray, deadlines: np.ndarray) -> np.ndarray:
        """Slow nodes into remaining float, latest nodes first."""
        return self._filled(choice, deadlines, 1, True, False)

    def fill_forward(self, choice: np.ndarray, deadlines: np.ndarray) -> np.ndarray:
        """Slow nodes into remaining float, earliest nodes first."""
        return self._filled(choice, deadlines, 1, False, True)

    def fill_slack(self, choice: np.ndarray, deadlines: np.ndarray, max_rounds: int = 4) -> np.ndarray:
        """Alternate backward/forward fills until no node can be slowed alone (at most
        ``max_rounds`` rounds per row; a row stops after a round that left it unchanged)."""
        return self._filled(choice, deadlines, max_rounds, True, True)


def _csr(graph: LevelGraph, n: int, side: str) -> tuple[np.ndarray, np.ndarray]:
    """Per node, its predecessors or successors as (pointer, index) arrays, from the padded levels."""
    lists: list[np.ndarray] = [np.zeros(0, dtype=np.int64)] * n
    for level in graph.levels:
        padded = getattr(level, side)
        for v, row in zip(level.nodes.tolist(), padded):
            lists[v] = row[row != n]
    counts = np.array([len(x) for x in lists], dtype=np.int64)
    ptr = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
    idx = np.concatenate(lists).astype(np.int64) if n else np.zeros(0, dtype=np.int64)
    return ptr, idx


__all__ = ["CompiledChooser"]
