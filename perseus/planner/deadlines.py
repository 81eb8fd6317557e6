"""Deadline search: LP anchors, discrete repair, beam search, local improvement, filtering.

1. Solve the hull LP at ``num_anchors`` deadlines spread over [fastest, slowest] plus the
   all-max-frequency time (warm-started dual simplex; only the deadline changes).
2. Between adjacent anchors, interpolate the LP durations (a convex combination of two LP optima
   is feasible for the interpolated deadline and exact inside one linear piece of the LP's value
   curve), giving ``num_deadlines`` continuous targets in total.
3. Round every target to choices with carry, forward and backward, then fill slack — all
   deadlines at once, one topological level per numpy step.
4. Small pipelines: LP-guided beam search (``planner.beam``) at strong and fill deadlines.
5. Improve plans above the LP bound by block potential descent (and, on small pipelines, carry
   each deadline's best plan to it and descend again).
6. Exact window search on the anchor plans farthest above the LP bound (time-boxed; only where
   the beam did not run).
7. Keep the plans of less cost than every faster plan over all candidates (simulated by
   ``perseus.timeline.simulator.simulate_many``): the frontier's points and paced points.

Above ``lp_max_nodes`` instructions a price sweep (``planner.prices``) replaces step 1 and steps
4–6 do not run (no LP bound). Anchor and deadline counts shrink with size, and repair and
simulation run in row chunks (``PlannerOptions.anchors_for``, ``deadlines_for``, ``batch_rows``).
"""
from __future__ import annotations

import queue
import threading
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable

import numpy as np

from perseus.schedules.dag import InstructionDAG, LevelGraph
from perseus.planner.beam import beam_plans
from perseus.planner.neighbourhood import WindowSearch
from perseus.planner.choices import NodeChoices
from perseus.planner.potentials import PotentialDescent
from perseus.planner.prices import price_anchors, spread_float
from perseus.planner.relaxation import HullRelaxation

if TYPE_CHECKING:
    from perseus.planner.flow_lp import FlowRelaxation
from perseus.planner.repair import DEADLINE_MARGIN, LevelChooser
from perseus.planner.settings import PlannerOptions
from perseus.timeline.simulator import simulate_many

Progress = Callable[[float], None]


