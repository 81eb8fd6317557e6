"""Iteration simulator: a frequency plan evaluated on measured profile values.

Every (time, energy) that perseus reports for a plan comes from here, never from a fitted model:
instruction times and energies are the profile's measured values at the planned frequencies,
instructions start as soon as their predecessors finish, and each stage draws P_blocking while
it is not computing (iteration energy = Σ instruction energy + P_blocking × Σ stage idle time).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from perseus.dag import InstructionDAG
from perseus.errors import ProfileError
from perseus.profile import Profile


@dataclass(frozen=True)
class IterationTimeline:
    """Result of simulating one iteration."""

    time_s: float
    energy_j: float
    start_s: np.ndarray  # per node
    finish_s: np.ndarray  # per node
    stage_busy_s: np.ndarray  # per stage
    stage_idle_s: np.ndarray  # per stage
    stage_energy_j: np.ndarray  # per stage, idle energy included


def longest_path_finish(dag: InstructionDAG, durations: np.ndarray) -> np.ndarray:
    """Earliest finish time of every node when each starts as soon as its predecessors finish."""
    finish = np.zeros(dag.num_nodes)
    preds = dag.predecessors
    dur = durations.tolist()
    fin = finish.tolist()
    for v in dag.topo_order.tolist():
        start = max((fin[u] for u in preds[v]), default=0.0)
        fin[v] = start + dur[v]
    return np.asarray(fin)


def simulate(dag: InstructionDAG, durations: np.ndarray, energies: np.ndarray, p_blocking_w: float) -> IterationTimeline:
    """Simulate one iteration from per-node durations (s) and energies (J)."""
    durations = np.asarray(durations, dtype=float)
    energies = np.asarray(energies, dtype=float)
    finish = longest_path_finish(dag, durations)
    time_s = float(finish.max()) if len(finish) else 0.0
    num_stages = dag.schedule.num_stages
    busy = np.bincount(dag.node_stage, weights=durations, minlength=num_stages)
    idle = time_s - busy
    stage_energy = np.bincount(dag.node_stage, weights=energies, minlength=num_stages) + p_blocking_w * idle
    return IterationTimeline(
        time_s=time_s,
        energy_j=float(stage_energy.sum()),
        start_s=finish - durations,
        finish_s=finish,
        stage_busy_s=busy,
        stage_idle_s=idle,
        stage_energy_j=stage_energy,
    )


def plan_costs(dag: InstructionDAG, profile: Profile, freqs_mhz: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Measured (durations, energies) per node for a per-node frequency plan."""
    freqs = np.asarray(freqs_mhz).tolist()
    if len(freqs) != dag.num_nodes:
        raise ProfileError(f"plan has {len(freqs)} frequencies but the pipeline has {dag.num_nodes} instructions")
    durations = np.empty(dag.num_nodes)
    energies = np.empty(dag.num_nodes)
    for v, (stage, inst, f) in enumerate(zip(dag.node_stage.tolist(), dag.instructions, freqs)):
        durations[v], energies[v] = profile.get(stage, inst.kind, inst.chunk).at(f)
    return durations, energies


def simulate_plan(dag: InstructionDAG, profile: Profile, freqs_mhz: np.ndarray) -> IterationTimeline:
    """Simulate a per-node frequency plan on the profile's measured values."""
    durations, energies = plan_costs(dag, profile, freqs_mhz)
    return simulate(dag, durations, energies, profile.require_p_blocking())


def max_frequency_plan(dag: InstructionDAG, profile: Profile) -> np.ndarray:
    """Every instruction at its highest measured frequency: the no-Perseus baseline."""
    return np.array(
        [profile.get(s, inst.kind, inst.chunk).freqs_mhz[0] for s, inst in zip(dag.node_stage.tolist(), dag.instructions)],
        dtype=np.int64,
    )
