"""Block potential descent (``planner.potentials``) compiled by numba, one plan (row) at a time.

Why: the numpy descent evaluates every candidate shift of a move for all rows at once, ~20 numpy
calls per move: ~0.75 ms per move on 60 rows of a 16 × 128 pipeline, so a 3 s budget covered
less than half a sweep over its 8,176 moves. Here a move costs a few µs per row: the candidate
shifts are enumerated in the numpy order, and only those that keep every affected node at or
above its fastest choice (the rest cost +inf there) are evaluated, with the same float
operations, so each row ends bit for bit where the numpy descent would
(tests/planner/test_compiled_descent.py). The work is then bounded by sweeps, not by a clock:
plans no longer depend on how busy the machine is. No GIL: it can run beside the network simplex.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from perseus.schedules.dag import InstructionDAG
from perseus.planner.choices import NodeChoices
from perseus.planner.potentials import DEADLINE, TOL, PotentialDescent


@njit(cache=True, nogil=True)
def _node_cost(times, costs, k, count, window):  # pragma: no cover - compiled
    """Cost of the slowest of table k's choices fitting ``window`` (+inf if none), as
    ``PotentialDescent._cost``: a right-sided search of window·(1 + tol) + 1e-15."""
    j = _fit_index(times, k, count, window)
    return costs[k, j] if j >= 0 else np.inf


@njit(cache=True, nogil=True)
def _window(level, reach, sign, delta):  # pragma: no cover - compiled
    """A node's window when its move shifts by δ: the least of its fixed and moving terms."""
    return level if sign == 0 else min(level, reach + sign * delta)


@njit(cache=True, nogil=True)
def _fit_index(times, k, count, window):  # pragma: no cover - compiled
    """Index of the slowest of table k's choices fitting ``window`` (−1 if none): ``_node_cost``'s search."""
    x = window * (1 + TOL) + 1e-15
    lo, hi = 0, count
    while lo < hi:
        mid = (lo + hi) >> 1
        if times[k, mid] <= x:
            lo = mid + 1
        else:
            hi = mid
    return lo - 1


@njit(cache=True, nogil=True)
def _move_cost(delta, a0, num_aff, aff, level, reach, sign, table, times, costs, counts):  # pragma: no cover - compiled
    """Σ cost of the move's affected nodes (in their order) when its block shifts by ``delta``."""
    cost = 0.0
    for p in range(num_aff):
        y = aff[a0 + p]
        cost += _node_cost(times, costs, table[y], counts[table[y]], _window(level[p], reach[p], sign[p], delta))
    return cost


