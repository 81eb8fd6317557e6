"""Plans that a GPU with a clock-switch latency runs as planned.

The planner's model switches the clock the instant an instruction starts. A real switch lands
``latency`` after it is requested, and the runtime requests each one so that it lands between
its two instructions: at their boundary or in the wait between them (``perseus.switch_timing``;
there it costs neither time nor energy). That works for every switch of a stage only if
consecutive landings can be ``latency`` apart: a run of equal clocks shorter than the latency
(with the waits around it) leaves its switches no room. ``land_switches`` finds such *late*
switches on each plan's simulated timeline and removes them by merging runs, always raising the
slower run to the faster one's clock (of the two merges that remove a late switch, the one that
costs less energy), and repeats on the new timeline until every switch lands in time. Clocks only
rise, so a plan never gets slower than before; the frontier is re-filtered on the changed plans.

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

from perseus.dag import InstructionDAG
from perseus.planner.choices import NodeChoices
from perseus.switch_timing import Switch, late_switches

MAX_PASSES = 64  # timeline re-simulations; each pass removes at least one late switch per stage that has one


def switch_pays_off(saving_j: np.ndarray | float, latency_s: float, switch_cost_w: float) -> np.ndarray:
    """Whether switching down for an instruction saves more than the switch costs (``latency_s`` at
    ``switch_cost_w``); ``saving_j``: the instruction's effective cost at the earlier clock minus at its own."""
    return np.asarray(saving_j) > latency_s * switch_cost_w


def land_switches(dag: InstructionDAG, node_choices: NodeChoices, choices: np.ndarray, latency_s: float,
                  switch_cost_w: float = 0.0) -> np.ndarray:
    """Choice indices ``(plans, nodes)`` whose every switch lands in time (``late_switches`` is
    empty on each stage of each plan's timeline), and with no switch down that does not pay off
    at ``switch_cost_w`` (``switch_pays_off``)."""
    if latency_s <= 0 or choices.size == 0:
        return choices
    out = choices.copy()
    if switch_cost_w > 0:
        for stage in range(dag.schedule.num_stages):
            nodes = np.flatnonzero(dag.node_stage == stage)
            while _hold_unpaid(node_choices, nodes, out, latency_s, switch_cost_w):
                pass
    rows = np.arange(len(out))
    for _ in range(MAX_PASSES):
        times = node_choices.node_times(out[rows])
        finish = dag.levels.finish_times(times)[:, : dag.num_nodes]
        begin = finish - times
        changed = [r for i, r in enumerate(rows.tolist())
                   if _merge_late_runs(dag, node_choices, out[r], begin[i], finish[i], latency_s, float(finish[i].max()))]
        if not changed:
            break
        rows = np.array(changed)
    return out


def _merge_late_runs(dag: InstructionDAG, node_choices: NodeChoices, plan: np.ndarray, begin: np.ndarray,
                     finish: np.ndarray, latency_s: float, period_s: float) -> bool:
    """Remove the first late switch of every stage of one plan (in place); True if a clock changed."""
    changed = False
    freqs = node_choices.node_freqs(plan)
    for stage in range(dag.schedule.num_stages):
        lo, hi = int(dag.stage_offsets[stage]), int(dag.stage_offsets[stage + 1])
        late = late_switches(begin[lo:hi], finish[lo:hi], freqs[lo:hi], latency_s, period_s)
        if late:
            changed |= _merge(node_choices, plan, freqs[lo:hi], lo, late[0])
    return changed


def _merge(node_choices: NodeChoices, plan: np.ndarray, clocks: np.ndarray, offset: int, late: Switch) -> bool:
    """Of the two merges that remove ``late`` (its run into the one before, or that one into its
    own predecessor, which makes room), apply the one that costs less; True if a clock changed."""
    n = len(clocks)
    before = _run(clocks, (late.index - 1) % n)
    options = [(before, _run(clocks, late.index)), (_run(clocks, (before[0] - 1) % n), before)]
    best: tuple[float, np.ndarray] | None = None
    for a, b in options:
        slower, faster = (a, b) if clocks[a[0]] < clocks[b[0]] else (b, a)
        trial = plan.copy()
        for i in _members(slower, n):
            trial[offset + i] = _at_least(node_choices, offset + i, int(clocks[faster[0]]), int(plan[offset + i]))
        extra = float(node_choices.node_costs(trial).sum() - node_choices.node_costs(plan).sum())
        if not np.array_equal(trial, plan) and (best is None or extra < best[0]):
            best = (extra, trial)
    if best is None:
        return False
    plan[:] = best[1]
    return True


def _run(clocks: np.ndarray, i: int) -> tuple[int, int]:
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
