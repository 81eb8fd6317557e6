"""Plans that a GPU with a clock-switch latency runs as planned.

The planner's model switches the clock the instant an instruction starts. A real switch lands
``latency`` after it is requested, and the runtime requests each one so that it lands between
its two instructions: at their boundary or in the wait between them (``perseus.timeline.switch_timing``;
there it costs neither time nor energy). That works for every switch of a stage only if
consecutive landings can be ``latency`` (plus a margin) apart: a run of equal clocks shorter than
that (with the waits around it) leaves its switches no room. ``land_switches`` finds such *late*
switches on each plan's simulated timeline and removes them by merging runs, always raising the
slower run to the faster one's clock (of the two merges that remove a late switch, the one that
costs less energy), and repeats on the new timeline until every switch lands in time. Clocks only
rise, so a plan never gets slower than before; the frontier is re-filtered on the changed plans.
Where instructions share no useful clock to merge at, a plan keeps a late switch; ``with_lag``
then accounts it as the GPU runs it (``perseus.timeline.switch_lag``), so the frontier's numbers stay true.

A second rule is about energy, not time: a switch down only pays off when what it saves on its
instruction covers what the switch costs. ``switch_pays_off`` takes that cost as the latency spent
at a given power (``PlannerOptions.switch_cost_w``; the blocking power is the conservative value
the issue suggests); a switch down that saves less (in the planner's effective cost ``e − P_b·t``)
keeps the earlier, faster clock. Off (0 W) by default: the simulated GPU's switches cost no
energy, and there the rule only gives saving away (docs/runtime.md has the numbers).

With latency 0 nothing moves.
"""

from __future__ import annotations

import numpy as np

from perseus.schedules.dag import InstructionDAG
from perseus.planner.choices import NodeChoices
from perseus.planner.deadlines import Candidates
from perseus.profile import Profile
from perseus.timeline.switch_lag import simulate_with_latency
from perseus.timeline.switch_timing import Switch, late_switches

MAX_PASSES = 64  # timeline re-simulations; each pass removes at least one late switch per stage that has one


def switch_pays_off(saving_j: np.ndarray | float, latency_s: float, switch_cost_w: float) -> np.ndarray:
    """Whether switching down for an instruction saves more than the switch costs (``latency_s`` at
    ``switch_cost_w``); ``saving_j``: the instruction's effective cost at the earlier clock minus at its own."""
    return np.asarray(saving_j) > latency_s * switch_cost_w


def land_switches(dag: InstructionDAG, node_choices: NodeChoices, choices: np.ndarray, latency_s: float,
                  switch_cost_w: float = 0.0) -> np.ndarray:
    """Choice indices ``(plans, nodes)`` whose switches land in time (``late_switches`` is empty
    on each stage of each plan's timeline) wherever merging runs can make them, and with no switch
    down that does not pay off at ``switch_cost_w`` (``switch_pays_off``). A merge cannot remove a
    switch between instructions whose useful clocks (``planner.choices``) have none in common at
    or above both runs' clocks; such a plan keeps that switch (``late_plans`` finds them)."""
    if latency_s <= 0 or choices.size == 0:
        return choices
    out = choices.copy()
    if switch_cost_w > 0:
        for stage in range(dag.schedule.num_stages):
            nodes = np.flatnonzero(dag.node_stage == stage)
            while _hold_unpaid(node_choices, nodes, out, latency_s, switch_cost_w):
                pass
    tables = _Tables(node_choices)
    rows = np.arange(len(out))
    for _ in range(MAX_PASSES):
        times = node_choices.node_times(out[rows])
        finish = dag.levels.finish_times(times)[:, : dag.num_nodes]
        begin = finish - times
        changed = [r for i, r in enumerate(rows.tolist())
                   if _merge_late_runs(dag, node_choices, tables, out[r], begin[i], finish[i], latency_s,
                                       float(finish[i].max()))]
        if not changed:
            break
        rows = np.array(changed)
    return out


