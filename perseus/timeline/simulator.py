"""Iteration simulator: a frequency plan evaluated on measured profile values.

Every (time, energy) that perseus reports for a plan comes from here, never from a fitted model:
instruction times and energies are the profile's measured values at the planned frequencies,
instructions start as soon as their predecessors finish, and each stage draws P_blocking while
it is not computing (iteration energy = Σ instruction energy + P_blocking × Σ stage idle time).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from perseus.schedules.dag import InstructionDAG
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


@dataclass(frozen=True)
class BatchTimes:
    """Iteration time and energy of many plans simulated at once (one entry per plan)."""

    time_s: np.ndarray  # (batch,)
    energy_j: np.ndarray  # (batch,)
    finish_s: np.ndarray  # (batch, n) earliest finish per node
    stage_busy_s: np.ndarray  # (batch, stages)
    stage_energy_j: np.ndarray  # (batch, stages), idle energy included


def longest_path_finish(dag: InstructionDAG, durations: np.ndarray) -> np.ndarray:
    """Earliest finish time of every node when each starts as soon as its predecessors finish."""
    durations = np.asarray(durations, dtype=float)
    return dag.levels.finish_times(durations[None])[0, : dag.num_nodes]


def simulate_many(dag: InstructionDAG, durations: np.ndarray, energies: np.ndarray, p_blocking_w: float) -> BatchTimes:
    """Simulate a batch of plans given as per-node durations and energies, shape (batch, n).

    The longest paths run one topological level per numpy step for all plans together, so
    simulating a whole frontier costs about as much as one plan. ``simulate`` is this with a
    batch of one, so both give bit-identical numbers for the same plan.
    """
    durations = np.atleast_2d(np.asarray(durations, dtype=float))
    energies = np.atleast_2d(np.asarray(energies, dtype=float))
    n = dag.num_nodes
    if durations.shape[1] != n or energies.shape != durations.shape:
        raise ProfileError(
            f"simulate_many needs durations and energies of shape (batch, {n}); got {durations.shape} and {energies.shape}"
        )
    finish = dag.levels.finish_times(durations)[:, :n]
    time_s = finish.max(axis=1) if n else np.zeros(len(durations))
    busy = _stage_sums(dag, durations)
    compute = _stage_sums(dag, energies)
    stage_energy = compute + p_blocking_w * (time_s[:, None] - busy)
    return BatchTimes(time_s, stage_energy.sum(axis=1), finish, busy, stage_energy)


def _stage_sums(dag: InstructionDAG, values: np.ndarray) -> np.ndarray:
    """Per-stage sums of per-node values, (batch, n) → (batch, stages); empty stages sum to 0."""
    offsets = dag.stage_offsets
    out = np.zeros((values.shape[0], len(offsets) - 1))
    for s in range(len(offsets) - 1):
        out[:, s] = values[:, offsets[s] : offsets[s + 1]].sum(axis=1)
    return out


def simulate(dag: InstructionDAG, durations: np.ndarray, energies: np.ndarray, p_blocking_w: float) -> IterationTimeline:
    """Simulate one iteration from per-node durations (s) and energies (J)."""
    durations = np.asarray(durations, dtype=float)
    batch = simulate_many(dag, durations[None], np.asarray(energies, dtype=float)[None], p_blocking_w)
    time_s = float(batch.time_s[0])
    finish = batch.finish_s[0]
    busy = batch.stage_busy_s[0]
    return IterationTimeline(
        time_s=time_s,
        energy_j=float(batch.energy_j[0]),
        start_s=finish - durations,
        finish_s=finish,
        stage_busy_s=busy,
        stage_idle_s=time_s - busy,
        stage_energy_j=batch.stage_energy_j[0],
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


def plan_timelines(dag: InstructionDAG, profile: Profile, plans_mhz: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Start and finish (s) of every node of many per-node frequency plans ``(plans, n)`` on the
    profile's measured values: what each instruction's clock switch is timed by (``perseus.timeline.switch_timing``)."""
    plans = np.atleast_2d(np.asarray(plans_mhz, dtype=np.int64))
    if plans.shape[1] != dag.num_nodes:
        raise ProfileError(f"plans have {plans.shape[1]} frequencies but the pipeline has {dag.num_nodes} instructions")
    durations = np.empty(plans.shape)
    groups: dict[tuple[int, str, int], list[int]] = {}
    for v, (stage, inst) in enumerate(zip(dag.node_stage.tolist(), dag.instructions)):
        groups.setdefault((stage, inst.kind, inst.chunk), []).append(v)
    for (stage, kind, chunk), nodes in groups.items():
        entry = profile.get(stage, kind, chunk)
        freqs, times = np.asarray(entry.freqs_mhz), np.asarray(entry.times_s)
        order = np.argsort(freqs)
        asked = plans[:, nodes]
        at = np.clip(np.searchsorted(freqs[order], asked), 0, len(freqs) - 1)
        if not np.array_equal(freqs[order][at], asked):
            missing = sorted(set(asked[freqs[order][at] != asked].tolist()))
            raise ProfileError(f"stage {stage} {kind} (chunk {chunk}) has no measurement at {missing} MHz")
        durations[:, nodes] = times[order][at]
    finish = dag.levels.finish_times(durations)[:, : dag.num_nodes]
    return finish - durations, finish


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
