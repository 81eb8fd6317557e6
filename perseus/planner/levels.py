"""Topological levels of the instruction DAG, for longest paths over many plans at once.

Nodes at the same level (longest edge count from a source) never depend on each other, so a
forward or backward sweep processes one level per numpy operation, for a whole batch of plans
(one row per deadline). A pipeline of S stages × M microbatches has about 2·(M + S) levels, so
a sweep costs a few hundred vectorised steps whatever the batch size.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from perseus.dag import InstructionDAG


@dataclass(frozen=True)
class Level:
    """One level: its nodes and their predecessors / successors padded with a sentinel."""

    nodes: np.ndarray
    preds: np.ndarray  # (len(nodes), max in-degree), sentinel = num_nodes
    succs: np.ndarray  # (len(nodes), max out-degree), sentinel = num_nodes


@dataclass(frozen=True)
class LevelGraph:
    """The DAG as a list of levels; column ``num_nodes`` of batch arrays is the sentinel."""

    num_nodes: int
    levels: tuple[Level, ...]
    sinks: np.ndarray  # nodes without successors

    @classmethod
    def from_dag(cls, dag: InstructionDAG) -> LevelGraph:
        n = dag.num_nodes
        depth = np.zeros(n, dtype=np.int64)
        preds, succs = dag.predecessors, dag.successors
        for v in dag.topo_order.tolist():
            if preds[v]:
                depth[v] = 1 + max(depth[u] for u in preds[v])
        levels = []
        for d in range(int(depth.max()) + 1 if n else 0):
            nodes = np.flatnonzero(depth == d)
            levels.append(Level(nodes, _padded([preds[v] for v in nodes], n), _padded([succs[v] for v in nodes], n)))
        sinks = np.array([v for v in range(n) if not succs[v]], dtype=np.int64)
        return cls(n, tuple(levels), sinks)

    def finish_times(self, durations: np.ndarray) -> np.ndarray:
        """Earliest finish of every node, per row of ``durations`` (batch, n) → (batch, n + 1)."""
        batch = durations.shape[0]
        finish = np.zeros((batch, self.num_nodes + 1))
        for level in self.levels:
            start = finish[:, level.preds].max(axis=2)
            finish[:, level.nodes] = start + durations[:, level.nodes]
        return finish

    def latest_finish(self, durations: np.ndarray, deadlines: np.ndarray) -> np.ndarray:
        """Latest finish of every node that still meets each row's deadline → (batch, n + 1)."""
        batch = durations.shape[0]
        latest_start = np.empty((batch, self.num_nodes + 1))
        latest_start[:, self.num_nodes] = deadlines
        finish = np.empty((batch, self.num_nodes + 1))
        finish[:, self.num_nodes] = deadlines
        for level in reversed(self.levels):
            lf = latest_start[:, level.succs].min(axis=2)
            finish[:, level.nodes] = lf
            latest_start[:, level.nodes] = lf - durations[:, level.nodes]
        return finish

    def iteration_times(self, durations: np.ndarray) -> np.ndarray:
        """Longest path per row."""
        return self.finish_times(durations)[:, : self.num_nodes].max(axis=1)


def _padded(lists: list[tuple[int, ...]], sentinel: int) -> np.ndarray:
    width = max(1, max((len(x) for x in lists), default=1))
    out = np.full((len(lists), width), sentinel, dtype=np.int64)
    for i, items in enumerate(lists):
        out[i, : len(items)] = items
    return out
