"""Plans that a GPU with a clock-switch latency can actually run.

The planner's model switches the clock the instant an instruction starts. A real switch lands
some milliseconds after it is asked for (even asked for as early as the runtime can, when the
previous instruction ends), so an instruction shorter than that latency runs at the clock before
it, whatever its plan says. Two cases:

- the plan slows down for that instruction: it will run faster than planned anyway, so the
  switch is pointless (and would land on the next instruction): the plan keeps the earlier clock;
- the plan speeds up for it: running at the earlier, slower clock could slow the critical path,
  so the earlier instruction is raised to the faster clock, and the switch happens before it.

A third case is about energy, not time: a switch down only pays off when what it saves on its
instruction covers what the switch costs. ``switch_pays_off`` takes that cost as the latency spent
at a given power (``PlannerOptions.switch_cost_w``; the blocking power is the conservative value
the issue suggests); a switch down that saves less (in the planner's effective cost ``e − P_b·t``)
keeps the earlier, faster clock too. Off (0 W) by default: the simulated GPU's switches cost no
energy, and there the rule only gives saving away (docs/runtime.md has the numbers).

All three only ever raise clocks, so a plan never gets slower than its frontier point said; energy
may rise a little, and the frontier is re-filtered on the changed plans. With latency 0 nothing
moves.
"""

from __future__ import annotations

import numpy as np

from perseus.dag import InstructionDAG
from perseus.planner.choices import NodeChoices


def switch_pays_off(saving_j: np.ndarray | float, latency_s: float, switch_cost_w: float) -> np.ndarray:
    """Whether switching down for an instruction saves more than the switch costs (``latency_s`` at
    ``switch_cost_w``); ``saving_j``: the instruction's effective cost at the earlier clock minus at its own."""
    return np.asarray(saving_j) > latency_s * switch_cost_w


def hold_through_short_switches(dag: InstructionDAG, node_choices: NodeChoices, choices: np.ndarray,
                                latency_s: float, switch_cost_w: float = 0.0) -> np.ndarray:
    """Choice indices ``(plans, nodes)`` with no clock change on an instruction shorter than
    ``latency_s``, and no switch down that does not pay off at ``switch_cost_w`` (``switch_pays_off``)."""
    if latency_s <= 0 or choices.size == 0:
        return choices
    out = choices.copy()
    for stage in range(dag.schedule.num_stages):
        nodes = np.flatnonzero(dag.node_stage == stage)
        # Raising an earlier instruction can put a switch on the one before it: repeat until no
        # pair changes (clocks only rise, so this ends; at worst one clock for the whole stage).
        while _hold_pass(node_choices, nodes, out, latency_s, switch_cost_w):
            pass
    return out


def _hold_pass(node_choices: NodeChoices, nodes: np.ndarray, out: np.ndarray, latency_s: float,
               switch_cost_w: float) -> bool:
    """One forward pass over a stage's consecutive pairs; True if any plan changed."""
    changed = False
    for prev, node in zip(nodes[:-1], nodes[1:]):
        f_prev = _column(node_choices.freqs, node_choices, prev, out)
        f_node = _column(node_choices.freqs, node_choices, node, out)
        short = (f_node != f_prev) & (_column(node_choices.times, node_choices, node, out) < latency_s)
        down_all = f_node < f_prev
        if switch_cost_w > 0 and down_all.any():
            # The node's effective cost held at the earlier clock, minus at its own: the switch's benefit.
            held = _at_least(node_choices, node, f_prev, out[:, node])
            table = node_choices.node_table[node]
            saving = node_choices.costs[table, held] - node_choices.costs[table, out[:, node]]
            short = short | (down_all & ~switch_pays_off(saving, latency_s, switch_cost_w))
        if not short.any():
            continue
        down = short & (f_node < f_prev)  # keep the earlier, faster clock on this one
        up = short & (f_node > f_prev)  # raise the earlier one to this faster clock
        before = out[:, [prev, node]].copy()
        out[down, node] = _at_least(node_choices, node, f_prev[down], out[down, node])
        out[up, prev] = _at_least(node_choices, prev, f_node[up], out[up, prev])
        changed = changed or bool((out[:, [prev, node]] != before).any())
    return changed


def _column(values: np.ndarray, node_choices: NodeChoices, node: int, choices: np.ndarray) -> np.ndarray:
    """One node's value (clock, time) under every plan."""
    return values[node_choices.node_table[node], choices[:, node]]


def _at_least(node_choices: NodeChoices, node: int, freqs_mhz: np.ndarray, current: np.ndarray) -> np.ndarray:
    """Per plan, the slowest choice of ``node`` at least as fast as ``freqs_mhz`` (never slower than now)."""
    table = node_choices.node_table[node]
    table_freqs = node_choices.freqs[table, : node_choices.num_choices[table]]  # choices fastest first
    ok = table_freqs[None, :] >= freqs_mhz[:, None]
    slowest_ok = ok.shape[1] - 1 - np.argmax(ok[:, ::-1], axis=1)  # last choice with a clock high enough
    return np.minimum(current, np.where(ok.any(axis=1), slowest_ok, 0))
