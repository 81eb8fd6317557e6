"""The instruction DAG of one pipeline iteration, derived from a ``Schedule``.

Nodes are numbered stage-major in execution order (stage 0's instructions first), so a per-node
array (frequencies, durations) splits into per-stage plans by ``stage_offsets``. Arrays are numpy
so the planner and simulator can work on them without Python objects in the loop.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import numpy as np

from perseus.schedules.dependencies import dependencies
from perseus.schedules.model import Instruction, Schedule


@dataclass(frozen=True, eq=False)
class InstructionDAG:
    """Activity-on-node DAG: an edge u→v means v cannot start before u finishes."""

    schedule: Schedule
    stage_offsets: np.ndarray  # node ids of stage s are stage_offsets[s]:stage_offsets[s+1]
    node_stage: np.ndarray
    instructions: tuple[Instruction, ...]
    edge_src: np.ndarray
    edge_dst: np.ndarray
    topo_order: np.ndarray

    @classmethod
    def from_schedule(cls, schedule: Schedule) -> InstructionDAG:
        sizes = [len(stage) for stage in schedule.stages]
        offsets = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
        node_stage = np.repeat(np.arange(schedule.num_stages), sizes)
        instructions = tuple(inst for stage in schedule.stages for inst in stage)
        edges = dependencies(schedule)
        src = np.array([offsets[s] + i for (s, i), _ in edges], dtype=np.int64)
        dst = np.array([offsets[s] + i for _, (s, i) in edges], dtype=np.int64)
        topo = _topological_order(len(instructions), src, dst)
        return cls(schedule, offsets, node_stage, instructions, src, dst, topo)

    @property
    def num_nodes(self) -> int:
        return len(self.instructions)

    @cached_property
    def predecessors(self) -> tuple[tuple[int, ...], ...]:
        preds: list[list[int]] = [[] for _ in range(self.num_nodes)]
        for u, v in zip(self.edge_src.tolist(), self.edge_dst.tolist()):
            preds[v].append(u)
        return tuple(tuple(p) for p in preds)

    @cached_property
    def successors(self) -> tuple[tuple[int, ...], ...]:
        succs: list[list[int]] = [[] for _ in range(self.num_nodes)]
        for u, v in zip(self.edge_src.tolist(), self.edge_dst.tolist()):
            succs[u].append(v)
        return tuple(tuple(s) for s in succs)

    @cached_property
    def levels(self) -> LevelGraph:
        """The DAG grouped into topological levels, for longest paths over many plans at once."""
        return LevelGraph.from_dag(self)

    def split_by_stage(self, values: np.ndarray) -> list[np.ndarray]:
        """Per-node array → list of per-stage arrays in execution order."""
        return [values[self.stage_offsets[s] : self.stage_offsets[s + 1]] for s in range(self.schedule.num_stages)]


@dataclass(frozen=True)
class Level:
    """Nodes at one depth, with their predecessors / successors padded with the sentinel ``n``."""

    nodes: np.ndarray
    preds: np.ndarray  # (len(nodes), max in-degree)
    succs: np.ndarray  # (len(nodes), max out-degree)


@dataclass(frozen=True)
class LevelGraph:
    """The DAG as topological levels (depth = longest edge count from a source).

    Nodes of one level never depend on each other, so a forward or backward pass handles one
    level per numpy operation for a whole batch of plans (one row each). A pipeline of S stages ×
    M microbatches has about 2·(M + S) levels, so a pass costs a few hundred vectorised steps
    whatever the batch size. Batch arrays carry one extra column, index ``num_nodes``: the
    sentinel that padded predecessor / successor lists point at.
    """

    num_nodes: int
    levels: tuple[Level, ...]
    depth: np.ndarray  # level index per node
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
        return cls(n, tuple(levels), depth, sinks)

    def finish_times(self, durations: np.ndarray) -> np.ndarray:
        """Earliest finish of every node per row of ``durations`` (batch, n) → (batch, n + 1).

        Each node starts when its last predecessor finishes (at 0 without predecessors); the
        sentinel column stays 0.
        """
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


def _padded(lists: list[tuple[int, ...]], sentinel: int) -> np.ndarray:
    width = max(1, max((len(x) for x in lists), default=1))
    out = np.full((len(lists), width), sentinel, dtype=np.int64)
    for i, items in enumerate(lists):
        out[i, : len(items)] = items
    return out


def _topological_order(n: int, src: np.ndarray, dst: np.ndarray) -> np.ndarray:
    indegree = np.bincount(dst, minlength=n)
    succs: list[list[int]] = [[] for _ in range(n)]
    for u, v in zip(src.tolist(), dst.tolist()):
        succs[u].append(v)
    ready = [v for v in range(n) if indegree[v] == 0]
    order: list[int] = []
    while ready:
        u = ready.pop()
        order.append(u)
        for v in succs[u]:
            indegree[v] -= 1
            if indegree[v] == 0:
                ready.append(v)
    if len(order) != n:
        raise ValueError("schedule dependencies contain a cycle (schedule would deadlock)")
    return np.array(order, dtype=np.int64)
