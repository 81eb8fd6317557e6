"""Primal network simplex for a min-cost circulation, warm-started when one arc's cost changes.

Why a network simplex: the hull LP's dual is a min-cost circulation (``planner.flow_lp``), and
between two deadlines only the cost of the return arc changes, so the previous optimal spanning
tree stays feasible and a few thousand cheap pivots re-optimise it. A general simplex (HiGHS)
needs the same pivots at ~100 µs each on a 16-stage pipeline; here each is a walk up two tree
paths and a re-hang of one subtree, compiled by numba.

Integer data (costs, capacities) keep every reduced cost exact, so the optimality test needs no
tolerance. The tree is kept *strongly feasible* (every tree path from the root can carry more
flow downwards; the leaving arc is the first blocking arc met along the cycle from its apex),
which rules out cycling on the many degenerate pivots of this problem.

Tree arrays per node: ``parent`` (−1 at the root), ``pred`` (the arc to the parent), ``up``
(1 when that arc points from the node to its parent), ``size`` (of its subtree), ``pi`` (potential: every tree
arc has reduced cost ``cost + pi[tail] − pi[head]`` = 0), and children as doubly linked sibling
lists (``first_child``, ``next_sib``, ``prev_sib``). Arc ``state``: 0 in the tree, 1 at its lower
bound (no flow), −1 at its upper bound (``flow == cap``).
"""

from __future__ import annotations

import numpy as np
from numba import njit

TREE, AT_LOWER, AT_UPPER = 0, 1, -1


@njit(cache=True, nogil=True)
def refresh_tree(root, tail, head, cost, parent, pred, up, size, pi, first_child, next_sib, stack, order):  # pragma: no cover - compiled
    """Recompute ``up``, ``pi`` (0 at the root) and subtree ``size`` of every node from the tree arcs."""
    pi[root] = 0
    top = 0
    stack[0] = root
    count = 0
    while top >= 0:
        y = stack[top]
        top -= 1
        order[count] = y
        count += 1
        size[y] = 1
        if y != root:
            a = pred[y]
            if tail[a] == y:
                up[y] = 1
                pi[y] = pi[head[a]] - cost[a]
            else:
                up[y] = 0
                pi[y] = pi[tail[a]] + cost[a]
        c = first_child[y]
        while c != -1:
            top += 1
            stack[top] = c
            c = next_sib[c]
    for k in range(count - 1, 0, -1):
        y = order[k]
        size[parent[y]] += size[y]


@njit(cache=True, nogil=True)
def _shift(start, skip, delta, pi, first_child, next_sib, stack):  # pragma: no cover - compiled
    """Add ``delta`` to the potential of every node below ``start`` except the subtree of ``skip``."""
    top = 0
    stack[0] = start
    while top >= 0:
        y = stack[top]
        top -= 1
        pi[y] += delta
        c = first_child[y]
        while c != -1:
            if c != skip:
                top += 1
                stack[top] = c
            c = next_sib[c]


@njit(cache=True, nogil=True)
def _push(start, apex, delta, flow, pred, up, parent):  # pragma: no cover - compiled
    """Push ``delta`` up the tree path start → apex (negative: down it)."""
    x = start
    while x != apex:
        flow[pred[x]] += delta if up[x] else -delta
        x = parent[x]