def late_plans(dag: InstructionDAG, node_choices: NodeChoices, choices: np.ndarray, latency_s: float) -> np.ndarray:
    """Mask of the plans (choice rows) with a switch that cannot land in time on their timeline."""
    if latency_s <= 0 or choices.size == 0:
        return np.zeros(len(choices), dtype=bool)
    times = node_choices.node_times(choices)
    finish = dag.levels.finish_times(times)[:, : dag.num_nodes]
    begin = finish - times
    freqs = node_choices.node_freqs(choices)
    late = np.zeros(len(choices), dtype=bool)
    for r in range(len(choices)):
        period = float(finish[r].max())
        for stage in range(dag.schedule.num_stages):
            lo, hi = int(dag.stage_offsets[stage]), int(dag.stage_offsets[stage + 1])
            if late_switches(begin[r, lo:hi], finish[r, lo:hi], freqs[r, lo:hi], latency_s, period):
                late[r] = True
                break
    return late


def with_lag(found: Candidates, late: np.ndarray, dag: InstructionDAG, node_choices: NodeChoices, profile: Profile,
             latency_s: float) -> Candidates:
    """``found`` with the plans of ``late`` (a mask) accounted as a GPU with that latency runs them
    under the runtime's timed requests (``perseus.timeline.switch_lag``): their late switches land inside
    instructions, which the planner's model does not see."""
    if not late.any():
        return found
    times, energies = found.times_s.copy(), found.energies_j.copy()
    freqs = node_choices.node_freqs(found.choices)
    for r in np.flatnonzero(late):
        lagged = simulate_with_latency(dag, profile, freqs[r], latency_s, "timed")
        times[r], energies[r] = lagged.time_s, lagged.energy_j
    idle_w = profile.require_p_blocking() * dag.schedule.num_stages
    return Candidates(found.choices, times, energies, energies - idle_w * times)


class _Tables:
    """Python-side lookups of the choice tables for the merges' inner loops."""

    def __init__(self, node_choices: NodeChoices) -> None:
        self.node_table: list[int] = node_choices.node_table.tolist()
        counts = node_choices.num_choices.tolist()
        self.freqs: list[list[int]] = [node_choices.freqs[k, : counts[k]].tolist() for k in range(len(counts))]
        self.costs: list[list[float]] = [node_choices.costs[k, : counts[k]].tolist() for k in range(len(counts))]
        self.index: list[dict[int, int]] = [{f: j for j, f in enumerate(fs)} for fs in self.freqs]

    def at_least(self, node: int, mhz: int, current: int) -> int:
        """The slowest choice at least as fast as ``mhz`` (never slower than ``current``; the
        fastest if none is that fast): choices are fastest first."""
        freqs = self.freqs[self.node_table[node]]
        j = len(freqs) - 1
        while j > 0 and freqs[j] < mhz:
            j -= 1
        return min(current, j)


def _merge_late_runs(dag: InstructionDAG, node_choices: NodeChoices, tables: _Tables, plan: np.ndarray,
                     begin: np.ndarray, finish: np.ndarray, latency_s: float, period_s: float) -> bool:
    """Remove the late switches of every stage of one plan (in place) where a merge can, each
    merge touching runs no earlier merge of this pass touched (the timeline moves after each
    pass); True if a clock changed."""
    changed = False
    freqs = node_choices.node_freqs(plan)
    for stage in range(dag.schedule.num_stages):
        lo, hi = int(dag.stage_offsets[stage]), int(dag.stage_offsets[stage + 1])
        touched: set[int] = set()
        stage_plan = plan[lo:hi].tolist()
        stage_freqs = freqs[lo:hi].tolist()
        for late in late_switches(begin[lo:hi], finish[lo:hi], freqs[lo:hi], latency_s, period_s):
            n = hi - lo
            if late.index in touched or (late.index - 1) % n in touched:
                continue
            merged = _merge(tables, stage_plan, stage_freqs, lo, late)
            touched |= merged
        if touched:
            plan[lo:hi] = stage_plan
            changed = True
    return changed


