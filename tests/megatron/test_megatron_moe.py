"""A megatron-core mixture-of-experts GPT with expert parallelism (EP = 2) on CPU, with Perseus.

2 stages × 2 data-parallel pipelines (4 gloo ranks); every layer has 4 experts, top-2 routing and
megatron-core's alltoall token dispatcher over the 2 expert-parallel ranks of each stage (its
``all_to_all_single`` over gloo), inside ``perseus_demo.megatron_cpu.moe_cpu_execution``. The demo
profiles online, plans, deploys the no-slowdown plan and re-measures default clocks; the checks
are the demo checks (``tests/demo_checks.py``: deployed on every rank, executed in order at the
planned clocks, saving energy at no slowdown on the simulated GPU's own model).
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from demo_checks import check_deployed_demo

pytestmark = pytest.mark.distributed


def test_moe_expert_parallel_pipeline_deploys_a_plan_that_saves_energy(tmp_path):
    pytest.importorskip("megatron.core")
    from perseus_demo.common import format_report, phase_table
    from perseus_demo.megatron_demo import DemoConfig, launch

    from perseus_demo.cli import MOE

    cfg = DemoConfig(stages=2, microbatches=4, max_steps=1000, deployed_steps=4, rebaseline_steps=2, **MOE)
    cfg.perseus = {**cfg.perseus, "warmup_steps": 3, "freq_step_mhz": 250, "cache_dir": str(tmp_path / "cache")}
    results = launch(cfg, tmp_path / "run", timeout_s=900)
    assert sorted((r["stage"], r["dp_rank"]) for r in results) == [(0, 0), (0, 1), (1, 0), (1, 1)]
    table = phase_table(results)
    assert {"warmup", "profiling", "deployed", "baseline again"} <= set(table), table
    accounting = check_deployed_demo(results, cfg, tmp_path / "cache")
    print(f"\nMoE, EP 2, 2 stages x 2 pipelines:\n{format_report(table)}\n{accounting}")