@njit(cache=True, nogil=True)
def pivot(tail, head, cap, cost, flow, state, parent, pred, up, size, pi, first_child, next_sib, prev_sib, stack,
          root, block, next_arc, max_pivots):  # pragma: no cover - compiled
    """Pivot until no arc has a negative reduced cost in its free direction (optimal) or
    ``max_pivots`` pivots were made. Returns (pivots made, where the next arc search starts,
    1 if optimal else 0)."""
    m = tail.shape[0]
    num_nodes = parent.shape[0]
    big = np.iinfo(np.int64).max
    pivots = 0
    while pivots < max_pivots:
        # Entering arc: the most violating arc of the first block (of ``block`` arcs, scanned
        # cyclically from where the last search stopped) that has any violating arc.
        best = 0
        e = -1
        scanned = 0
        in_block = 0
        a = next_arc
        while scanned < m:
            s = state[a]
            if s != 0:
                v = s * (cost[a] + pi[tail[a]] - pi[head[a]])
                if v < best:
                    best = v
                    e = a
            a += 1
            if a == m:
                a = 0
            scanned += 1
            in_block += 1
            if in_block == block:
                if e >= 0:
                    break
                in_block = 0
        if e < 0:
            return pivots, next_arc, 1
        next_arc = a
        pivots += 1
        # Flow is pushed along e (tail → head at its lower bound, head → tail at its upper),
        # then from `first` up to the apex and down to `second`. The apex (nearest common
        # ancestor) is found by climbing from the side with the smaller subtree.
        if state[e] == AT_LOWER:
            first, second = head[e], tail[e]
        else:
            first, second = tail[e], head[e]
        # Climb from the side with the smaller subtree until both meet at the apex (nearest common
        # ancestor), collecting each side's blocking arc on the way: on side A (first → apex, flow
        # goes up) the one nearest `first`, on side B (apex → second, flow goes down) the one
        # nearest the apex.
        x, y = first, second
        delta_a = big
        leave_a = -1
        delta_b = big
        leave_b = -1
        while x != y:
            if size[x] <= size[y]:
                b = pred[x]
                r = cap[b] - flow[b] if up[x] else flow[b]
                if r < delta_a:
                    delta_a = r
                    leave_a = x
                x = parent[x]
            else:
                b = pred[y]
                r = flow[b] if up[y] else cap[b] - flow[b]
                if r <= delta_b:
                    delta_b = r
                    leave_b = y
                y = parent[y]
        apex = x
        delta = min(delta_a, delta_b, cap[e])
        if delta > 0:
            flow[e] += delta if state[e] == AT_LOWER else -delta
        if delta_b == delta:
            q, j, i, j_up = leave_b, second, first, -delta  # j's side is B
        elif cap[e] == delta:
            if delta > 0:
                _push(first, apex, delta, flow, pred, up, parent)
                _push(second, apex, -delta, flow, pred, up, parent)
            state[e] = -state[e]  # e jumps to its other bound; the tree is unchanged
            continue
        else:
            q, j, i, j_up = leave_a, first, second, delta
        leaving = pred[q]
        moved = size[q]
        # One walk per side: push the flow, and update subtree sizes (only nodes below the apex
        # change: q's subtree moves from below its old parent to below i, and the path j → q is
        # reversed inside it, where old sizes telescope: new size = moved − old size below).
        below = 0
        passed = False
        x = j
        while x != apex:
            if delta > 0:
                flow[pred[x]] += j_up if up[x] else -j_up
            if passed:
                size[x] -= moved
            else:
                old = size[x]
                size[x] = moved - below
                below = old
                passed = x == q
            x = parent[x]
        y = i
        while y != apex:
            if delta > 0:
                flow[pred[y]] += -j_up if up[y] else j_up
            size[y] += moved
            y = parent[y]
        state[leaving] = AT_LOWER if flow[leaving] == 0 else AT_UPPER
        state[e] = TREE
        reduced = cost[e] + pi[tail[e]] - pi[head[e]]
        # Re-hang the subtree of q below i through e: reverse the tree path j → q.
        x = j
        new_parent = i
        new_pred = e
        while True:
            old_parent = parent[x]
            old_pred = pred[x]
            ps = prev_sib[x]
            ns = next_sib[x]
            if ps != -1:
                next_sib[ps] = ns
            else:
                first_child[old_parent] = ns
            if ns != -1:
                prev_sib[ns] = ps
            parent[x] = new_parent
            pred[x] = new_pred
            up[x] = 1 if tail[new_pred] == x else 0
            f = first_child[new_parent]
            next_sib[x] = f
            prev_sib[x] = -1
            if f != -1:
                prev_sib[f] = x
            first_child[new_parent] = x
            if x == q:
                break
            new_parent = x
            new_pred = old_pred
            x = old_parent
        # Potentials: e's reduced cost becomes 0 by shifting one side of it, whichever is smaller.
        shift = -reduced if tail[e] == j else reduced
        if 2 * moved <= num_nodes:
            _shift(j, -1, shift, pi, first_child, next_sib, stack)
        else:
            _shift(root, j, -shift, pi, first_child, next_sib, stack)
    return pivots, next_arc, 0


