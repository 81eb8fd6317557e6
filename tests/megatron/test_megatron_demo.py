"""The Megatron demo on real megatron-core under torchrun: every phase, then default clocks again.

2 and 4 pipeline stages (1F1B) and 2 stages × 2 virtual chunks (interleaved 1F1B). Each run
profiles online, plans, deploys the no-slowdown plan and re-measures default clocks (A/B/A);
the deployed plan must use less energy per iteration than default clocks without adding
iteration time beyond noise. The plan follows the instructions the hooks report, so a wrong
microbatch or chunk index would show up as a fallback.
"""

from __future__ import annotations

import pytest

from perseus_demo.common import format_report, phase_table
from perseus_demo.megatron_demo import DemoConfig, launch

pytestmark = pytest.mark.distributed


@pytest.mark.parametrize(
    "stages, chunks, microbatches",
    [(2, 1, 4), (4, 1, 8), (2, 2, 4)],
    ids=["2-stages", "4-stages", "interleaved-2x2"],
)
def test_demo_profiles_plans_and_deploys_a_plan_that_saves_energy(tmp_path, stages, chunks, microbatches):
    cfg = DemoConfig(stages=stages, chunks=chunks, microbatches=microbatches, max_steps=60, deployed_steps=6,
                     forward_ms=6, backward_ms=12, startup_steps=1, rebaseline_steps=6)
    cfg.perseus.update(warmup_steps=3, freq_step_mhz=250)
    results = launch(cfg, tmp_path, timeout_s=600)
    for result in results:
        summary = result["summary"]
        assert summary["phase"] == "deployed" and summary["fallback"] is None, summary
        clocks = summary["profiled_clocks_mhz"]
        assert len(clocks) == 3 and clocks == sorted(clocks, reverse=True)
        assert all(a - b >= 250 for a, b in zip(clocks, clocks[1:]))  # freq_step_mhz reached the runtime
        assert summary["frontier"]["points"] >= 2
    table = phase_table(results)
    assert {"warmup", "profiling", "deployed", "baseline again"} <= set(table), table
    assert table["deployed"]["iterations"] == cfg.deployed_steps
    assert table["baseline again"]["iterations"] == cfg.rebaseline_steps
    plan, base = table["deployed"], table["baseline again"]
    print(f"\n{stages} stages x {chunks} chunks:\n{format_report(table)}")
    assert plan["energy_j"] < 0.99 * base["energy_j"], format_report(table)
    assert plan["time_s"] < 1.10 * base["time_s"], format_report(table)