@dataclass(frozen=True)
class Candidates:
    """Discrete plans (choice indices) with their iteration times and energies, by time."""

    choices: np.ndarray  # (k, n)
    times_s: np.ndarray
    energies_j: np.ndarray
    costs: np.ndarray  # energy minus blocking power over the iteration: what a wait cannot change

    def best_within(self, limits: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Per limit: index of the least-energy plan no slower than it (−1 if none) and that
        energy (+inf if none). Needs time-sorted candidates (``pareto`` output)."""
        at = np.searchsorted(self.times_s, np.asarray(limits) * (1 + 1e-12), side="right") - 1
        running = np.minimum.accumulate(self.energies_j)
        best = np.maximum.accumulate(np.where(self.energies_j <= running, np.arange(len(running)), 0))
        index = np.where(at >= 0, best[np.maximum(at, 0)], -1)
        return index, np.where(at >= 0, running[np.maximum(at, 0)], np.inf)


def evaluate(
    dag: InstructionDAG, node_choices: NodeChoices, choices: np.ndarray, p_blocking_w: float, rows: int | None = None
) -> Candidates:
    """Every plan simulated on its measured choice values (the one simulator, batched).

    ``rows``: plans per simulated batch (memory bound on large pipelines; same numbers).
    """
    rows = len(choices) if rows is None else max(int(rows), 1)
    times, energies = np.empty(len(choices)), np.empty(len(choices))
    for a in range(0, len(choices), rows):
        part = choices[a : a + rows]
        result = simulate_many(dag, node_choices.node_times(part), node_choices.node_energies(part), p_blocking_w)
        times[a : a + rows], energies[a : a + rows] = result.time_s, result.energy_j
    idle_w = p_blocking_w * dag.schedule.num_stages
    return Candidates(choices, times, energies, energies - idle_w * times)


def repair(chooser: LevelChooser, targets: np.ndarray, deadlines: np.ndarray, rows: int) -> np.ndarray:
    """Round ``targets`` with carry and fill slack, ``rows`` deadlines per numpy batch.

    Rows are independent, so chunking changes nothing but peak memory (float temporaries of
    rows × instructions instead of all deadlines × instructions).
    """
    out = np.empty(targets.shape, dtype=np.int64)
    for a in range(0, len(targets), max(int(rows), 1)):
        b = a + max(int(rows), 1)
        out[a:b] = chooser.fill_slack(chooser.round_with_carry(targets[a:b], deadlines[a:b]), deadlines[a:b])
    return out


def pareto(c: Candidates) -> Candidates:
    """Plans of strictly less cost than every faster plan, fastest first.

    Cost (energy minus blocking power × stages × time) rather than energy: a plan that needs
    more energy than a faster one at its own pace still needs less when both iterations last as
    long as it (waiting for a straggler), so it stays a candidate. The plans with less energy
    than every faster plan are a subset of these (``own_pace``).
    """
    order = np.lexsort((c.costs, c.times_s))
    costs = c.costs[order]
    keep = np.ones(len(order), dtype=bool)
    if len(order) > 1:
        keep[1:] = costs[1:] < np.minimum.accumulate(costs)[:-1] - 1e-12 * np.abs(costs[1:])
    idx = order[keep]
    return Candidates(c.choices[idx], c.times_s[idx], c.energies_j[idx], c.costs[idx])


def own_pace(c: Candidates) -> np.ndarray:
    """Mask of the (time-sorted) candidates with strictly less energy than every faster one."""
    keep = np.ones(len(c.energies_j), dtype=bool)
    if len(keep) > 1:
        keep[1:] = c.energies_j[1:] < np.minimum.accumulate(c.energies_j)[:-1] * (1 - 1e-12)
    return keep


def search_deadlines(
    dag: InstructionDAG,
    node_choices: NodeChoices,
    p_blocking_w: float,
    extra_deadlines: list[float],
    options: PlannerOptions,
    progress: Progress,
    dense_improve_max_nodes: int = 48,
    beam_gap: float = 5e-4,
) -> Candidates:
    """Candidate plans over deadlines spread across [fastest, slowest] (steps 1–7 above)."""
    n = dag.num_nodes
    num_anchors, num_deadlines = options.anchors_for(n), options.deadlines_for(n)
    batch = options.batch_rows(n)
    improve_sweeps, max_block, improve_time_s = options.improve_sweeps, options.max_block, options.improve_time_s
    search_time_s, search_gap, max_window = options.search_time_s, options.search_gap, options.max_window
    search_windows = options.search_windows
    beam_max_width, beam_deadlines, beam_fill = options.beam_max_width, options.beam_deadlines, options.beam_fill
    graph = dag.levels
    chooser = _chooser(graph, node_choices, options)
    extremes = np.stack([np.zeros(n, dtype=np.int64), node_choices.slowest_choice()])
    t_fast, t_slow = evaluate(dag, node_choices, extremes, p_blocking_w).times_s.tolist()

    if not options.lp_runs_on(n):
        # Too large for the LP: price-sweep targets, repaired densely; no LP bound, so no
        # bound-driven improvement either (docs/planner.md, "At scale").
        anchors, targets = price_anchors(dag, node_choices, options.num_anchors, extra_deadlines)
        deadlines, all_targets = _interpolate(anchors, targets, num_deadlines)
        slowest = node_choices.node_times(node_choices.slowest_choice())
        for a in range(0, len(deadlines), batch):
            part = slice(a, a + batch)
            all_targets[part] = spread_float(dag, all_targets[part], deadlines[part] * (1 - DEADLINE_MARGIN), slowest)
        progress(0.5)
        plans = [repair(chooser, all_targets, deadlines, batch)]
        plans.append(chooser.fill_slack(np.zeros((1, n), dtype=np.int64), np.array([t_fast])))
        progress(0.9)
        found = pareto(evaluate(dag, node_choices, np.concatenate(plans), p_blocking_w, batch))
        progress(0.95)
        return found

    beam_width = options.beam_width if options.beam_runs_on(n) else 0
    anchors = np.unique(np.concatenate([np.linspace(t_fast, t_slow, max(num_anchors, 2)), extra_deadlines]))
    anchors = anchors[(anchors >= t_fast) & (anchors <= t_slow)]
    relaxation, order = _relaxation(dag, node_choices, options, len(anchors))
    idle_w = p_blocking_w * dag.schedule.num_stages
    descent_until = time.perf_counter() + improve_time_s  # a safety cap only: the sweeps bound the work
    flowed = not isinstance(relaxation, HullRelaxation)
    if isinstance(relaxation, HullRelaxation):
        targets, lp_costs, lp_slopes = _solve_anchors(relaxation, anchors, order, progress)
        deadlines, all_targets = _interpolate(anchors, targets, num_deadlines)
        plans = [repair(chooser, all_targets, deadlines, batch)]
        plans.append(chooser.fill_slack(chooser.round_with_carry_backward(targets, anchors), anchors))
    else:
        # Network simplex: its pivots run on a worker thread without the GIL while this thread
        # repairs every interval whose two anchors are solved and improves each anchor's plans as
        # soon as it is solved (identical rows; the block descent is compiled and GIL-free too).
        descents: list[PotentialDescent] = []

        def anchor_work(i: int, plan: np.ndarray, target: np.ndarray, lp_cost: float) -> np.ndarray:
            """Anchor i's backward-rounded plan, and both its plans descended when the better
            of them is more than ``search_gap`` above the LP bound there."""
            limit = anchors[i : i + 1]
            backward = chooser.fill_slack(chooser.round_with_carry_backward(target[None], limit), limit)
            if improve_sweeps == 0:
                return backward
            pair = np.concatenate([plan[None], backward])
            bound = lp_cost + idle_w * anchors[i] * (1 - DEADLINE_MARGIN)
            if evaluate(dag, node_choices, pair, p_blocking_w).energies_j.min() / bound - 1 <= search_gap:
                return backward
            if not descents:  # built here, while the worker thread already pivots
                descents.append(_descent(dag, node_choices, max_block, small=False))
            # Both: descending only the better one lost 3 J on average over the 16 × 128 frontier.
            improved = _descend(descents[0], chooser, pair, np.repeat(limit, 2), improve_sweeps, descent_until)
            return np.concatenate([backward, improved])

        deadlines, dense = _solve_anchors_repairing(relaxation, anchors, order, num_deadlines, chooser, batch, progress,
                                                    anchor_work)
        targets, lp_costs, lp_slopes, plans = dense[0], dense[1], dense[2], [dense[3], dense[4]]
    progress(0.6)
    # All-fastest plan with its free slack filled: the fastest achievable iteration.
    plans.append(chooser.fill_slack(np.zeros((1, n), dtype=np.int64), np.array([t_fast])))
    progress(0.7)

    found = pareto(evaluate(dag, node_choices, np.concatenate(plans), p_blocking_w, batch))
    # LP value + blocking energy at a deadline: a lower bound on the energy of plans ending then.
    bounds = lp_costs + idle_w * anchors * (1 - DEADLINE_MARGIN)
    lp_bound = _LPBound(anchors, lp_costs, lp_slopes, idle_w)
    small = dag.num_nodes <= dense_improve_max_nodes
    beamed = beam_width > 0
    if beamed:
        # Strong rows (anchors and energy-spaced deadlines) double their width while it pays;
        # fill rows, evenly spaced in time at the base width, cover the frontier between them
        # (each row ends with many good plans just shorter than its deadline).
        lp_floor = t_fast + 0.01 * (t_slow - t_fast)
        strong = _beam_deadlines(anchors, bounds, beam_deadlines)
        fill = np.linspace(t_fast, t_slow, beam_fill + 2)[1:-1]
        for rows, max_width in ((strong, beam_max_width), (fill, beam_width)):
            # Rows already within `beam_gap` of the LP bound are provably near-optimal: skip them.
            rows = rows[lp_bound.gaps(found, rows) > beam_gap]
            flows = _edge_flows(relaxation, rows, lp_floor)
            built = beam_plans(dag, node_choices, rows, flows, p_blocking_w, beam_width, max_width)
            found = pareto(evaluate(dag, node_choices, np.concatenate([found.choices, built]), p_blocking_w))
    progress(0.75)
    # Local improvement only where the rounded plans are measurably above the LP bound: near-optimal
    # anchors (most of them on real profiles) cost nothing, so the work scales with what is left.
    # (On the network-simplex path this was done anchor by anchor beside the LP sweep.)
    open_anchors = np.flatnonzero(_anchor_gaps(found, anchors, bounds)[1] > search_gap) if not flowed else np.zeros(0, int)
    # Between anchors, dense plans above the LP tangent bound are improved too, on small pipelines
    # only: each descent pass is ~n Python-level moves, so on large ones it would dominate.
    dense_rows = open_anchors  # the anchor rows of the dense plans
    if small:
        dense_rows = lp_bound.open_rows(found, deadlines, search_gap)
    descent = None
    if improve_sweeps > 0 and (len(open_anchors) or len(dense_rows)):
        descent = _descent(dag, node_choices, max_block, small)
        anchor_plans = np.concatenate([plans[0][dense_rows], plans[1][open_anchors]])
        anchor_deadlines = np.concatenate([deadlines[dense_rows], anchors[open_anchors]])
        improved = _descend(descent, chooser, anchor_plans, anchor_deadlines, improve_sweeps, descent_until)
        found = pareto(evaluate(dag, node_choices, np.concatenate([found.choices, improved]), p_blocking_w))
    progress(0.8)
    # Window MILPs re-optimise a few instructions around a plan; the beam already searched those
    # combinations (and more). On network-simplex pipelines (4,096+ instructions) each window
    # costs ~40 ms and 200 of them gained 0.0007 % at 4,096 instructions (docs/planner.md): skipped.
    if search_time_s > 0 and search_windows > 0 and not beamed and not flowed:
        found = _search_windows(dag, node_choices, chooser, found, anchors, deadlines, bounds, p_blocking_w, search_windows,
                                search_time_s, search_gap, max_window)
    if small and descent is not None:
        # Carry every deadline's best plan so far (often found at a nearby deadline, by descent or
        # a window) to the deadline itself: slack-fill it there and descend again.
        rows = lp_bound.open_rows(found, deadlines, search_gap)
        shrunk = deadlines[rows] * (1 - DEADLINE_MARGIN)
        at = np.maximum(np.searchsorted(found.times_s, shrunk * (1 + 1e-12), side="right") - 1, 0)
        carried = chooser.fill_slack(found.choices[at], deadlines[rows])
        improved = _descend(descent, chooser, carried, deadlines[rows], improve_sweeps, descent_until)
        found = pareto(evaluate(dag, node_choices, np.concatenate([found.choices, carried, improved]), p_blocking_w))
    progress(0.95)
    return found


def _chooser(graph: LevelGraph, node_choices: NodeChoices, options: PlannerOptions) -> LevelChooser:
    """The repair's passes: compiled on large pipelines (same results), numpy level steps otherwise."""
    if options.compiled_runs_on(graph.num_nodes):
        from perseus.planner.compiled_repair import CompiledChooser  # numba: imported only where it runs

        return CompiledChooser(graph, node_choices)
    return LevelChooser(graph, node_choices)


def _descent(dag: InstructionDAG, node_choices: NodeChoices, max_block: int, small: bool) -> PotentialDescent:
    """Block descent: numpy on small pipelines (with neighbour-set moves), compiled (numba, same
    moves, exact per move, ~10× faster: ``planner.compiled_descent``) on the others."""
    if small:
        return PotentialDescent(dag, node_choices, max_block=max_block, neighbour_sets=True)
    from perseus.planner.compiled_descent import CompiledDescent  # numba: imported only where it runs

    return CompiledDescent(dag, node_choices, max_block=max_block)


def _relaxation(
    dag: InstructionDAG, node_choices: NodeChoices, options: PlannerOptions, num_anchors: int
) -> tuple[HullRelaxation | FlowRelaxation, range]:
    """The hull LP's solver for this pipeline and the order to visit the anchors in.

    HiGHS up to ``flow_min_nodes`` instructions (fastest-first, as always: small pipelines keep
    their exact results); above, the network simplex on the LP's dual circulation, slowest
    deadline first (it starts from the all-slowest plan's tree, optimal there).
    """
    if options.flow_runs_on(dag.num_nodes):
        from perseus.planner.flow_lp import FlowRelaxation  # numba: imported only where it runs

        return FlowRelaxation(dag, node_choices), range(num_anchors - 1, -1, -1)
    return HullRelaxation(dag, node_choices), range(num_anchors)


def _solve_anchors(
    relaxation: HullRelaxation | FlowRelaxation, anchors: np.ndarray, order: range, progress: Progress
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(LP durations, LP values, LP slopes) at every anchor, solved in ``order``."""
    targets = np.empty((len(anchors), relaxation.num_nodes))
    lp_costs = np.empty(len(anchors))
    lp_slopes = np.empty(len(anchors))
    for done, i in enumerate(order):
        # Solve slightly inside the deadline so float rounding never pushes a plan past it.
        targets[i], lp_costs[i] = relaxation.solve(anchors[i] * (1 - DEADLINE_MARGIN))
        lp_slopes[i] = min(relaxation.deadline_slope(), 0.0)
        progress(0.5 * (done + 1) / len(anchors))
    return targets, lp_costs, lp_slopes


def _solve_anchors_repairing(
    relaxation: FlowRelaxation,
    anchors: np.ndarray,
    order: range,
    num_deadlines: int,
    chooser: LevelChooser,
    batch: int,
    progress: Progress,
    anchor_work: Callable[[int, np.ndarray, np.ndarray, float], np.ndarray] | None = None,
) -> tuple[np.ndarray, tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]]:
    """``_solve_anchors`` on a worker thread, slowest anchor first, while this thread repairs
    each interval as soon as both its anchors are solved and runs ``anchor_work(i, anchor plan,
    LP durations, LP value)`` on each anchor. Same rows as ``_interpolate`` then ``repair``:
    deadlines, (targets, LP values, LP slopes, repaired plans, the anchors' extra plans)."""
    deadlines, lower, upper, fraction = _dense_layout(anchors, num_deadlines)
    finished: queue.Queue = queue.Queue()
    targets = np.empty((len(anchors), relaxation.num_nodes))
    lp_costs = np.empty(len(anchors))
    lp_slopes = np.empty(len(anchors))

    def solve_all() -> None:
        try:
            for i in order:
                durations, lp_costs[i] = relaxation.solve(anchors[i] * (1 - DEADLINE_MARGIN))
                lp_slopes[i] = min(relaxation.deadline_slope(), 0.0)
                finished.put((i, durations))
        except BaseException as exc:  # noqa: BLE001 - re-raised on the planning thread
            finished.put(exc)

    plans = np.empty((len(deadlines), relaxation.num_nodes), dtype=np.int64)
    extra = [np.zeros((0, relaxation.num_nodes), dtype=np.int64)]
    worker = threading.Thread(target=solve_all, name="perseus-flow-lp", daemon=True)
    worker.start()
    for done in range(len(anchors)):
        item = finished.get()
        if isinstance(item, BaseException):
            raise item
        i, targets[i] = item
        rows = np.flatnonzero(lower == i)  # its upper anchor was solved before it
        row_targets = targets[lower[rows]] + fraction[rows, None] * (targets[upper[rows]] - targets[lower[rows]])
        plans[rows] = repair(chooser, row_targets, deadlines[rows], batch)
        if anchor_work is not None:
            extra.append(anchor_work(i, plans[i], targets[i], float(lp_costs[i])))  # row i: the anchor itself
        progress(0.55 * (done + 1) / len(anchors))
    worker.join()
    return deadlines, (targets, lp_costs, lp_slopes, plans, np.concatenate(extra))


def _dense_layout(anchors: np.ndarray, num_deadlines: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Rows of the dense deadlines: (deadline, lower anchor, upper anchor, fraction) per row.

    The anchors first, then for each fraction one row per interval between neighbours,
    ~``num_deadlines`` rows in all.
    """
    count = len(anchors)
    per_gap = max(0, int(np.ceil(num_deadlines / max(count - 1, 1))) - 1) if count > 1 else 0
    fractions = np.arange(1, per_gap + 1) / (per_gap + 1)
    lower = np.concatenate([np.arange(count)] + [np.arange(count - 1)] * per_gap).astype(np.int64)
    upper = np.concatenate([np.arange(count)] + [np.arange(1, count)] * per_gap).astype(np.int64)
    fraction = np.concatenate([np.zeros(count)] + [np.full(count - 1, f) for f in fractions])
    deadlines = anchors[lower] + fraction * (anchors[upper] - anchors[lower])
    return deadlines, lower, upper, fraction


def _interpolate(anchors: np.ndarray, targets: np.ndarray, num_deadlines: int) -> tuple[np.ndarray, np.ndarray]:
    """Anchors plus evenly interpolated deadlines and targets between neighbours, ~``num_deadlines`` in all.

    A convex combination of two anchors' durations meets the same combination of their deadlines.
    """
    deadlines, lower, upper, fraction = _dense_layout(anchors, num_deadlines)
    return deadlines, targets[lower] + fraction[:, None] * (targets[upper] - targets[lower])


def _descend(
    descent: PotentialDescent, chooser: LevelChooser, plans: np.ndarray, deadlines: np.ndarray, sweeps: int, until: float
) -> np.ndarray:
    """Block descent from the plans' earliest starts, then slack filling, at the given deadlines."""
    limits = deadlines * (1 - DEADLINE_MARGIN)
    durations = chooser.node_choices.node_times(plans)
    starts = chooser.graph.finish_times(durations)[:, : plans.shape[1]] - durations
    starts = descent.improve(starts, limits, sweeps=sweeps, time_limit_s=max(until - time.perf_counter(), 0.0))
    return chooser.fill_slack(descent.plan(starts, limits), limits)


def _search_windows(
    dag: InstructionDAG,
    node_choices: NodeChoices,
    chooser: LevelChooser,
    found: Candidates,
    anchors: np.ndarray,
    deadlines: np.ndarray,
    bounds: np.ndarray,
    p_blocking_w: float,
    max_windows: int,
    time_budget_s: float,
    min_gap: float,
    max_window: int,
) -> Candidates:
    """Exact window search on the anchor plans farthest above the LP bound: at most
    ``max_windows`` MILPs in all, shared evenly over the anchors in that order (what one leaves
    goes to the next); ``time_budget_s`` is a safety cap.

    Each improved anchor plan is then slack-filled at every denser deadline up to the next anchor
    (cheap, batched), so the gain carries over to the frontier between anchors.
    """
    stop_at = time.perf_counter() + time_budget_s
    at, gaps = _anchor_gaps(found, anchors, bounds)
    limits = anchors * (1 - DEADLINE_MARGIN)
    order = [i for i in np.argsort(-gaps).tolist() if gaps[i] > min_gap]
    if not order:
        return found
    search = WindowSearch(dag, node_choices, max_window=max_window)
    extra_plans, extra_deadlines = [], []
    left = max_windows
    for done, i in enumerate(order):
        if left <= 0 or time.perf_counter() > stop_at:
            break
        plan = found.choices[at[i]]
        share = -(-left // (len(order) - done))  # ceiling: the budget is spent whatever the order's length
        improved, solved = search.improve(plan, float(limits[i]), share, time_limit_s=stop_at - time.perf_counter())
        left -= solved
        if np.array_equal(improved, plan):
            continue
        upper = anchors[i + 1] if i + 1 < len(anchors) else anchors[i]
        span = deadlines[(deadlines >= anchors[i]) & (deadlines <= upper)]
        extra_plans.append(np.repeat(improved[None], len(span), axis=0))
        extra_deadlines.append(span)
    if not extra_plans:
        return found
    spans = np.concatenate(extra_deadlines)
    filled = chooser.fill_slack(np.concatenate(extra_plans), spans)
    return pareto(evaluate(dag, node_choices, np.concatenate([found.choices, filled]), p_blocking_w))


def _anchor_gaps(found: Candidates, anchors: np.ndarray, bounds: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per anchor: index of the least-energy found plan within its deadline (−1 if none) and
    that plan's relative excess over the LP lower bound (−inf if none).

    Any plan within anchor i's deadline ends at some anchor-bracketed time ≤ it, so its energy is
    at least about the least bound over anchors up to i (exact at anchor times).
    """
    at, best = found.best_within(anchors * (1 - DEADLINE_MARGIN))
    least = np.minimum.accumulate(bounds)
    return at, np.where(at >= 0, best / least - 1, -np.inf)


@dataclass(frozen=True)
class _LPBound:
    """Lower bounds on the energy of any plan meeting a deadline, from the LP at the anchors.

    The LP value is convex and non-increasing in the deadline, so the tangents at the two
    neighbouring anchors bound it from below, and so does its value at the slowest anchor;
    blocking power over the deadline is added on top.
    """

    anchors: np.ndarray
    lp_costs: np.ndarray
    lp_slopes: np.ndarray
    idle_w: float  # P_blocking × stages

    def energy(self, limits: np.ndarray) -> np.ndarray:
        solved = self.anchors * (1 - DEADLINE_MARGIN)
        hi = np.minimum(np.searchsorted(solved, limits, side="left"), len(solved) - 1)
        lo = np.maximum(hi - 1, 0)
        costs, slopes = self.lp_costs, self.lp_slopes
        tangent = np.maximum(costs[lo] + slopes[lo] * (limits - solved[lo]), costs[hi] + slopes[hi] * (limits - solved[hi]))
        return np.maximum(tangent, costs[-1]) + self.idle_w * limits

    def gaps(self, found: Candidates, deadlines: np.ndarray) -> np.ndarray:
        """Relative excess of the best found plan at each deadline over the bound there; +inf
        where no found plan meets the deadline."""
        shrunk = deadlines * (1 - DEADLINE_MARGIN)
        return found.best_within(shrunk)[1] / self.energy(shrunk) - 1

    def open_rows(self, found: Candidates, deadlines: np.ndarray, min_gap: float) -> np.ndarray:
        """Rows of ``deadlines`` that have a found plan more than ``min_gap`` above the bound."""
        gaps = self.gaps(found, deadlines)
        return np.flatnonzero(np.isfinite(gaps) & (gaps > min_gap))


def _beam_deadlines(anchors: np.ndarray, bounds: np.ndarray, count: int) -> np.ndarray:
    """The anchors plus ``count`` deadlines evenly spaced in *energy* along the LP bound.

    The frontier falls steeply near the fastest time and flattens towards the slowest, so equal
    energy steps put the beam's deadlines where consecutive optimal plans differ most.
    """
    envelope = np.minimum.accumulate(bounds)  # non-increasing in the deadline
    levels = np.linspace(envelope[0], envelope[-1], count)
    spaced = np.interp(-levels, -envelope, anchors)  # np.interp needs increasing x
    return np.unique(np.concatenate([anchors, spaced]))


def _edge_flows(relaxation: HullRelaxation | FlowRelaxation, deadlines: np.ndarray, lp_floor: float) -> np.ndarray:
    """LP dual edge flows at every deadline (the beam's prices).

    At the fastest deadline the LP is degenerate (its slope is unbounded there and the duals are
    arbitrary), so deadlines closer to it than ``lp_floor`` take the flows at ``lp_floor``.
    """
    flows = []
    for deadline in deadlines:
        relaxation.solve(max(float(deadline) * (1 - DEADLINE_MARGIN), lp_floor))
        flows.append(relaxation.edge_flows())
    return np.asarray(flows)