def _merge(tables: _Tables, plan: list[int], freqs: list[int], offset: int, late: Switch) -> set[int]:
    """Of the two merges that remove ``late`` (its run into the one before, or that one into its
    own predecessor, which makes room), apply the one that costs less to one stage's choices and
    clocks (in place); the positions it changed (empty: neither merge changes a clock)."""
    n = len(freqs)
    before = _run(freqs, (late.index - 1) % n)
    best: tuple[float, dict[int, int]] | None = None
    for a, b in ((before, _run(freqs, late.index)), (_run(freqs, (before[0] - 1) % n), before)):
        members = sorted(set(_members(a, n)) | set(_members(b, n)))
        floor = max(freqs[a[0]], freqs[b[0]])
        index = [tables.index[tables.node_table[offset + i]] for i in members]
        common = [f for f in index[0] if f >= floor and all(f in ix for ix in index[1:])]
        new: dict[int, int] = {}
        if common:
            target = min(common)
            new = {i: ix[target] for i, ix in zip(members, index)}
        if not new or any(c > plan[i] for i, c in new.items()):  # no common clock, or one that is slower there
            new = {i: tables.at_least(offset + i, floor, plan[i]) for i in members}
        new = {i: c for i, c in new.items() if c != plan[i]}
        if not new:
            continue
        costs = [tables.costs[tables.node_table[offset + i]] for i in new]
        extra = sum(cost[c] - cost[plan[i]] for (i, c), cost in zip(new.items(), costs))
        if best is None or extra < best[0]:
            best = (extra, new)
    if best is None:
        return set()
    for i, c in best[1].items():
        plan[i] = c
        freqs[i] = tables.freqs[tables.node_table[offset + i]][c]
    return set(best[1])


def _run(clocks: list[int], i: int) -> tuple[int, int]:
    """(first, length) of the cyclic run of equal clocks holding position ``i``."""
    n = len(clocks)
    first, length = i, 1
    while length < n and clocks[(first - 1) % n] == clocks[i]:
        first, length = (first - 1) % n, length + 1
    while length < n and clocks[(first + length) % n] == clocks[i]:
        length += 1
    return first, length


def _members(run: tuple[int, int], n: int) -> list[int]:
    return [(run[0] + k) % n for k in range(run[1])]


def _at_least(node_choices: NodeChoices, node: int, mhz: int, current: int) -> int:
    """The slowest choice of ``node`` at least as fast as ``mhz`` (never slower than ``current``;
    its fastest if none is that fast)."""
    table = node_choices.node_table[node]
    freqs = node_choices.freqs[table, : node_choices.num_choices[table]]  # fastest first
    ok = np.flatnonzero(freqs >= mhz)
    return min(current, int(ok[-1]) if len(ok) else 0)


def _hold_unpaid(node_choices: NodeChoices, nodes: np.ndarray, out: np.ndarray, latency_s: float,
                 switch_cost_w: float) -> bool:
    """One pass over a stage's consecutive pairs: a switch down that does not pay off keeps the
    earlier, faster clock; True if any plan changed."""
    changed = False
    for prev, node in zip(nodes[:-1], nodes[1:]):
        f_prev = node_choices.freqs[node_choices.node_table[prev], out[:, prev]]
        f_node = node_choices.freqs[node_choices.node_table[node], out[:, node]]
        down = f_node < f_prev
        if not down.any():
            continue
        held = np.array([_at_least(node_choices, node, int(f), int(c)) for f, c in zip(f_prev, out[:, node])])
        table = node_choices.node_table[node]
        saving = node_choices.costs[table, held] - node_choices.costs[table, out[:, node]]
        hold = down & ~switch_pays_off(saving, latency_s, switch_cost_w)
        if hold.any():
            before = out[hold, node].copy()
            out[hold, node] = held[hold]
            changed = changed or bool((out[hold, node] != before).any())
    return changed