@njit(cache=True, nogil=True)
def _best_shift(m, starts, deadline, block_ptr, block, aff_ptr, aff, term_ptr, term_pos, term_succ, term_slope, table, times,
                costs, counts, level, reach, sign, index, head):  # pragma: no cover - compiled
    """(least cost, its shift, cost at no shift) of move m on one row: the exact minimum of
    ``PotentialDescent._apply``'s 1-D problem, found on far fewer candidate shifts.

    Each affected node's window is min(level, reach + sign·δ): the least of its terms, whose
    slopes share one sign (−1 in the block, +1 for a predecessor outside it). The block's cost
    is then non-decreasing in δ and the predecessors' non-increasing, so the minimum is at the
    left end of a plateau of the predecessors' cost: the lower end of the feasible range, or a
    δ where a predecessor's window is exactly one of its choice times. Ties go to the smallest
    δ (measured: lower energy after the sweeps than the numpy descent's enumeration order).
    Without predecessors outside the block, the cost only rises with δ: the lower end wins.
    """
    a0, a1 = aff_ptr[m], aff_ptr[m + 1]
    num_aff = a1 - a0
    for p in range(num_aff):
        level[p] = np.inf
        reach[p] = np.inf
        sign[p] = 0
    for t in range(term_ptr[m], term_ptr[m + 1]):
        p = term_pos[t]
        right = deadline if term_succ[t] == DEADLINE else starts[term_succ[t]]
        base = right - starts[aff[a0 + p]]
        if term_slope[t] == 0:
            level[p] = min(level[p], base)
        else:
            reach[p] = min(reach[p], base)
            sign[p] = term_slope[t]
    current = _move_cost(0.0, a0, num_aff, aff, level, reach, sign, table, times, costs, counts)
    min_start = np.inf
    for b in range(block_ptr[m], block_ptr[m + 1]):
        min_start = min(min_start, starts[block[b]])
    low, high = -min_start, np.inf  # starts stay non-negative; windows stay ≥ the fastest choice
    for p in range(num_aff):
        fastest = times[table[aff[a0 + p]], 0]
        if sign[p] > 0:
            low = max(low, fastest - reach[p])
        elif sign[p] < 0:
            high = min(high, reach[p] - fastest)
    best, best_delta = current, 0.0
    if not low <= high:
        return best, best_delta, current
    # Candidates in increasing δ: the lower end, then the predecessors' breakpoints (a merge of
    # their ascending choice lists). Each node's fitting choice then only moves one way (down in
    # the block, up outside it), so it is followed by a pointer instead of a search per candidate.
    least_outside = 0.0  # the predecessors' cost at the upper end: their least
    for p in range(num_aff):
        y = aff[a0 + p]
        k = table[y]
        index[p] = _fit_index(times, k, counts[k], _window(level[p], reach[p], sign[p], low))
        head[p] = counts[k]  # next breakpoint (choice) of a predecessor; counts[k]: none left
        if sign[p] > 0:
            least_outside += _node_cost(times, costs, k, counts[k], _window(level[p], reach[p], sign[p], high))
            cap = level[p] * (1 + TOL) + 1e-15  # choices that still fit the node's fixed terms
            lo, hi = 0, counts[k]  # first choice whose breakpoint lies above the lower end
            while lo < hi:
                mid = (lo + hi) >> 1
                if times[k, mid] - reach[p] <= low:
                    lo = mid + 1
                else:
                    hi = mid
            head[p] = lo if lo < counts[k] and times[k, lo] <= cap else counts[k]
    delta = low
    while True:
        cost = 0.0
        rising = 0.0
        for p in range(num_aff):
            y = aff[a0 + p]
            k = table[y]
            if sign[p] != 0:
                x = _window(level[p], reach[p], sign[p], delta) * (1 + TOL) + 1e-15
                if sign[p] < 0:
                    while index[p] >= 0 and times[k, index[p]] > x:
                        index[p] -= 1
                else:
                    while index[p] + 1 < counts[k] and times[k, index[p] + 1] <= x:
                        index[p] += 1
            c = costs[k, index[p]] if index[p] >= 0 else np.inf
            cost += c
            if sign[p] <= 0:
                rising += c
        if cost < best or (cost == best and delta < best_delta):
            best, best_delta = cost, delta
        if rising + least_outside >= best:
            break  # the block's part only rises from here, the rest cannot fall below its least
        nearest = -1
        delta_next = np.inf
        for p in range(num_aff):
            k = table[aff[a0 + p]]
            if head[p] < counts[k] and (nearest < 0 or times[k, head[p]] - reach[p] < delta_next):
                nearest = p
                delta_next = times[k, head[p]] - reach[p]
        if nearest < 0 or delta_next > high:
            break
        k = table[aff[a0 + nearest]]
        head[nearest] += 1
        if head[nearest] < counts[k] and times[k, head[nearest]] > level[nearest] * (1 + TOL) + 1e-15:
            head[nearest] = counts[k]
        delta = delta_next
    return best, best_delta, current


@njit(cache=True, nogil=True)
def _apply_row(m, starts, deadline, block_ptr, block, aff_ptr, aff, term_ptr, term_pos, term_succ, term_slope, table,
               times, costs, counts, level, reach, sign, index, head):  # pragma: no cover - compiled
    """Best shift of move m applied to one row in place when it saves more than 1e-9; True then."""
    best, delta, current = _best_shift(m, starts, deadline, block_ptr, block, aff_ptr, aff, term_ptr, term_pos, term_succ,
                                       term_slope, table, times, costs, counts, level, reach, sign, index, head)
    if best < current - 1e-9:
        for b in range(block_ptr[m], block_ptr[m + 1]):
            starts[block[b]] += delta
        return True
    return False


@njit(cache=True, nogil=True)
def _improve(starts, deadlines, sweeps, block_ptr, block, aff_ptr, aff, term_ptr, term_pos, term_succ, term_slope, read_ptr,
             read, table, times, costs, counts, max_aff):  # pragma: no cover - compiled
    """``PotentialDescent.improve`` per row: sweeps alternate the move order; a row stops after a
    sweep that changed nothing. ``starts`` is updated in place.

    A move is a function of the starts it reads (``read``: its affected nodes and their
    successors), so one that found nothing is skipped until one of those starts has moved:
    the same result as evaluating it again, at a fraction of the work after the first sweep.
    """
    num_moves = block_ptr.shape[0] - 1
    level = np.empty(max_aff)
    reach = np.empty(max_aff)
    sign = np.zeros(max_aff, dtype=np.int64)
    index = np.zeros(max_aff, dtype=np.int64)
    head = np.zeros(max_aff, dtype=np.int64)
    moved_at = np.empty(starts.shape[1], dtype=np.int64)
    seen_at = np.empty(num_moves, dtype=np.int64)
    for r in range(starts.shape[0]):
        row = starts[r]
        moved_at[:] = -1
        seen_at[:] = -1
        step = 0
        for sweep in range(sweeps):
            changed = False
            for i in range(num_moves):
                m = i if sweep % 2 == 0 else num_moves - 1 - i
                step += 1
                if seen_at[m] >= 0:
                    stale = False
                    for k in range(read_ptr[m], read_ptr[m + 1]):
                        if moved_at[read[k]] >= seen_at[m]:
                            stale = True
                            break
                    if not stale:
                        continue
                seen_at[m] = step
                if _apply_row(m, row, deadlines[r], block_ptr, block, aff_ptr, aff, term_ptr, term_pos, term_succ, term_slope,
                              table, times, costs, counts, level, reach, sign, index, head):
                    changed = True
                    for b in range(block_ptr[m], block_ptr[m + 1]):
                        moved_at[block[b]] = step
            if not changed:
                break


