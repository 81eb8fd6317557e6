"""The DeepSpeed demo end to end: real PipelineEngine ranks, simulated GPUs, profile → plan → deploy.

2 and 4 stages, short (3 clocks) to keep the shared machine's load low. The
deployed plan follows the instructions the hooks report (a wrong microbatch index would show up
as a fallback); the checks are on what the run did, not on wall-clock time
(``tests/demo_checks.py``; measured savings are in ``benchmarks/bench_demo.py``).
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

pytest.importorskip("deepspeed")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from demo_checks import check_deployed_demo  # noqa: E402

from perseus_demo.common import format_report, phase_table  # noqa: E402
from perseus_demo.deepspeed_demo import DemoConfig, launch  # noqa: E402


@pytest.mark.distributed
@pytest.mark.parametrize("stages, microbatches", [(2, 4), (4, 8)], ids=["2-stages", "4-stages"])
def test_demo_profiles_plans_and_deploys_a_plan_that_saves_energy(tmp_path, stages, microbatches):
    cfg = DemoConfig(
        stages=stages, microbatches=microbatches, max_steps=1000, deployed_steps=6, startup_steps=1, hidden_size=16,
        rebaseline_steps=4,
    )
    cfg.perseus = {**cfg.perseus, "freq_min_mhz": 1110, "warmup_steps": 3, "cache_dir": str(tmp_path / "cache")}
    results = launch(cfg, tmp_path / "out", timeout_s=300)
    for result in results:
        assert result["summary"]["profiled_clocks_mhz"] == [1410, 1260, 1110]
    table = phase_table(results)
    assert {"warmup", "profiling", "planning", "deployed", "baseline again"} <= set(table)
    assert table["baseline again"]["iterations"] == cfg.rebaseline_steps
    assert "deployed plan vs baseline again (default clocks)" in format_report(table)
    assert {"frontier.json", "profile.json"} <= {p.name for p in (tmp_path / "cache").glob("*/*.json")}
    accounting = check_deployed_demo(results, cfg, tmp_path / "cache")
    print(f"\n{stages} stages:\n{format_report(table)}\n{accounting}")
