"""The unpadded DeepSpeedExamples-style AlexNet pipeline, beside a CPU-bound process, reaches the
deployed phase and rank 0's metrics file records every step.

What is asserted is what holds today: phases reached in order, one metrics line per step, the
deployed steps carrying their planned target time, no fallback. The no-slowdown guard's
assertions (same-run A/B within tolerance, or a move/fallback with its reason) come with its
integration into the runtime (issue 24 §2).
"""

from __future__ import annotations

import pytest

pytest.importorskip("deepspeed")

from unpadded_workload import run_beside_cpu_hog  # noqa: E402  (this directory is on sys.path)

STEPS = 12


@pytest.mark.distributed
def test_unpadded_alexnet_pipeline_beside_a_busy_loop_reaches_deployment(tmp_path):
    run = run_beside_cpu_hog(tmp_path / "run", STEPS)
    assert run.returncode == 0, run.log[-4000:]
    assert [r["step"] for r in run.records] == list(range(STEPS))
    phases = [r["phase"] for r in run.records]
    # 2 warm-up steps, 3 clocks (1410/810/210 MHz, one step each), then planning and deployment
    assert phases[:5] == ["warmup"] * 2 + ["profiling"] * 3, phases
    assert "deployed" in phases, phases
    first_deployed = phases.index("deployed")
    assert set(phases[5:first_deployed]) <= {"planning"} and set(phases[first_deployed:]) == {"deployed"}, phases
    assert [r["freq_mhz"] for r in run.records[2:5]] == [1410, 810, 210]
    deployed = run.records[first_deployed:]
    assert all(r["target_time_s"] and r["target_time_s"] > 0 for r in deployed)
    assert all(r["time_s"] > 0 and r["energy_j"] > 0 for r in run.records)
    kinds = {e["event"] for e in run.events}
    assert "phase" in kinds and "fallback" not in kinds, kinds
