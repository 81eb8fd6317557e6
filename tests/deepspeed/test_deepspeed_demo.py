"""The DeepSpeed demo end to end: real PipelineEngine ranks, simulated GPUs, profile → plan → deploy.

2 and 4 stages, short (3 clocks, millisecond kernels) to keep the shared machine's load low. The plan must be deployed without falling back: the deployed plan follows the
instructions the hooks report, so a wrong microbatch index would show up as a fallback.
"""

from __future__ import annotations

import pytest

pytest.importorskip("deepspeed")

from perseus_demo.common import format_report, phase_table  # noqa: E402
from perseus_demo.deepspeed_demo import DemoConfig, launch  # noqa: E402


@pytest.mark.distributed
@pytest.mark.parametrize("stages, microbatches", [(2, 4), (4, 8)], ids=["2-stages", "4-stages"])
def test_demo_profiles_plans_and_deploys_a_plan_that_saves_energy(tmp_path, stages, microbatches):
    cfg = DemoConfig(
        stages=stages, microbatches=microbatches, max_steps=60, deployed_steps=6, startup_steps=1, forward_ms=6.0,
        backward_ms=12.0, hidden_size=16, rebaseline_steps=6,
    )
    cfg.perseus = {**cfg.perseus, "freq_min_mhz": 1110, "warmup_steps": 3, "cache_dir": str(tmp_path / "cache")}
    results = launch(cfg, tmp_path / "out", timeout_s=300)
    for result in results:
        summary = result["summary"]
        assert summary["phase"] == "deployed" and summary["fallback"] is None, summary
        assert summary["profiled_clocks_mhz"] == [1410, 1260, 1110]
    table = phase_table(results)
    assert {"warmup", "profiling", "planning", "deployed", "baseline again"} <= set(table)
    assert table["deployed"]["iterations"] == cfg.deployed_steps
    assert table["baseline again"]["iterations"] == cfg.rebaseline_steps
    print(f"\n{stages} stages:\n{format_report(table)}")
    # default clocks before and after the plan (A/B/A); the re-measured one is the fair comparison
    assert table["deployed"]["energy_j"] < table["warmup"]["energy_j"]
    assert table["deployed"]["energy_j"] < 0.99 * table["baseline again"]["energy_j"], format_report(table)
    assert table["deployed"]["time_s"] < 1.10 * table["baseline again"]["time_s"], format_report(table)
    assert "deployed plan vs baseline again (default clocks)" in format_report(table)
    assert {"frontier.json", "profile.json"} <= {p.name for p in (tmp_path / "cache").glob("*/*.json")}
