"""LP-guided beam search: discrete plans built one instruction at a time.

Rounding an LP solution and local moves change one or two instructions at a time. On small
pipelines the discrete optimum often differs from such plans by coordinated changes of 5–10
instructions across all stages (one instruction sped up so that several others can slow down),
which every single move sees as uphill. Beam search does not move between plans; it builds them.

Instructions are placed in a fixed topological order (by start time in the all-fastest
schedule). A *state* is a placed prefix, summarised by the finish times of the placed
instructions that still have unplaced successors (its "open" instructions: at most 4 for 3
stages of 1F1B), the prefix's Σ effective cost, and its latest finish so far. A state is kept
only if the unplaced instructions, all at their fastest choice, can still meet the deadline,
so every completed state is a feasible plan.

Ranking uses the hull LP's optimal dual flow λ on the precedence edges (Lagrangian relaxation
of those edges). For any state,

    C + Σ_{open u} x_u · Σ_{u→w, w unplaced} λ_uw  + (a constant per step)

is a lower bound on the effective cost of every completion: flow conservation cancels the start
times of unplaced instructions, and each contributes min_d c(d) + λ_v·d. Each deadline keeps
its ``width`` states of least bound; the bound of a state is exact once it is complete. A child's
bound is its parent's plus the choice's reduced cost c_k + λ_v·t_k, so a state only expands into
the ``choices_per_parent`` choices of least reduced cost among those that still fit (a parent
rarely places more children among the best states; 8 loses nothing measurable, 4 does).

Two directions fail on different deadlines, so both run: forward on the DAG, and backward on the
reversed DAG (a plan's longest path is the same both ways; the LP flows apply reversed).
Width is doubled only for the deadlines where doubling still found better plans.
Everything is batched: one row per deadline, one numpy step per instruction.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass

import numpy as np

from perseus.schedules.dag import InstructionDAG
from perseus.planner.choices import NodeChoices

_FIT = 1 + 1e-12  # relative tolerance of the latest-finish check (see repair.FIT_TOLERANCE)
_MAX_STATES = 400_000  # rows × width per batch: bounds memory (~25 MB per candidate array)


@dataclass(frozen=True)
class _Step:
    node: int
    pred_slots: tuple[int, ...]  # open-state columns of the node's predecessors
    keep: tuple[int, ...]  # columns of [open..., node] that stay open after placing node
    price_edges: tuple[tuple[int, ...], ...]  # per kept column: edges to unplaced successors


@dataclass(frozen=True)
class BeamResult:
    """Completed plans (choice index per node), each at most its row's deadline."""

    choices: np.ndarray  # (k, n)
    row: np.ndarray  # (k,) index of the deadline each plan was built for
    energy_j: np.ndarray  # (k,) Σ effective cost + P_b·S·makespan (the simulator's energy)


