"""The hull LP solved through its dual, a min-cost circulation (large pipelines).

Why: the hull LP (``planner.relaxation``) is the linear time–cost tradeoff problem. Its dual
sends flow around the instruction DAG: instruction v is a bundle of parallel arcs start→finish,
one per hull vertex k with profit t_k (its duration) and capacity = the drop in the hull's
slope magnitude there, plus an uncapacitated arc at the fastest duration; precedence edges are
free uncapacitated arcs; a return arc sink→source costs the deadline T. Then

    LP(T) = Σ_v c_v(slowest) + max over circulations x of (Σ profit·x − T·F),  F = return flow,

the optimal potentials are the start/finish times of an optimal LP schedule, and the flow on a
precedence edge is its dual price (``edge_flows``, what the beam search reads). Between
deadlines only the return arc's cost changes, so a network simplex (``planner.network_simplex``)
re-optimises from the last tree in a fraction of HiGHS's time (16 × 128 1F1B: docs/planner.md).

Integer data: times in ns (hull durations rounded up, the deadline down, so the recovered
schedule is feasible in seconds), capacities in µW (rounded down, so the flow is feasible for
the exact data). The value reported is the dual objective of that flow on the exact (float)
data: a valid lower bound on every discrete plan, within ~1e-6 of the LP optimum.
"""

from __future__ import annotations

import numpy as np

from perseus.schedules.dag import InstructionDAG
from perseus.planner.choices import NodeChoices
from perseus.planner.network_simplex import NetworkSimplex

_NS = 1e9  # cost unit: 1 ns
_UW = 1e6  # capacity unit: 1 µW


