"""Drive lowtime 0.3.0 (the solver behind the Perseus artifact) the way the artifact does.

Mirrors lowtime's ``examples/perseus.py``: per (stage, kind) ``ExecutionOption``s with unit time
1 ms and the energy as cost, ``CandidateExecutionOptions`` (Pareto filter, floor-quantised times),
cost turned into effective energy ``e − P_b·quant_time·unit``, an ``ExponentialModel`` fit, and an
activity-on-node ``networkx.DiGraph`` with ``op`` attributes and dummy entry (0) / exit (1) nodes,
solved by ``PhillipsDessouky``. Each iteration's plan (``assigned_knob`` = frequency per
instruction) is then evaluated on the *measured* profile by perseus's simulator, so lowtime and
perseus are compared on the same ground truth, not on lowtime's model predictions.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

import networkx as nx
import numpy as np

from perseus.schedules.dag import InstructionDAG
from perseus.profile import Profile
from perseus.schedules import Schedule
from perseus.timeline.simulator import simulate_plan


@dataclass(frozen=True)
class LowtimePlan:
    time_s: float  # simulated on measured values
    energy_j: float
    freqs_mhz: np.ndarray


@dataclass(frozen=True)
class LowtimeResult:
    solve_time_s: float
    plans: list[LowtimePlan]


def lowtime_available() -> bool:
    try:
        import lowtime.solver  # noqa: F401 - imported only to see that it loads
    except Exception:  # noqa: BLE001 - lowtime missing or broken: its comparison is skipped
        return False
    return True


def run_lowtime(schedule: Schedule, profile: Profile, unit_time_s: float = 0.001) -> LowtimeResult:
    """Solve with lowtime; return its solve time and every iteration's plan, evaluated on the profile."""
    from lowtime.cost_model import ExponentialModel
    from lowtime.graph_utils import add_sink_node, add_source_node
    from lowtime.operation import CandidateExecutionOptions, ExecutionOption, OperationSpec
    from lowtime.perseus.instruction import Backward, Forward
    from lowtime.solver import PhillipsDessouky

    if schedule.num_chunks != 1:
        raise ValueError("lowtime's Perseus integration supports non-interleaved schedules only")
    logging.getLogger("lowtime").setLevel(logging.WARNING)
    p_b = profile.require_p_blocking()
    dag = InstructionDAG.from_schedule(schedule)
    started = time.perf_counter()
    specs: dict[tuple[int, str], OperationSpec] = {}
    for stage in range(schedule.num_stages):
        for kind in ("forward", "backward"):
            measured = profile.get(stage, kind)
            options = [
                ExecutionOption[int](real_time=t, unit_time=unit_time_s, cost=e, knob=int(f))
                for f, t, e in zip(measured.freqs_mhz, measured.times_s, measured.energies_j)
            ]
            candidates = CandidateExecutionOptions[int](options=options)
            for option in candidates.options:
                option.cost -= p_b * option.quant_time * option.unit_time
            specs[(stage, kind)] = OperationSpec[int](options=candidates, cost_model=ExponentialModel(candidates))

    graph = nx.DiGraph()
    ops = []
    for v, (stage, inst) in enumerate(zip(dag.node_stage.tolist(), dag.instructions)):
        cls = Forward if inst.kind == "forward" else Backward
        op = cls(spec=specs[(stage, inst.kind)], stage_id=stage, micro_batch_id=inst.microbatch)
        ops.append(op)
        graph.add_node(v + 2, op=op)
    for u, w in zip(dag.edge_src.tolist(), dag.edge_dst.tolist()):
        graph.add_edge(u + 2, w + 2)
    add_source_node(graph, 0)
    add_sink_node(graph, 1)
    graph.graph["source_node"] = 0
    graph.graph["sink_node"] = 1

    knobs: list[np.ndarray] = []
    for _ in PhillipsDessouky(graph).run():
        knobs.append(np.array([op.assigned_knob for op in ops], dtype=np.int64))
    solve_time = time.perf_counter() - started
    plans = []
    for freqs in knobs:
        timeline = simulate_plan(dag, profile, freqs)
        plans.append(LowtimePlan(timeline.time_s, timeline.energy_j, freqs))
    return LowtimeResult(solve_time, plans)


def best_at(plans: list[LowtimePlan], max_time_s: float) -> LowtimePlan | None:
    """Least-energy lowtime plan whose measured time is within ``max_time_s``."""
    fitting = [p for p in plans if p.time_s <= max_time_s * (1 + 1e-12)]
    return min(fitting, key=lambda p: p.energy_j) if fitting else None
