"""The Megatron demo: its listener wrapper, its report, and one short real run (2 stages)."""

from __future__ import annotations

import pytest

from perseus_megatron.demo import DemoConfig, SimulatedCompute, format_report, launch, phase_table


class _Log:
    def __init__(self, log: list[str]):
        self.log = log

    def __getattr__(self, name: str):
        return lambda *args: self.log.append(name)


def test_simulated_compute_brackets_the_work_inside_the_runtime_events_and_pads_to_nominal():
    log: list[str] = []
    wrapper = SimulatedCompute(_Log(log), _Log(log), {"forward": 0.01})
    wrapper.on_step_begin()
    wrapper.on_instruction_begin("forward", 0, 0)
    wrapper.on_instruction_end("forward", 0, 0)
    wrapper.on_step_end()
    assert log == ["on_step_begin", "on_instruction_begin", "begin_busy", "end_busy", "on_instruction_end",
                   "on_step_end"]


def test_phase_table_takes_slowest_rank_time_and_sums_energy_over_ranks():
    results = [
        {"steps": [{"step": 0, "phase": "warmup", "time_s": 1.0, "energy_j": 10.0},
                   {"step": 1, "phase": "deployed", "time_s": 1.0, "energy_j": 8.0}]},
        {"steps": [{"step": 0, "phase": "warmup", "time_s": 1.2, "energy_j": 20.0},
                   {"step": 1, "phase": "deployed", "time_s": 1.1, "energy_j": 16.0}]},
    ]
    table = phase_table(results)
    assert table["warmup"] == {"iterations": 1, "time_s": 1.2, "energy_j": 30.0}
    assert table["deployed"] == {"iterations": 1, "time_s": 1.1, "energy_j": 24.0}
    assert "deployed plan vs warmup (default clocks): 20.0% less energy" in format_report(table)
    results[0]["steps"].append({"step": 2, "phase": "baseline again", "time_s": 1.0, "energy_j": 12.0})
    results[1]["steps"].append({"step": 2, "phase": "baseline again", "time_s": 1.0, "energy_j": 28.0})
    # The re-measured baseline (A/B/A) is the reference when present.
    assert "deployed plan vs baseline again (default clocks): 40.0% less energy" in format_report(phase_table(results))


@pytest.mark.distributed
def test_short_demo_run_profiles_plans_and_deploys(tmp_path):
    cfg = DemoConfig(stages=2, microbatches=4, max_steps=30, deployed_steps=2, forward_ms=4, backward_ms=8,
                     startup_steps=1, rebaseline_steps=2)
    cfg.perseus.update(warmup_steps=3, freq_step_mhz=250)
    results = launch(cfg, tmp_path)
    table = phase_table(results)
    assert {"warmup", "profiling", "deployed", "baseline again"} <= set(table), table
    assert table["baseline again"]["iterations"] == cfg.rebaseline_steps
    for result in results:
        summary = result["summary"]
        clocks = summary["profiled_clocks_mhz"]
        assert summary["phase"] == "deployed" and len(clocks) == 3 and clocks == sorted(clocks, reverse=True)
        assert all(a - b >= 250 for a, b in zip(clocks, clocks[1:]))  # freq_step_mhz reached the runtime
        assert summary["frontier"]["points"] >= 1
    assert all(row["energy_j"] > 0 for row in table.values())
