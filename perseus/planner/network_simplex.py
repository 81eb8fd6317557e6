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
arc has reduced cost ``cost + pi[tail] − pi[head]`` = 0), ``room_up`` and ``pred_cap`` (how much
more flow the arc to the parent can carry from the node upwards, and its capacity: the tree walks
read node-indexed memory only), and children as doubly linked sibling lists (``first_child``,
``next_sib``, ``prev_sib``). Arc ``state``: 0 in the tree, 1 at its lower bound (no flow), −1 at
its upper bound (``flow == cap``); ``flow`` of tree arcs is written back after each solve.

Pricing works on *groups*: runs of consecutive parallel arcs (same tail and head) with
non-decreasing costs, e.g. one instruction's hull pieces. Their reduced costs then rise along the
group, so its most violating arc is either its first arc at the lower bound or its last at the
upper bound; each group keeps those two (``lo_arc``, ``hi_arc`` and their costs) and is priced
in O(1) (a ninth of the arcs' scan at 16 × 4 × 128 interleaved).
"""

from __future__ import annotations

import numpy as np
from numba import njit

TREE, AT_LOWER, AT_UPPER = 0, 1, -1
_NONE_COST = 1 << 62  # cost of a missing lo/hi arc: never violating


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
def _regroup(g, group_ptr, state, cost, lo_arc, hi_arc, lo_cost, hi_cost):  # pragma: no cover - compiled
    """Refresh group g's first arc at its lower bound and last arc at its upper bound."""
    lo_arc[g] = -1
    hi_arc[g] = -1
    lo_cost[g] = _NONE_COST
    hi_cost[g] = -_NONE_COST
    for a in range(group_ptr[g], group_ptr[g + 1]):
        if state[a] == AT_LOWER and lo_arc[g] < 0:
            lo_arc[g] = a
            lo_cost[g] = cost[a]
        elif state[a] == AT_UPPER:
            hi_arc[g] = a
            hi_cost[g] = cost[a]


@njit(cache=True, nogil=True)
def regroup_all(group_ptr, state, cost, lo_arc, hi_arc, lo_cost, hi_cost):  # pragma: no cover - compiled
    for g in range(group_ptr.shape[0] - 1):
        _regroup(g, group_ptr, state, cost, lo_arc, hi_arc, lo_cost, hi_cost)


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
def pivot(tail, head, cap, cost, flow, state, group_of, group_ptr, group_tail, group_head, lo_arc, hi_arc, lo_cost,
          hi_cost, parent, pred, up, size, pi, room_up, pred_cap, first_child, next_sib, prev_sib, stack, path_a, path_b,
          root, block, next_group, max_pivots):  # pragma: no cover - compiled
    """Pivot until no arc has a negative reduced cost in its free direction (optimal) or
    ``max_pivots`` pivots were made. Returns (pivots made, where the next group search starts,
    1 if optimal else 0)."""
    num_groups = group_tail.shape[0]
    num_nodes = parent.shape[0]
    big = np.iinfo(np.int64).max
    pivots = 0
    while pivots < max_pivots:
        # Entering arc: the most violating arc of the first block (of ``block`` groups, scanned
        # cyclically from where the last search stopped) that has any violating arc.
        best = 0
        e = -1
        scanned = 0
        in_block = 0
        g = next_group
        while scanned < num_groups:
            d = pi[group_tail[g]] - pi[group_head[g]]
            v = lo_cost[g] + d  # reduced cost of the first arc at its lower bound: < 0 violates
            if v < best:
                best = v
                e = lo_arc[g]
            v = -(hi_cost[g] + d)  # of the last arc at its upper bound: > 0 violates
            if v < best:
                best = v
                e = hi_arc[g]
            g += 1
            if g == num_groups:
                g = 0
            scanned += 1
            in_block += 1
            if in_block == block:
                if e >= 0:
                    break
                in_block = 0
        if e < 0:
            return pivots, next_group, 1
        next_group = g
        pivots += 1
        # Flow is pushed along e (tail → head at its lower bound, head → tail at its upper),
        # then from `first` up to the apex and down to `second`. The apex (nearest common
        # ancestor) is found by climbing from the side with the smaller subtree, recording both
        # paths and each side's blocking node on the way: on side A (first → apex, flow goes up)
        # the one nearest `first`, on side B (apex → second, flow goes down) the one nearest the apex.
        if state[e] == AT_LOWER:
            first, second = head[e], tail[e]
        else:
            first, second = tail[e], head[e]
        x, y = first, second
        delta_a = big
        leave_a = -1
        delta_b = big
        leave_b = -1
        len_a = 0
        len_b = 0
        while x != y:
            if size[x] <= size[y]:
                r = room_up[x]
                if r < delta_a:
                    delta_a = r
                    leave_a = len_a
                path_a[len_a] = x
                len_a += 1
                x = parent[x]
            else:
                r = pred_cap[y] - room_up[y]
                if r <= delta_b:
                    delta_b = r
                    leave_b = len_b
                path_b[len_b] = y
                len_b += 1
                y = parent[y]
        delta = min(delta_a, delta_b, cap[e])
        entering_flow = flow[e] + (delta if state[e] == AT_LOWER else -delta)
        if delta_b == delta:
            # j's side is B: its path carries flow down (room_up grows), i's side (A) up.
            q_at, j_path, len_j, i_path, len_i, i, j_up = leave_b, path_b, len_b, path_a, len_a, first, -delta
        elif cap[e] == delta:
            for k in range(len_a):
                room_up[path_a[k]] -= delta
            for k in range(len_b):
                room_up[path_b[k]] += delta
            flow[e] = entering_flow
            state[e] = -state[e]  # e jumps to its other bound; the tree is unchanged
            _regroup(group_of[e], group_ptr, state, cost, lo_arc, hi_arc, lo_cost, hi_cost)
            continue
        else:
            q_at, j_path, len_j, i_path, len_i, i, j_up = leave_a, path_a, len_a, path_b, len_b, second, delta
        q = j_path[q_at]
        moved = size[q]
        # One pass per recorded side: push the flow, and update subtree sizes (only nodes below
        # the apex change: q's subtree moves from below its old parent to below i, and the path
        # j → q is reversed inside it, where old sizes telescope: new size = moved − old size below).
        below = 0
        for k in range(len_j):
            x = j_path[k]
            room_up[x] -= j_up
            if k > q_at:
                size[x] -= moved
            else:
                old = size[x]
                size[x] = moved - below
                below = old
        for k in range(len_i):
            y = i_path[k]
            room_up[y] += j_up
            size[y] += moved
        leaving = pred[q]
        leaving_flow = pred_cap[q] - room_up[q] if up[q] else room_up[q]
        flow[leaving] = leaving_flow
        state[leaving] = AT_LOWER if leaving_flow == 0 else AT_UPPER
        state[e] = TREE
        _regroup(group_of[leaving], group_ptr, state, cost, lo_arc, hi_arc, lo_cost, hi_cost)
        if group_of[e] != group_of[leaving]:
            _regroup(group_of[e], group_ptr, state, cost, lo_arc, hi_arc, lo_cost, hi_cost)
        reduced = cost[e] + pi[tail[e]] - pi[head[e]]
        # Re-hang the subtree of q below i through e: reverse the tree path j → q, each node
        # taking over the arc (and its flow) that joined its child on the path.
        new_parent = i
        new_pred = e
        new_flow = entering_flow
        for k in range(q_at + 1):
            x = j_path[k]
            old_parent = parent[x]
            old_pred = pred[x]
            old_flow = pred_cap[x] - room_up[x] if up[x] else room_up[x]
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
            pred_cap[x] = cap[new_pred]
            if tail[new_pred] == x:
                up[x] = 1
                room_up[x] = cap[new_pred] - new_flow
            else:
                up[x] = 0
                room_up[x] = new_flow
            f = first_child[new_parent]
            next_sib[x] = f
            prev_sib[x] = -1
            if f != -1:
                prev_sib[f] = x
            first_child[new_parent] = x
            new_parent = x
            new_pred = old_pred
            new_flow = old_flow
        j = j_path[0]
        # Potentials: e's reduced cost becomes 0 by shifting one side of it, whichever is smaller.
        shift = -reduced if tail[e] == j else reduced
        if 2 * moved <= num_nodes:
            _shift(j, -1, shift, pi, first_child, next_sib, stack)
        else:
            _shift(root, j, -shift, pi, first_child, next_sib, stack)
    return pivots, next_group, 0


class NetworkSimplex:
    """A min-cost circulation on fixed arcs, started from a given feasible spanning tree.

    ``parent_arc[v]`` is the tree arc joining node v to its parent (−1 at the root); every arc
    starts with zero flow, so the tree must be strongly feasible for that flow (tree arcs point
    away from the root, all with positive capacity). ``set_cost`` then ``solve`` re-optimises from
    the last optimal tree. Consecutive parallel arcs with non-decreasing costs are priced as one
    group (list an instruction's hull pieces together, cheapest first).
    """

    def __init__(self, tail: np.ndarray, head: np.ndarray, cap: np.ndarray, cost: np.ndarray, root: int,
                 parent_arc: np.ndarray, block: int | None = None) -> None:
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
        self._path_a = np.empty(n, dtype=np.int32)
        self._path_b = np.empty(n, dtype=np.int32)
        self._refresh()
        # Tree arcs carry zero flow at the start: the room upwards is the capacity where the arc points up.
        self.pred_cap = np.zeros(n, dtype=np.int64)
        self.pred_cap[nodes] = self.cap[arcs]
        self.room_up = np.where(self.up == 1, self.pred_cap, 0).astype(np.int64)
        # Groups: maximal runs of consecutive arcs with the same ends and non-decreasing costs.
        new_group = np.ones(m, dtype=bool)
        new_group[1:] = (self.tail[1:] != self.tail[:-1]) | (self.head[1:] != self.head[:-1]) | (self.cost[1:] < self.cost[:-1])
        starts = np.flatnonzero(new_group)
        self._group_ptr = np.append(starts, m).astype(np.int64)
        self._group_of = (np.cumsum(new_group) - 1).astype(np.int32)
        self._group_tail = self.tail[starts].copy()
        self._group_head = self.head[starts].copy()
        groups = len(starts)
        self._lo_arc = np.empty(groups, dtype=np.int32)
        self._hi_arc = np.empty(groups, dtype=np.int32)
        self._lo_cost = np.empty(groups, dtype=np.int64)
        self._hi_cost = np.empty(groups, dtype=np.int64)
        regroup_all(self._group_ptr, self.state, self.cost, self._lo_arc, self._hi_arc, self._lo_cost, self._hi_cost)
        self._block = max(int(np.sqrt(groups)), 10) if block is None else int(block)
        self._next_group = 0
        self.pivots = 0

    def _refresh(self) -> None:
        refresh_tree(self.root, self.tail, self.head, self.cost, self.parent, self.pred, self.up, self.size, self.pi,
                     self.first_child, self.next_sib, self._stack, self._order)

    def set_cost(self, arc: int, cost: int) -> None:
        """Change one arc's cost; the tree stays feasible, its potentials are recomputed."""
        self.cost[arc] = cost
        g = int(self._group_of[arc])
        if (g > 0 and self._group_of[arc - 1] == g and self.cost[arc - 1] > cost) or (
                arc + 1 < len(self.cost) and self._group_of[arc + 1] == g and self.cost[arc + 1] < cost):
            raise ValueError(f"arc {arc}: a cost change may not reorder its group of parallel arcs")
        _regroup(g, self._group_ptr, self.state, self.cost, self._lo_arc, self._hi_arc, self._lo_cost, self._hi_cost)
        self._refresh()

    def solve(self, max_pivots: int = 1 << 62) -> bool:
        """Pivot to optimality (True) or until ``max_pivots`` (False); ``flow`` is then current."""
        done, self._next_group, optimal = pivot(
            self.tail, self.head, self.cap, self.cost, self.flow, self.state, self._group_of, self._group_ptr,
            self._group_tail, self._group_head, self._lo_arc, self._hi_arc, self._lo_cost, self._hi_cost, self.parent,
            self.pred, self.up, self.size, self.pi, self.room_up, self.pred_cap, self.first_child, self.next_sib,
            self.prev_sib, self._stack, self._path_a, self._path_b, self.root, self._block, self._next_group, max_pivots)
        self.pivots += done
        # Tree arcs' flows live on their nodes during the pivots: write them back.
        nodes = np.flatnonzero(self.parent >= 0)
        self.flow[self.pred[nodes]] = np.where(self.up[nodes] == 1, self.pred_cap[nodes] - self.room_up[nodes],
                                               self.room_up[nodes])
        return bool(optimal)


__all__ = ["NetworkSimplex"]
