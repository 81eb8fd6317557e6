"""The Megatron demo on real megatron-core under torchrun: every phase, then default clocks again.

2 and 4 pipeline stages (1F1B) and 2 stages × 2 virtual chunks (interleaved 1F1B). Each run
profiles online, plans, deploys the no-slowdown plan and re-measures default clocks (A/B/A). The
deployed plan follows the instructions the hooks report (a wrong microbatch or chunk index would
show up as a fallback); the checks are on what the run did, not on wall-clock time
(``tests/demo_checks.py``; measured savings are in ``benchmarks/bench_demo.py``).
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from demo_checks import check_deployed_demo  # noqa: E402

from perseus_demo.common import format_report, phase_table  # noqa: E402
from perseus_demo.megatron_demo import DemoConfig, launch  # noqa: E402

pytestmark = pytest.mark.distributed


@pytest.mark.parametrize(
    "stages, chunks, microbatches",
    [(2, 1, 4), (4, 1, 8), (2, 2, 4)],
    ids=["2-stages", "4-stages", "interleaved-2x2"],
)
def test_demo_profiles_plans_and_deploys_a_plan_that_saves_energy(tmp_path, stages, chunks, microbatches):
    cfg = DemoConfig(stages=stages, chunks=chunks, microbatches=microbatches, max_steps=1000, deployed_steps=6,
                     startup_steps=1, rebaseline_steps=4)
    cfg.perseus.update(warmup_steps=3, freq_step_mhz=250, cache_dir=str(tmp_path / "cache"))
    results = launch(cfg, tmp_path / "out", timeout_s=600)
    for result in results:
        clocks = result["summary"]["profiled_clocks_mhz"]
        assert len(clocks) == 3 and clocks == sorted(clocks, reverse=True)
        assert all(a - b >= 250 for a, b in zip(clocks, clocks[1:]))  # freq_step_mhz reached the runtime
        assert result["summary"]["frontier"]["points"] >= 2
    table = phase_table(results)
    assert {"warmup", "profiling", "deployed", "baseline again"} <= set(table), table
    assert table["baseline again"]["iterations"] == cfg.rebaseline_steps
    accounting = check_deployed_demo(results, cfg, tmp_path / "cache")
    print(f"\n{stages} stages x {chunks} chunks:\n{format_report(table)}\n{accounting}")
