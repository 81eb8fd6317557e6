"""The LP relaxation: each instruction's choices replaced by their lower convex hull.

Minimise Σ c_v(d_v) subject to precedence and the deadline, where c_v is the piecewise-linear
convex hull of node v's (time, effective cost) choices. With segment variables y_vk ∈ [0, L_k]
(the amount node v is slowed past hull vertex k−1, at slope g_k) convexity makes the LP fill
segments in order, so d_v = t_v0 + Σ_k y_vk is a point on the hull. Its optimum is a lower
bound on every discrete plan and its durations guide the discrete repair.

Only the deadline (right-hand side of the sink rows) changes between solves, so one HiGHS
model is kept and re-solved with dual simplex from the previous basis: a search over deadlines
costs a few pivots per deadline.
"""

from __future__ import annotations

import highspy
import numpy as np

from perseus.schedules.dag import InstructionDAG
from perseus.errors import PlannerError
from perseus.planner.choices import NodeChoices


class _QuietHighs(highspy.Highs):
    """``highspy.Highs`` that never writes to the console, not even its copyright banner.

    highspy's constructor already logs the banner (from ``enableCallbacks``), before ``silent()``
    could be called; turning output off first keeps ``perseus plan``'s stdout to perseus's own.
    """

    def enableCallbacks(self) -> None:  # highspy's name
        self.setOptionValue("output_flag", False)
        self.setOptionValue("log_to_console", False)
        return super().enableCallbacks()