class NetworkSimplex:
    """A min-cost circulation on fixed arcs, started from a given feasible spanning tree.

    ``parent_arc[v]`` is the tree arc joining node v to its parent (−1 at the root); every arc
    starts with zero flow, so the tree must be strongly feasible for that flow (tree arcs point
    away from the root, all with positive capacity). ``set_cost`` then ``solve`` re-optimises from
    the last optimal tree.
    """

    def __init__(self, tail: np.ndarray, head: np.ndarray, cap: np.ndarray, cost: np.ndarray, root: int,
                 parent_arc: np.ndarray) -> None:
        n = len(parent_arc)
        # int32 node and arc ids: half the memory traffic of the tree walks.
        self.tail = np.ascontiguousarray(tail, dtype=np.int32)
        self.head = np.ascontiguousarray(head, dtype=np.int32)
        self.cap = np.ascontiguousarray(cap, dtype=np.int64)
        self.cost = np.array(cost, dtype=np.int64)
        m = len(self.tail)
        self.flow = np.zeros(m, dtype=np.int64)
        self.state = np.full(m, AT_LOWER, dtype=np.int8)
        tree = parent_arc >= 0
        self.state[parent_arc[tree]] = TREE
        self.pred = np.where(tree, parent_arc, -1).astype(np.int32)
        self.parent = np.full(n, -1, dtype=np.int32)
        arcs = parent_arc[tree]
        nodes = np.flatnonzero(tree)
        self.parent[nodes] = np.where(self.tail[arcs] == nodes, self.head[arcs], self.tail[arcs])
        self.root = int(root)
        self.up = np.zeros(n, dtype=np.int8)
        self.size = np.zeros(n, dtype=np.int32)
        self.pi = np.zeros(n, dtype=np.int64)
        self.first_child = np.full(n, -1, dtype=np.int32)
        self.next_sib = np.full(n, -1, dtype=np.int32)
        self.prev_sib = np.full(n, -1, dtype=np.int32)
        for v in nodes[::-1].tolist():  # sibling lists (any order)
            p = self.parent[v]
            f = self.first_child[p]
            self.next_sib[v] = f
            if f != -1:
                self.prev_sib[f] = v
            self.first_child[p] = v
        self._stack = np.empty(n, dtype=np.int32)
        self._order = np.empty(n, dtype=np.int32)
        self._block = max(int(np.sqrt(m)), 10)
        self._next_arc = 0
        self.pivots = 0
        self._refresh()

    def _refresh(self) -> None:
        refresh_tree(self.root, self.tail, self.head, self.cost, self.parent, self.pred, self.up, self.size, self.pi,
                     self.first_child, self.next_sib, self._stack, self._order)

    def set_cost(self, arc: int, cost: int) -> None:
        """Change one arc's cost; the tree stays feasible, its potentials are recomputed."""
        self.cost[arc] = cost
        self._refresh()

    def solve(self, max_pivots: int = 1 << 62) -> bool:
        """Pivot to optimality (True) or until ``max_pivots`` (False)."""
        done, self._next_arc, optimal = pivot(
            self.tail, self.head, self.cap, self.cost, self.flow, self.state, self.parent, self.pred, self.up,
            self.size, self.pi, self.first_child, self.next_sib, self.prev_sib, self._stack, self.root, self._block,
            self._next_arc, max_pivots)
        self.pivots += done
        return bool(optimal)


__all__ = ["NetworkSimplex"]
