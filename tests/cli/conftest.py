"""Fixtures for CLI tests: small synthetic profiles and hand-built multi-point frontiers.

The planner may return any number of points, so tests that need several build a frontier here
from simple (valid, not optimal) plans: every instruction at one clock, or only the lighter
stages slowed. Each point's time and energy are simulated on the profile, like the planner's.
"""

from __future__ import annotations

import csv
from pathlib import Path

import numpy as np
import pytest

from perseus.dag import InstructionDAG
from perseus.examples.synthetic import CSV_HEADER, example_models, synthetic_rows
from perseus.frontier import Frontier, FrontierPoint
from perseus.profile import Profile, load_csv
from perseus.schedule import Schedule, build_schedule
from perseus.simulator import max_frequency_plan, simulate_plan

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


@pytest.fixture
def small_profile_csv(tmp_path: Path) -> Path:
    return write_profile_csv(tmp_path / "prof.csv")


@pytest.fixture
def small_frontier(small_profile_csv: Path) -> Frontier:
    profile = load_csv(small_profile_csv, P_BLOCKING)
    return heuristic_frontier(build_schedule("1f1b", 2, 4), profile)


@pytest.fixture
def small_frontier_file(tmp_path: Path, small_frontier: Frontier, small_profile_csv: Path) -> Path:
    small_frontier.metadata["profile"] = str(small_profile_csv)
    path = tmp_path / "frontier.json"
    small_frontier.save(path)
    return path