class BeamSearch:
    """Beam search in one direction over one instruction order, for many deadlines at once."""

    def __init__(
        self, dag: InstructionDAG, node_choices: NodeChoices, reverse: bool = False, choices_per_parent: int = 8
    ) -> None:
        if choices_per_parent < 1:
            raise ValueError("choices_per_parent must be at least 1")
        self.node_choices = node_choices
        self.choices_per_parent = choices_per_parent
        self.n = dag.num_nodes
        edges = list(zip(dag.edge_src.tolist(), dag.edge_dst.tolist()))
        preds = [list(p) for p in dag.predecessors]
        succs = [list(s) for s in dag.successors]
        fast = node_choices.fastest_times()
        finish = dag.levels.finish_times(fast[None])[0, : self.n]
        if reverse:  # walk the reversed DAG; an edge keeps its index (and so its LP flow)
            edges = [(w, u) for u, w in edges]
            preds, succs = succs, preds
            key = -finish  # latest finishing first
        else:
            key = finish - fast  # earliest starting first
        order = _order_by(key, preds, succs)
        # Earliest start of every node at fastest choices, in this direction's time: a node
        # must finish by deadline − (longest fastest path from its end), i.e. its latest finish.
        self._tail = _fastest_tails(order, succs, fast)
        edge_index = {e: i for i, e in enumerate(edges)}
        steps: list[_Step] = []
        placed: set[int] = set()
        open_nodes: list[int] = []
        for v in order:
            pred_slots = tuple(open_nodes.index(u) for u in preds[v])
            placed.add(v)
            columns = open_nodes + [v]
            keep = tuple(i for i, u in enumerate(columns) if any(w not in placed for w in succs[u]))
            open_nodes = [columns[i] for i in keep]
            prices = tuple(tuple(edge_index[(u, w)] for w in succs[u] if w not in placed) for u in open_nodes)
            steps.append(_Step(v, pred_slots, keep, prices))
        self.steps = tuple(steps)

    def run(
        self, deadlines: np.ndarray, edge_flows: np.ndarray, width: int, p_blocking_w: float, num_stages: int
    ) -> BeamResult:
        """Plans for every deadline: each row's completed states that are Pareto-optimal in
        (makespan, effective cost) within the row (a wide beam ends with many near-optimal plans of
        slightly different lengths, which fill the frontier between deadlines)."""
        deadlines = np.asarray(deadlines, dtype=float)
        if not len(deadlines):
            return BeamResult(np.empty((0, self.n), dtype=np.int64), np.empty(0, dtype=np.int64), np.empty(0))
        batch = max(1, _MAX_STATES // max(width, 1))
        parts = [
            (a, self._run_batch(deadlines[a : a + batch], edge_flows[a : a + batch], width, p_blocking_w, num_stages))
            for a in range(0, len(deadlines), batch)
        ]
        return BeamResult(
            np.concatenate([p.choices for _, p in parts]),
            np.concatenate([p.row + a for a, p in parts]),
            np.concatenate([p.energy_j for _, p in parts]),
        )

    def _run_batch(
        self, deadlines: np.ndarray, flows: np.ndarray, width: int, p_blocking_w: float, num_stages: int
    ) -> BeamResult:
        opts = self.node_choices
        d = len(deadlines)
        rows = np.arange(d)[:, None]
        latest = deadlines[:, None] * _FIT - self._tail[None, :]  # (d, n) latest finish
        x = np.zeros((d, 1, 0))  # open finish times
        cost = np.zeros((d, 1))
        span = np.zeros((d, 1))  # latest finish so far (the makespan once complete)
        parents: list[np.ndarray] = []
        picks: list[np.ndarray] = []
        for step in self.steps:
            table = opts.node_table[step.node]
            k = opts.num_choices[table]
            b = cost.shape[1]
            start = x[:, :, list(step.pred_slots)].max(axis=2) if step.pred_slots else np.zeros((d, b))
            # Lagrangian bound of a child: the parent's cost and flow-weighted open finishes,
            # plus the choice's reduced cost c_k + λ_v·t_k (λ_v: flow on v's outgoing edges).
            bound = cost.copy()
            own_price = np.zeros(d)
            w_old = x.shape[2]
            for kept, column in enumerate(step.keep):
                price = flows[:, list(step.price_edges[kept])].sum(axis=1)
                if column < w_old:
                    bound += price[:, None] * x[:, :, column]
                else:
                    own_price = price
            bound += own_price[:, None] * start
            times = opts.times[table, :k]
            costs = opts.costs[table, :k]
            offsets = costs[None, :] + own_price[:, None] * times[None, :]  # (d, k)
            # Choices fit a prefix of the (fastest-first) table: a parent whose slack admits
            # the first j choices only ever considers the best few of those j.
            fits = np.searchsorted(times, latest[:, step.node][:, None] - start, side="right")  # (d, b)
            short_idx, short_val = _prefix_shortlists(offsets, self.choices_per_parent)  # (d, k+1, m)
            m = short_idx.shape[2]
            at = rows * (k + 1) + fits  # (d, b): row of the flattened shortlists
            # Flat np.take gathers: several times faster than fancy indexing on (d, b, ·) arrays.
            score = np.take(short_val.reshape(-1, m), at.ravel(), axis=0).reshape(d, b, m)
            score += bound[:, :, None]
            flat = score.reshape(d, b * m)
            if b * m > width:
                pick = np.argpartition(flat, width - 1, axis=1)[:, :width]
            else:
                pick = np.broadcast_to(np.arange(b * m), (d, b * m))
            parent, slot = np.divmod(pick, m)
            picked = (rows * (b * m) + pick).ravel()
            by_parent = (rows * b + parent).ravel()  # flat index of each child's parent
            w = pick.shape[1]
            alive = np.isfinite(np.take(flat.ravel(), picked)).reshape(d, w)
            chosen = np.maximum(np.take(short_idx, np.take(at.ravel(), by_parent) * m + slot.ravel()), 0)
            chosen = chosen.reshape(d, w)  # choice per child (dead children picked −1: clamped)
            chosen_finish = np.take(start.ravel(), by_parent).reshape(d, w) + times[chosen]
            cost = np.where(alive, np.take(cost.ravel(), by_parent).reshape(d, w) + costs[chosen], np.inf)
            span = np.maximum(np.take(span.ravel(), by_parent).reshape(d, w), chosen_finish)
            old_x = np.take(x.reshape(d * b, w_old), by_parent, axis=0)
            x = np.empty((d * w, len(step.keep)))
            for new_column, column in enumerate(step.keep):
                x[:, new_column] = old_x[:, column] if column < w_old else chosen_finish.ravel()
            x = x.reshape(d, w, len(step.keep))
            parents.append(parent)
            picks.append(chosen)
        energy = cost + p_blocking_w * num_stages * span
        # Keep plans cheaper in cost than every shorter one of the row: those with the least
        # energy at their own pace, and those that win when the iteration is stretched.
        keep = _row_pareto(span, cost)  # (d, b) mask
        r, c = np.nonzero(keep)
        choices = np.empty((len(r), self.n), dtype=np.int64)
        current = c
        for step, parent, choice in zip(reversed(self.steps), reversed(parents), reversed(picks)):
            choices[:, step.node] = choice[r, current]
            current = parent[r, current]
        return BeamResult(choices, r, energy[r, c])


def beam_plans(
    dag: InstructionDAG,
    node_choices: NodeChoices,
    deadlines: np.ndarray,
    edge_flows: np.ndarray,
    p_blocking_w: float,
    width: int,
    max_width: int,
    min_gain: float = 1e-4,
    patience: int = 2,
    choices_per_parent: int = 8,
) -> np.ndarray:
    """Candidate plans (k, n) from forward and backward beams at every deadline.

    Starts at ``width`` and doubles up to ``max_width``; a row stops once ``patience``
    doublings in a row did not improve its best plan by more than ``min_gain`` (relative).
    """
    searches = [BeamSearch(dag, node_choices, reverse, choices_per_parent) for reverse in (False, True)]
    stages = dag.schedule.num_stages
    deadlines = np.asarray(deadlines, dtype=float)
    best = np.full(len(deadlines), np.inf)
    active = np.arange(len(deadlines))
    stale = np.zeros(len(deadlines), dtype=np.int64)  # doublings in a row without a gain
    found: list[np.ndarray] = []
    while len(active) and width <= max_width:
        row_best = np.full(len(active), np.inf)
        for search in searches:
            result = search.run(deadlines[active], edge_flows[active], width, p_blocking_w, stages)
            found.append(result.choices)
            np.minimum.at(row_best, result.row, result.energy_j)
        gained = row_best < best[active] * (1 - min_gain)
        best[active] = np.minimum(best[active], row_best)
        stale[active] = np.where(gained, 0, stale[active] + 1)
        # A row stops after `patience` doublings that found nothing better (a wider beam keeps
        # different states, so one doubling without a gain does not mean the next has none).
        active = active[stale[active] < patience]
        width *= 2
    return np.concatenate(found) if found else np.empty((0, dag.num_nodes), dtype=np.int64)


def _row_pareto(span: np.ndarray, value: np.ndarray) -> np.ndarray:
    """Per row, states of less ``value`` than every state of equal or shorter makespan."""
    order = np.lexsort((value, span), axis=1)
    sorted_value = np.take_along_axis(value, order, axis=1)
    before = np.minimum.accumulate(sorted_value, axis=1)
    better = np.isfinite(sorted_value)
    better[:, 1:] &= sorted_value[:, 1:] < before[:, :-1] - 1e-12 * np.abs(sorted_value[:, 1:])
    mask = np.zeros_like(better)
    np.put_along_axis(mask, order, better, axis=1)
    return mask


def _order_by(key: np.ndarray, preds: list[list[int]], succs: list[list[int]]) -> list[int]:
    """Topological order that places the node of least ``key`` among the ready ones."""
    waiting = [len(p) for p in preds]
    ready = [(float(key[v]), v) for v in range(len(preds)) if waiting[v] == 0]
    heapq.heapify(ready)
    order: list[int] = []
    while ready:
        _, v = heapq.heappop(ready)
        order.append(v)
        for w in succs[v]:
            waiting[w] -= 1
            if waiting[w] == 0:
                heapq.heappush(ready, (float(key[w]), w))
    return order


def _fastest_tails(order: list[int], succs: list[list[int]], fast: np.ndarray) -> np.ndarray:
    """Longest all-fastest path from the end of each node to the end of the DAG."""
    tail = np.zeros(len(order))
    for v in reversed(order):
        tail[v] = max((fast[w] + tail[w] for w in succs[v]), default=0.0)
    return tail


def _prefix_shortlists(offsets: np.ndarray, m: int) -> tuple[np.ndarray, np.ndarray]:
    """For every row and prefix length j (0..k): the ≤ m choices of least offset among choices
    [0, j), best first, as indices (−1 padded) and offsets (+inf padded); each (rows, k + 1, m)."""
    d, k = offsets.shape
    m = min(m, k)
    index = np.full((d, k + 1, m), -1, dtype=np.int64)
    value = np.full((d, k + 1, m), np.inf)
    for j in range(k):
        vals = np.concatenate([value[:, j], offsets[:, j : j + 1]], axis=1)
        idx = np.concatenate([index[:, j], np.full((d, 1), j, dtype=np.int64)], axis=1)
        order = np.argsort(vals, axis=1, kind="stable")[:, :m]
        value[:, j + 1] = np.take_along_axis(vals, order, axis=1)
        index[:, j + 1] = np.take_along_axis(idx, order, axis=1)
    return index, value
