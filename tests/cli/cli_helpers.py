"""Helpers for CLI tests: small synthetic profiles and hand-built frontiers.

The planner may return any number of points, so tests that need several build a frontier here
from simple (valid, not optimal) plans, simulated on the profile like the planner's; others use
round numbers so expected results can be worked out by hand.
"""

from __future__ import annotations

import csv
from pathlib import Path

import numpy as np

from perseus.schedules.dag import InstructionDAG
from perseus.examples.synthetic import CSV_HEADER, example_models, synthetic_rows
from perseus.frontier import Frontier, FrontierPoint
from perseus.profile import Profile
from perseus.schedules import Schedule, build_schedule
from perseus.timeline.simulator import max_frequency_plan, simulate_plan


def hand_frontier(
    times=(1.0, 1.1, 1.25),
    energies=(90.0, 80.0, 75.0),
    baseline=(1.0, 100.0),
    p_blocking=10.0,
    stages=2,
    microbatches=2,
) -> Frontier:
    """Frontier of a ``stages`` x ``microbatches`` 1F1B pipeline with the given (time, energy) points."""
    schedule = build_schedule("1f1b", stages, microbatches)
    points = [
        FrontierPoint(t, e, np.full(schedule.num_instructions, 1400 - 100 * i, dtype=np.int64))
        for i, (t, e) in enumerate(zip(times, energies))
    ]
    return Frontier(schedule, p_blocking, baseline[0], baseline[1], points, gpu_name="hand")


SMALL_FREQS = (1410, 1200, 1000, 800)
P_BLOCKING = 80.0


def write_profile_csv(path: Path, num_stages: int = 2, freqs=SMALL_FREQS) -> Path:
    with path.open("w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(CSV_HEADER)
        writer.writerows(synthetic_rows(example_models(num_stages), freqs, 75.0))
    return path


def heuristic_frontier(schedule: Schedule, profile: Profile) -> Frontier:
    """Pareto-filtered simple plans: uniform clocks, and all-but-the-last stage slowed."""
    dag = InstructionDAG.from_schedule(schedule)
    base_freqs = max_frequency_plan(dag, profile)
    base = simulate_plan(dag, profile, base_freqs)
    last = dag.node_stage == schedule.num_stages - 1
    candidates = []
    for f in profile.entries[(0, 0, "forward")].freqs_mhz:
        uniform = np.full(dag.num_nodes, f, dtype=np.int64)
        candidates.append(uniform)
        candidates.append(np.where(last, base_freqs, uniform))
    points = []
    for freqs in candidates:
        sim = simulate_plan(dag, profile, freqs)
        points.append(FrontierPoint(sim.time_s, sim.energy_j, freqs))
    points.sort(key=lambda p: (p.time_s, p.energy_j))
    pareto = []
    for p in points:
        if not pareto or p.energy_j < pareto[-1].energy_j:
            pareto.append(p)
    return Frontier(schedule, profile.require_p_blocking(), base.time_s, base.energy_j, pareto, gpu_name=profile.gpu_name)