@njit(cache=True, nogil=True)
def _plan(starts, deadlines, succ_ptr, succ_idx, table, times, counts, out):  # pragma: no cover - compiled
    """``PotentialDescent.plan``: per node the slowest choice fitting its window (index ≥ 0)."""
    for r in range(starts.shape[0]):
        for v in range(starts.shape[1]):
            if succ_ptr[v] == succ_ptr[v + 1]:
                right = deadlines[r]
            else:
                right = np.inf
                for k in range(succ_ptr[v], succ_ptr[v + 1]):
                    right = min(right, starts[r, succ_idx[k]])
            x = (right - starts[r, v]) * (1 + TOL) + 1e-15
            lo, hi = 0, counts[table[v]]
            while lo < hi:
                mid = (lo + hi) >> 1
                if times[table[v], mid] <= x:
                    lo = mid + 1
                else:
                    hi = mid
            out[r, v] = max(lo - 1, 0)


class CompiledDescent(PotentialDescent):
    """``PotentialDescent`` with ``improve`` and ``plan`` compiled; same moves, same results.

    ``improve`` has no clock: each row runs at most ``sweeps`` sweeps (the work budget).
    """

    def __init__(self, dag: InstructionDAG, node_choices: NodeChoices, max_block: int = 3, neighbour_sets: bool = False) -> None:
        super().__init__(dag, node_choices, max_block=max_block, neighbour_sets=neighbour_sets)
        moves = self.moves
        self._block_ptr = np.concatenate([[0], np.cumsum([len(mv.block) for mv in moves])]).astype(np.int64)
        self._block = np.concatenate([mv.block for mv in moves]).astype(np.int64)
        self._aff_ptr = np.concatenate([[0], np.cumsum([len(mv.affected) for mv in moves])]).astype(np.int64)
        self._aff = np.array([y for mv in moves for y in mv.affected], dtype=np.int64)
        self._term_ptr = np.concatenate([[0], np.cumsum([len(mv.terms) for mv in moves])]).astype(np.int64)
        terms = [term for mv in moves for term in mv.terms]
        self._term_pos = np.array([term.node_pos for term in terms], dtype=np.int64)
        self._term_succ = np.array([term.succ for term in terms], dtype=np.int64)
        self._term_slope = np.array([term.slope for term in terms], dtype=np.int64)
        self._max_aff = int(np.diff(self._aff_ptr).max(initial=1))
        reads = [sorted(set(mv.affected) | {t.succ for t in mv.terms if t.succ != DEADLINE}) for mv in moves]
        self._read_ptr = np.concatenate([[0], np.cumsum([len(x) for x in reads])]).astype(np.int64)
        self._read = np.array([v for x in reads for v in x], dtype=np.int64)
        self._table = np.ascontiguousarray(node_choices.node_table, dtype=np.int64)
        self._times = np.ascontiguousarray(node_choices.times, dtype=float)
        self._costs = np.ascontiguousarray(node_choices.costs, dtype=float)
        self._counts = np.ascontiguousarray(node_choices.num_choices, dtype=np.int64)
        counts = np.array([len(s) for s in self.succs], dtype=np.int64)
        self._succ_ptr = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
        self._succ_idx = np.array([w for s in self.succs for w in s], dtype=np.int64)

    def improve(self, starts: np.ndarray, deadlines: np.ndarray, sweeps: int = 3, time_limit_s: float = float("inf")) -> np.ndarray:
        """Improving block shifts until a sweep changes nothing or ``sweeps`` sweeps, per row
        (``time_limit_s`` is ignored: the sweeps bound the work)."""
        starts = np.array(starts, dtype=float, order="C")
        deadlines = np.ascontiguousarray(np.broadcast_to(np.asarray(deadlines, dtype=float), (starts.shape[0],)))
        _improve(starts, deadlines, int(sweeps), self._block_ptr, self._block, self._aff_ptr, self._aff, self._term_ptr,
                 self._term_pos, self._term_succ, self._term_slope, self._read_ptr, self._read, self._table, self._times,
                 self._costs, self._counts, self._max_aff)
        return starts

    def plan(self, starts: np.ndarray, deadlines: np.ndarray) -> np.ndarray:
        starts = np.ascontiguousarray(starts, dtype=float)
        deadlines = np.ascontiguousarray(np.broadcast_to(np.asarray(deadlines, dtype=float), (starts.shape[0],)))
        out = np.empty(starts.shape, dtype=np.int64)
        _plan(starts, deadlines, self._succ_ptr, self._succ_idx, self._table, self._times, self._counts, out)
        return out


__all__ = ["CompiledDescent"]
