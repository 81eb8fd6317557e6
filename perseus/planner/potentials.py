"""Local improvement by shifting start times ("potentials") of blocks of instructions.

Fix every node's start time s_v. Each node then takes the slowest (cheapest) choice that fits its
window, from s_v to the earliest start among its successors (the deadline for sinks), so a plan
is determined by its start times. Shifting the starts of a block X of consecutive instructions of
one stage by δ moves time across the block's boundary: nodes feeding X from outside get a
shorter (or longer) window, nodes of X feeding outside get a longer (or shorter) one, while
windows inside X stay the same. For one node this is "start v earlier: its predecessors speed up,
v slows down"; for longer blocks it exchanges time between instructions several steps apart,
across stages. Total energy as a function of δ is piecewise constant with breakpoints where a
window equals a choice's time, so each move is an exact one-dimensional minimisation over those
breakpoints, done for a whole batch of plans (one row per deadline) at once.

Besides same-stage blocks, ``neighbour_sets`` adds the blocks "all successors of v", "all
predecessors of v" and "v with its successors". Shifting the successors of v later slows v and
speeds up every one of its successors together (across stages), which no same-stage block can do:
on small pipelines the discrete optimum often differs from a block-descent optimum by exactly
such a fan-out trade.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np

from perseus.schedules.dag import InstructionDAG
from perseus.planner.choices import NodeChoices

TOL = 1e-12  # relative slack when comparing times (shared with compiled_descent)
DEADLINE = -1  # a term's successor index meaning "the deadline", not a node


@dataclass(frozen=True)
class _Term:
    node_pos: int  # position of the window's owner in the move's affected list
    succ: int  # successor node id, or DEADLINE
    slope: int  # d(window term)/dδ ∈ {−1, 0, +1}


@dataclass(frozen=True)
class _Move:
    block: np.ndarray  # node ids whose start shifts by δ
    affected: tuple[int, ...]  # nodes whose window depends on δ: the block and its predecessors
    terms: tuple[_Term, ...]


class PotentialDescent:
    """Block coordinate descent over node start times for a batch of plans."""

    def __init__(
        self, dag: InstructionDAG, node_choices: NodeChoices, max_block: int = 3, neighbour_sets: bool = False
    ) -> None:
        self.node_choices = node_choices
        self.n = dag.num_nodes
        self.preds = dag.predecessors
        self.succs = dag.successors
        self.tables = node_choices.node_table.tolist()
        self.rows = [node_choices.times[k, : node_choices.num_choices[k]] for k in range(len(node_choices.tables))]
        self.cost_rows = [node_choices.costs[k, : node_choices.num_choices[k]] for k in range(len(node_choices.tables))]
        self.moves: list[_Move] = []
        offsets = dag.stage_offsets.tolist()
        for size in range(1, max_block + 1):
            for s in range(len(offsets) - 1):
                for a in range(offsets[s], offsets[s + 1] - size + 1):
                    self.moves.append(self._make_move(list(range(a, a + size))))
        if neighbour_sets:
            seen = {tuple(move.block.tolist()) for move in self.moves}
            for v in range(self.n):
                for block in (sorted(self.succs[v]), sorted(self.preds[v]), sorted({v, *self.succs[v]})):
                    if len(block) >= 2 and tuple(block) not in seen:
                        seen.add(tuple(block))
                        self.moves.append(self._make_move(block))

    def _make_move(self, block: list[int]) -> _Move:
        inside = set(block)
        affected = sorted(inside | {u for x in block for u in self.preds[x]})
        terms = []
        for pos, y in enumerate(affected):
            own = 1 if y in inside else 0
            if not self.succs[y]:
                terms.append(_Term(pos, DEADLINE, -own))
            for w in self.succs[y]:
                terms.append(_Term(pos, w, (1 if w in inside else 0) - own))
        return _Move(np.asarray(block, dtype=np.int64), tuple(affected), tuple(terms))

    def _cost(self, node: int, window: np.ndarray) -> np.ndarray:
        j = np.searchsorted(self.rows[self.tables[node]], window * (1 + TOL) + 1e-15, side="right") - 1
        cost = self.cost_rows[self.tables[node]][np.maximum(j, 0)]
        return np.where(j >= 0, cost, np.inf)

    def improve(
        self, starts: np.ndarray, deadlines: np.ndarray, sweeps: int = 3, time_limit_s: float = float("inf")
    ) -> np.ndarray:
        """Apply improving block shifts until none improves, ``sweeps`` passes, or the time limit.

        Rows that a whole pass left unchanged are at a local optimum and drop out of later passes.
        """
        starts = starts.copy()
        deadlines = np.asarray(deadlines, dtype=float)
        stop_at = time.perf_counter() + time_limit_s
        active = np.arange(starts.shape[0])
        for sweep in range(sweeps):
            moves = self.moves if sweep % 2 == 0 else self.moves[::-1]
            rows, limits = starts[active], deadlines[active]
            changed = np.zeros(len(active), dtype=bool)
            for i, move in enumerate(moves):
                changed |= self._apply(move, rows, limits)
                if i % 64 == 0 and time.perf_counter() > stop_at:
                    break
            starts[active] = rows
            active = active[changed]
            if not len(active) or time.perf_counter() > stop_at:
                break
        return starts

    def _apply(self, move: _Move, starts: np.ndarray, deadlines: np.ndarray) -> np.ndarray:
        """Best shift of ``move`` per row, applied in place; rows it improved."""
        batch = starts.shape[0]
        bases = []
        cands = [np.zeros((batch, 1))]
        for term in move.terms:
            y = move.affected[term.node_pos]
            right = deadlines if term.succ == DEADLINE else starts[:, term.succ]
            base = right - starts[:, y]
            bases.append(base)
            if term.slope != 0:
                cands.append((self.rows[self.tables[y]][None, :] - base[:, None]) / term.slope)
        delta = np.concatenate(cands, axis=1)
        # Starts stay non-negative.
        delta = np.maximum(delta, -starts[:, move.block].min(axis=1)[:, None])
        windows: list[np.ndarray | None] = [None] * len(move.affected)
        for term, base in zip(move.terms, bases):
            value = base[:, None] + term.slope * delta
            prev = windows[term.node_pos]
            windows[term.node_pos] = value if prev is None else np.minimum(prev, value)
        cost = np.zeros(delta.shape)
        for y, window in zip(move.affected, windows):
            assert window is not None  # every affected node has a term: a successor's or the deadline's
            cost += self._cost(y, window)
        best = np.argmin(cost, axis=1)
        rows = np.arange(batch)
        better = cost[rows, best] < cost[:, 0] - 1e-9
        if better.any():
            shift = np.where(better, delta[rows, best], 0.0)
            starts[:, move.block] += shift[:, None]
        return better

    def plan(self, starts: np.ndarray, deadlines: np.ndarray) -> np.ndarray:
        """Choice per node implied by start times (slowest choice fitting each window)."""
        choice = np.empty(starts.shape, dtype=np.int64)
        for v in range(self.n):
            right = deadlines if not self.succs[v] else starts[:, list(self.succs[v])].min(axis=1)
            window = right - starts[:, v]
            j = np.searchsorted(self.rows[self.tables[v]], window * (1 + TOL) + 1e-15, side="right") - 1
            choice[:, v] = np.maximum(j, 0)
        return choice
