"""The Megatron demo: one short real run (2 stages) through every phase, then default clocks again."""

from __future__ import annotations

import pytest

from perseus.demo import phase_table
from perseus_megatron.demo import DemoConfig, launch


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