class FlowRelaxation:
    """Hull LP by network simplex on its dual circulation; same reads as ``HullRelaxation``.

    Solves are fastest in decreasing-deadline order (each starts from the previous tree; the
    first from the all-slowest plan's critical-path tree, optimal at the slowest deadline).
    """

    def __init__(self, dag: InstructionDAG, node_choices: NodeChoices) -> None:
        n = dag.num_nodes
        self.num_nodes = n
        # Node ids by topological depth (source 0, then start/finish of each instruction, sink
        # last): tree walks then touch nearby memory (2× faster pivots at 16 × 4 × 128).
        rank = np.empty(n, dtype=np.int64)
        rank[np.argsort(dag.levels.depth, kind="stable")] = np.arange(n)
        start_id, finish_id = 1 + 2 * rank, 2 + 2 * rank
        self._start_id, self._finish_id = start_id, finish_id
        tails, heads, caps, profits, owners = [], [], [], [], []
        slow_cost = np.empty(n)
        fastest = np.empty(n)
        slowest = np.empty(n)
        for k, table in enumerate(node_choices.tables):
            nodes = np.flatnonzero(node_choices.node_table == k)
            ht, hc = table.times_s[table.hull], table.costs[table.hull]
            slope = -np.diff(hc) / np.diff(ht)  # μ_1 > … > μ_K > 0
            # Arc k (slowest first): profit t_K … t_1 with capacity μ_K, μ_{K−1} − μ_K, …; then t_0 uncapacitated.
            arc_cap = np.floor(np.concatenate([slope[-1:], (slope[:-1] - slope[1:])[::-1]]) * _UW)
            arc_prof = ht[::-1][: len(arc_cap)]
            keep = arc_cap > 0
            arc_cap = np.concatenate([arc_cap[keep], [-1.0]])  # −1: uncapacitated, set below
            arc_prof = np.concatenate([arc_prof[keep], ht[:1]])
            slow_cost[nodes], fastest[nodes], slowest[nodes] = hc[-1], ht[0], ht[-1]
            width = len(arc_cap)
            tails.append(np.repeat(start_id[nodes], width))
            heads.append(np.repeat(finish_id[nodes], width))
            caps.append(np.tile(arc_cap, len(nodes)))
            profits.append(np.tile(arc_prof, len(nodes)))
            owners.append(np.repeat(nodes, width))
        owner = np.concatenate(owners)
        order = np.argsort(rank[owner], kind="stable")  # each node's bundle contiguous, slowest arc first
        inst_tail, inst_head = np.concatenate(tails)[order], np.concatenate(heads)[order]
        inst_cap, self._profit = np.concatenate(caps)[order], np.concatenate(profits)[order]
        owner = owner[order]
        self._bundle_first = np.searchsorted(rank[owner], rank)
        self._num_inst_arcs = len(inst_cap)
        unbounded = int(inst_cap[inst_cap > 0].sum()) + 1  # no optimal flow exceeds all finite capacities
        inst_cap = np.where(inst_cap < 0, unbounded, inst_cap).astype(np.int64)
        source, sink = 0, 2 * n + 1
        has_pred = np.zeros(n, dtype=bool)
        has_pred[dag.edge_dst] = True
        has_succ = np.zeros(n, dtype=bool)
        has_succ[dag.edge_src] = True
        sources, sinks = np.flatnonzero(~has_pred), np.flatnonzero(~has_succ)
        self._edge_arcs = slice(self._num_inst_arcs, self._num_inst_arcs + len(dag.edge_src))
        self._edge_order = np.argsort(rank[dag.edge_src], kind="stable")  # arc order of the DAG's edges
        edge_src, edge_dst = dag.edge_src[self._edge_order], dag.edge_dst[self._edge_order]
        self._return_arc = self._num_inst_arcs + len(dag.edge_src) + len(sources) + len(sinks)
        tail = np.concatenate([inst_tail, finish_id[edge_src], np.full(len(sources), source), finish_id[sinks], [sink]])
        head = np.concatenate([inst_head, start_id[edge_dst], start_id[sources], np.full(len(sinks), sink), [source]])
        free = len(tail) - self._num_inst_arcs
        cap = np.concatenate([inst_cap, np.full(free, unbounded, dtype=np.int64)])
        cost = np.concatenate([-np.ceil(self._profit * _NS - 1e-6), np.zeros(free)]).astype(np.int64)
        self._fastest, self._slowest, self._slow_cost_sum = fastest, slowest, float(slow_cost.sum())

        # Starting tree: the critical-path tree of the plan at each node's slowest arc (optimal
        # for deadlines at or above that plan's length, where the flow is zero).
        slow_ns = -cost[self._bundle_first]
        fast_ns = -cost[self._bundle_first + np.bincount(owner, minlength=n) - 1]  # each bundle's last arc
        graph = dag.levels
        finish = graph.finish_times(slow_ns[None].astype(float))[0, :n]  # ns, exact in float64
        self._fast_limit_ns = int(graph.finish_times(fast_ns[None].astype(float))[0, :n].max())
        parent_arc = np.full(2 * n + 2, -1, dtype=np.int64)
        parent_arc[finish_id] = self._bundle_first
        edge_ids = np.arange(len(edge_src))  # positions among the edge arcs
        best = np.full(n, -1, dtype=np.int64)  # per node: the edge from its latest-finishing predecessor
        order = np.lexsort((finish[edge_src], edge_dst))
        last = np.flatnonzero(np.append(edge_dst[order][1:] != edge_dst[order][:-1], True))
        best[edge_dst[order][last]] = edge_ids[order][last]
        with_pred = best >= 0
        parent_arc[start_id[with_pred]] = self._num_inst_arcs + best[with_pred]
        parent_arc[start_id[sources]] = self._num_inst_arcs + len(dag.edge_src) + np.arange(len(sources))
        parent_arc[sink] = self._num_inst_arcs + len(dag.edge_src) + len(sources) + int(np.argmax(finish[sinks]))
        cost[self._return_arc] = int(finish.max())
        self._simplex = NetworkSimplex(tail, head, cap, cost, source, parent_arc)
        self._deadline_s = float(finish.max()) / _NS

    def solve(self, deadline_s: float) -> tuple[np.ndarray, float]:
        """(durations per node, LP lower bound on Σ effective cost) at a deadline ≥ the fastest time."""
        # At (or, by the deadline margin, just below) the fastest time every all-fastest critical
        # path is a zero-profit cycle and the flow could grow without bound, making the float
        # value of the bound loose; 1 ns above it the flow is finite (the LP slope there).
        limit = max(int(np.floor(deadline_s * _NS)), self._fast_limit_ns + 1)
        simplex = self._simplex
        simplex.set_cost(self._return_arc, limit)
        simplex.solve()
        self._deadline_s = float(deadline_s)
        pi = simplex.pi
        durations = (pi[self._start_id] - pi[self._finish_id]) / _NS  # finish − start, with times = −potentials
        durations = np.clip(durations, self._fastest, self._slowest)
        flow = simplex.flow
        value = self._slow_cost_sum + float(self._profit @ flow[: self._num_inst_arcs]) / _UW
        value -= deadline_s * flow[self._return_arc] / _UW
        return durations, value

    def deadline_slope(self) -> float:
        """d(LP value)/d(deadline) at the last solve (≤ 0): minus the circulating flow (W)."""
        return -float(self._simplex.flow[self._return_arc]) / _UW

    def edge_flows(self) -> np.ndarray:
        """Flow on every DAG edge (``dag.edge_src`` order) at the last solve, in W, ≥ 0."""
        flows = np.empty(self._edge_order.shape)
        flows[self._edge_order] = self._simplex.flow[self._edge_arcs] / _UW
        return flows

    @property
    def pivots(self) -> int:
        """Network simplex pivots so far (all solves)."""
        return self._simplex.pivots


__all__ = ["FlowRelaxation"]
