"""The instruction DAG of one pipeline iteration, derived from a ``Schedule``.

Nodes are numbered stage-major in execution order (stage 0's instructions first), so a per-node
array (frequencies, durations) splits into per-stage plans by ``stage_offsets``. Arrays are numpy
so the planner and simulator can work on them without Python objects in the loop.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import numpy as np

from perseus.schedule import Instruction, Schedule


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
        edges = schedule.dependencies()
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

    def split_by_stage(self, values: np.ndarray) -> list[np.ndarray]:
        """Per-node array → list of per-stage arrays in execution order."""
        return [values[self.stage_offsets[s] : self.stage_offsets[s + 1]] for s in range(self.schedule.num_stages)]


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
