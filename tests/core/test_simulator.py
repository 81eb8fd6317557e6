"""The simulator is the single source of every reported (time, energy)."""

import numpy as np
import pytest

from perseus.schedules.dag import InstructionDAG
from perseus.schedules import build_schedule
from perseus.timeline.simulator import simulate


def test_two_stage_iteration_by_hand():
    # 2 stages × 2 microbatches, 1F1B. Forward 1 s, backward 2 s everywhere.
    # stage0: F0 F1 B0 B1, stage1: F0 B0 F1 B1.
    # t: F0@s0 0-1, F1@s0 1-2, F0@s1 1-2, B0@s1 2-4, F1@s1 4-5, B0@s0 4-6, B1@s1 5-7, B1@s0 7-9.
    dag = InstructionDAG.from_schedule(build_schedule("1f1b", 2, 2))
    kinds = [inst.kind for inst in dag.instructions]
    durations = np.array([1.0 if k == "forward" else 2.0 for k in kinds])
    energies = durations * 100.0  # 100 W while computing
    result = simulate(dag, durations, energies, p_blocking_w=50.0)
    assert result.time_s == pytest.approx(9.0)
    assert result.stage_busy_s.tolist() == [6.0, 6.0]
    assert result.stage_idle_s.tolist() == [3.0, 3.0]
    assert result.energy_j == pytest.approx(1200.0 + 50.0 * 6.0)
    # Stage 0's last backward waits for stage 1's.
    assert result.start_s[3] == pytest.approx(7.0)


def test_energy_formula_is_instruction_energy_plus_blocking_idle():
    dag = InstructionDAG.from_schedule(build_schedule("1f1b", 3, 4))
    rng = np.random.default_rng(0)
    durations = rng.uniform(0.5, 1.5, dag.num_nodes)
    energies = rng.uniform(50, 100, dag.num_nodes)
    r = simulate(dag, durations, energies, 80.0)
    expected = energies.sum() + 80.0 * (3 * r.time_s - durations.sum())
    assert r.energy_j == pytest.approx(expected)
    # No instruction starts before every predecessor finished.
    for u, v in zip(dag.edge_src, dag.edge_dst):
        assert r.start_s[v] >= r.finish_s[u] - 1e-12


def _reference_finish(dag, durations):
    """Straightforward longest path: visit nodes in topological order, start = latest predecessor finish."""
    finish = [0.0] * dag.num_nodes
    for v in dag.topo_order.tolist():
        start = max((finish[u] for u in dag.predecessors[v]), default=0.0)
        finish[v] = start + float(durations[v])
    return np.array(finish)


@pytest.mark.parametrize(
    "schedule",
    [build_schedule("1f1b", 4, 7), build_schedule("interleaved", 3, 6, 2), build_schedule("gpipe", 3, 5)],
    ids=["1f1b", "interleaved", "gpipe"],
)
def test_vectorised_simulator_equals_reference_on_random_durations(schedule):
    from perseus.timeline.simulator import longest_path_finish, simulate_many

    dag = InstructionDAG.from_schedule(schedule)
    rng = np.random.default_rng(42)
    durations = rng.uniform(0.1, 3.0, (16, dag.num_nodes))
    energies = rng.uniform(10, 300, (16, dag.num_nodes))
    batch = simulate_many(dag, durations, energies, 70.0)
    for row in range(len(durations)):
        finish = _reference_finish(dag, durations[row])
        time_s = finish.max()
        busy = np.bincount(dag.node_stage, weights=durations[row], minlength=schedule.num_stages)
        energy = energies[row].sum() + 70.0 * (schedule.num_stages * time_s - busy.sum())
        assert np.allclose(batch.finish_s[row], finish, rtol=1e-12)
        assert batch.time_s[row] == pytest.approx(time_s, rel=1e-12)
        assert batch.energy_j[row] == pytest.approx(energy, rel=1e-12)
        assert np.allclose(longest_path_finish(dag, durations[row]), finish, rtol=1e-12)
        one = simulate(dag, durations[row], energies[row], 70.0)  # a batch of one is bit-identical
        assert one.time_s == batch.time_s[row] and one.energy_j == batch.energy_j[row]


def test_simulate_many_rejects_mismatched_shapes():
    from perseus.errors import ProfileError
    from perseus.timeline.simulator import simulate_many

    dag = InstructionDAG.from_schedule(build_schedule("1f1b", 2, 2))
    with pytest.raises(ProfileError, match="shape"):
        simulate_many(dag, np.ones((2, dag.num_nodes + 1)), np.ones((2, dag.num_nodes + 1)), 10.0)