class HullRelaxation:
    """Warm-started LP over the convex hull of each node's choices.

    Columns: start s_v and finish f_v of every node, then the hull segments of every node.
    Rows: f_v − s_v − Σ_k y_vk = t_v0 per node, f_u − s_w ≤ 0 per edge, f_v ≤ T per sink.
    """

    def __init__(self, dag: InstructionDAG, node_choices: NodeChoices) -> None:
        n = dag.num_nodes
        seg_node: list[np.ndarray] = []
        seg_len: list[np.ndarray] = []
        seg_slope: list[np.ndarray] = []
        base_time = np.empty(n)
        base_cost = np.empty(n)
        for k, table in enumerate(node_choices.tables):
            nodes = np.flatnonzero(node_choices.node_table == k)
            ht, hc = table.times_s[table.hull], table.costs[table.hull]
            lengths, slopes = np.diff(ht), np.diff(hc) / np.diff(ht)
            base_time[nodes], base_cost[nodes] = ht[0], hc[0]
            seg_node.append(np.repeat(nodes, len(lengths)))
            seg_len.append(np.tile(lengths, len(nodes)))
            seg_slope.append(np.tile(slopes, len(nodes)))
        self.seg_node = np.concatenate(seg_node).astype(np.int64)
        order = np.argsort(self.seg_node, kind="stable")
        self.seg_node = self.seg_node[order]
        seg_len_a = np.concatenate(seg_len)[order]
        seg_slope_a = np.concatenate(seg_slope)[order]
        self.base_time, self.base_cost = base_time, base_cost
        self.num_nodes = n
        m = len(self.seg_node)
        sinks = np.array([v for v in range(n) if not dag.successors[v]], dtype=np.int64)
        self.sinks = sinks
        num_edges = len(dag.edge_src)
        num_rows = n + num_edges + len(sinks)
        self._edge_rows = slice(n, n + num_edges)
        self._sink_rows = np.arange(n + num_edges, num_rows, dtype=np.int32)

        # Column-wise matrix: s_v (cols 0..n-1), f_v (n..2n-1), segments (2n..2n+m-1).
        rows: list[np.ndarray] = []
        cols: list[np.ndarray] = []
        vals: list[np.ndarray] = []
        node_rows = np.arange(n)
        edge_rows = n + np.arange(num_edges)
        sink_rows = n + num_edges + np.arange(len(sinks))
        rows += [node_rows, node_rows, self.seg_node]
        cols += [np.arange(n), n + np.arange(n), 2 * n + np.arange(m)]
        vals += [-np.ones(n), np.ones(n), -np.ones(m)]
        rows += [edge_rows, edge_rows, sink_rows]
        cols += [n + dag.edge_src, dag.edge_dst, n + sinks]
        vals += [np.ones(num_edges), -np.ones(num_edges), np.ones(len(sinks))]
        r, c, v = np.concatenate(rows), np.concatenate(cols), np.concatenate(vals)
        order = np.lexsort((r, c))
        r, c, v = r[order], c[order], v[order]
        num_cols = 2 * n + m
        start = np.searchsorted(c, np.arange(num_cols + 1)).astype(np.int32)

        lp = highspy.HighsLp()
        lp.num_col_ = num_cols
        lp.num_row_ = num_rows
        lp.col_cost_ = np.concatenate([np.zeros(2 * n), seg_slope_a])
        lp.col_lower_ = np.zeros(num_cols)
        lp.col_upper_ = np.concatenate([np.full(2 * n, highspy.kHighsInf), seg_len_a])
        inf = highspy.kHighsInf
        lp.row_lower_ = np.concatenate([base_time, np.full(num_edges + len(sinks), -inf)])
        lp.row_upper_ = np.concatenate([base_time, np.zeros(num_edges), np.full(len(sinks), inf)])
        lp.a_matrix_.format_ = highspy.MatrixFormat.kColwise
        lp.a_matrix_.start_ = start
        lp.a_matrix_.index_ = r.astype(np.int32)
        lp.a_matrix_.value_ = v.astype(float)
        lp.offset_ = float(base_cost.sum())
        self._highs = _QuietHighs()
        self._highs.setOptionValue("output_flag", False)
        self._highs.setOptionValue("log_to_console", False)
        self._highs.setOptionValue("solver", "simplex")
        self._highs.setOptionValue("simplex_strategy", 1)  # dual simplex: warm starts after RHS changes
        self._highs.setOptionValue("presolve", "off")
        self._highs.passModel(lp)

    def solve(self, deadline_s: float) -> tuple[np.ndarray, float]:
        """(durations per node, optimal relaxed Σ effective cost) at a deadline ≥ the fastest time."""
        k = len(self._sink_rows)
        self._highs.changeRowsBounds(  # type: ignore[attr-defined]  # highspy 1.16's stub omits this export
            k, self._sink_rows, np.full(k, -highspy.kHighsInf), np.full(k, float(deadline_s))
        )
        self._highs.run()
        status = self._highs.getModelStatus()
        if status != highspy.HighsModelStatus.kOptimal:
            # A warm start from the previous basis can end in numerical trouble (status "Unknown",
            # seen on a demo's profile whose instructions are exact multiples of each other): solve
            # this deadline again from scratch before giving up.
            self._highs.clearSolver()
            self._highs.run()
            status = self._highs.getModelStatus()
        if status != highspy.HighsModelStatus.kOptimal:
            raise PlannerError(
                f"LP relaxation at deadline {deadline_s:.6f} s ended with status "
                f"{self._highs.modelStatusToString(status)}; report this with the profile attached"
            )
        col = np.asarray(self._highs.getSolution().col_value)
        segments = col[2 * self.num_nodes :]
        durations = self.base_time + np.bincount(self.seg_node, weights=segments, minlength=self.num_nodes)
        return durations, float(self._highs.getInfo().objective_function_value)

    def deadline_slope(self) -> float:
        """d(LP value)/d(deadline) at the last solve (≤ 0): the sink rows' duals summed.

        The LP value is convex in the deadline, so value + slope·(T − T_solved) is a lower bound
        on the LP value — hence on every discrete plan — at any other deadline T.
        """
        duals = np.asarray(self._highs.getSolution().row_dual)
        return float(duals[self._sink_rows].sum())

    def edge_flows(self) -> np.ndarray:
        """Optimal dual flow on every DAG edge (``dag.edge_src`` order) at the last solve, ≥ 0.

        λ_uw is the LP's marginal cost of u finishing later relative to w starting: the prices
        that make Σ c + Σ λ_uw·(finish_u − start_w) a Lagrangian lower bound (see planner.beam).
        """
        duals = np.asarray(self._highs.getSolution().row_dual)
        return np.maximum(-duals[self._edge_rows], 0.0)
