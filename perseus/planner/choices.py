"""Per-instruction choice tables: the discrete (time, effective cost) choices a node can take.

The planner minimises Σ (e − P_b·t) over instructions subject to the deadline, so each measured
frequency becomes a choice with time ``t`` and *effective cost* ``c = e − P_b·t``. A choice that
is slower and not cheaper in ``c`` than another can never help (it lengthens paths and costs more)
and is dropped. Instructions that share a profile entry (all forwards of a stage) share one table,
so tables are built once per (stage, chunk, kind) and nodes refer to them by index. A kind whose
profile knows the unlocked card also has the choice ``UNLOCKED_MHZ`` and none of its clocks above
its sustained one (``perseus.planner.unlocked.choice_clocks``).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from perseus.schedules.dag import InstructionDAG
from perseus.planner.unlocked import choice_clocks
from perseus.profile import InstructionProfile, Profile


@dataclass(frozen=True)
class ChoiceTable:
    """Useful choices of one instruction type, fastest first (time ↑, effective cost strictly ↓)."""

    freqs_mhz: np.ndarray
    times_s: np.ndarray
    energies_j: np.ndarray
    costs: np.ndarray  # effective cost e − P_b·t
    hull: np.ndarray  # indices of the lower convex hull vertices of (time, cost), fastest first

    @property
    def num_choices(self) -> int:
        return len(self.times_s)


def useful_choices(measured: InstructionProfile, p_blocking_w: float) -> ChoiceTable:
    """Drop choices dominated in (time, effective cost); keep the rest fastest first."""
    clocks = choice_clocks(measured)
    times = np.asarray([t for _, t, _ in clocks], dtype=float)
    energies = np.asarray([e for _, _, e in clocks], dtype=float)
    freqs = np.asarray([f for f, _, _ in clocks], dtype=np.int64)
    costs = energies - p_blocking_w * times
    # Sort by time, ties broken by cost, then by higher frequency (deterministic choice).
    order = np.lexsort((-freqs, costs, times))
    keep: list[int] = []
    best_cost = np.inf
    for i in order.tolist():
        if costs[i] < best_cost:  # strictly cheaper than every faster choice
            keep.append(i)
            best_cost = costs[i]
    idx = np.asarray(keep, dtype=np.int64)
    t, c = times[idx], costs[idx]
    return ChoiceTable(freqs[idx], t, energies[idx], c, lower_hull(t, c))


def lower_hull(times: np.ndarray, costs: np.ndarray) -> np.ndarray:
    """Indices of the lower convex hull of points sorted by time (monotone-chain)."""
    hull: list[int] = []
    for i in range(len(times)):
        while len(hull) >= 2:
            a, b = hull[-2], hull[-1]
            # Drop b when it lies on or above the segment a→i.
            cross = (times[b] - times[a]) * (costs[i] - costs[a]) - (costs[b] - costs[a]) * (times[i] - times[a])
            if cross <= 0:
                hull.pop()
            else:
                break
        hull.append(i)
    return np.asarray(hull, dtype=np.int64)


@dataclass(frozen=True)
class NodeChoices:
    """Choice tables of every DAG node, plus padded arrays for vectorised lookups.

    ``times[k, j]`` is choice ``j`` of table ``k`` (padded with +inf past the table's end) so that
    "slowest choice no longer than a budget" is one ``searchsorted`` per table.
    """

    tables: tuple[ChoiceTable, ...]
    node_table: np.ndarray  # table index per node
    times: np.ndarray  # (num_tables, max_options), +inf padded
    costs: np.ndarray  # (num_tables, max_options), +inf padded
    energies: np.ndarray  # (num_tables, max_options)
    freqs: np.ndarray  # (num_tables, max_options)
    num_choices: np.ndarray  # per table

    @property
    def num_nodes(self) -> int:
        return len(self.node_table)

    def node_times(self, choice: np.ndarray) -> np.ndarray:
        """Durations of a plan given as choice indices (any leading batch shape)."""
        return self.times[self.node_table, choice]

    def node_costs(self, choice: np.ndarray) -> np.ndarray:
        return self.costs[self.node_table, choice]

    def node_energies(self, choice: np.ndarray) -> np.ndarray:
        return self.energies[self.node_table, choice]

    def node_freqs(self, choice: np.ndarray) -> np.ndarray:
        return self.freqs[self.node_table, choice]

    def fastest_times(self) -> np.ndarray:
        return self.times[self.node_table, 0]

    def slowest_choice(self) -> np.ndarray:
        return self.num_choices[self.node_table] - 1


def build_node_choices(dag: InstructionDAG, profile: Profile, p_blocking_w: float) -> NodeChoices:
    """Group nodes by profile entry and build one choice table per entry."""
    key_index: dict[tuple[int, int, str], int] = {}
    tables: list[ChoiceTable] = []
    node_table = np.empty(dag.num_nodes, dtype=np.int64)
    for v, (stage, inst) in enumerate(zip(dag.node_stage.tolist(), dag.instructions)):
        key = (stage, inst.chunk, inst.kind)
        if key not in key_index:
            key_index[key] = len(tables)
            tables.append(useful_choices(profile.get(stage, inst.kind, inst.chunk), p_blocking_w))
        node_table[v] = key_index[key]
    width = max(t.num_choices for t in tables)
    times = np.full((len(tables), width), np.inf)
    costs = np.full((len(tables), width), np.inf)
    energies = np.full((len(tables), width), np.inf)
    freqs = np.zeros((len(tables), width), dtype=np.int64)
    for k, table in enumerate(tables):
        m = table.num_choices
        times[k, :m], costs[k, :m], energies[k, :m], freqs[k, :m] = (
            table.times_s,
            table.costs,
            table.energies_j,
            table.freqs_mhz,
        )
    num_choices = np.array([t.num_choices for t in tables], dtype=np.int64)
    return NodeChoices(tuple(tables), node_table, times, costs, energies, freqs, num_choices)
