"""The DeepSpeed demo end to end: real PipelineEngine ranks, simulated GPUs, profile → plan → deploy.

One launch, 4 stages × 8 microbatches, short (3 clocks) to keep the shared machine's load low. The
deployed plan follows the instructions the hooks report (a wrong microbatch index would show up
as a fallback); the checks are on what the run did, not on wall-clock time
(``tests/demo_checks.py``; measured savings are in ``benchmarks/bench_demo.py``).

A launch is what costs, so the run also has DeepSpeed's ``csv_monitor`` and rank 0's metrics file
on: one launch serves the demo checks and the monitor check. The same demo checks on 2 stages
(1F1B, the no-slowdown plan outside the straggler's window) are in
``test_deepspeed_dp_straggler.py``; the recorded 2-stage orders, with an ``eval_batch`` between
steps, in ``test_deepspeed_orders_distributed.py``.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("deepspeed")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from demo_checks import check_deployed_demo
from deepspeed_monitor_files import read_csv

from perseus.runtime.observe.metrics import PHASE_CODES
from perseus_demo.common import format_report, phase_table
from perseus_demo.deepspeed_demo import DemoConfig, launch

pytestmark = pytest.mark.distributed

Run = tuple[Path, DemoConfig, list[dict[str, Any]]]


@pytest.fixture(scope="module")
def four_stages(tmp_path_factory) -> Run:
    """The one torchrun of the demo, with DeepSpeed's csv_monitor and rank 0's metrics file on."""
    run = tmp_path_factory.mktemp("four-stages")
    cfg = DemoConfig(
        stages=4, microbatches=8, max_steps=1000, deployed_steps=6, startup_steps=1, hidden_size=16,
        rebaseline_steps=4,
    )
    cfg.perseus = {**cfg.perseus, "freq_min_mhz": 1110, "warmup_steps": 3, "cache_dir": str(run / "cache"),
                   "metrics_file": str(run / "metrics.jsonl")}
    cfg.deepspeed = {"csv_monitor": {"enabled": True, "output_path": str(run / "csv"), "job_name": "demo"}}
    return run, cfg, launch(cfg, run / "out", timeout_s=300)


def test_demo_profiles_plans_and_deploys_a_plan_that_saves_energy(four_stages):
    run, cfg, results = four_stages
    assert [r["stage"] for r in results] == [0, 1, 2, 3]
    for result in results:
        assert result["summary"]["profiled_clocks_mhz"] == [1410, 1260, 1110]
    table = phase_table(results)
    assert {"warmup", "profiling", "planning", "deployed", "baseline again"} <= set(table)
    assert table["baseline again"]["iterations"] == cfg.rebaseline_steps
    assert "deployed plan vs baseline again (default clocks)" in format_report(table)
    assert {"frontier.json", "profile.json"} <= {p.name for p in (run / "cache").glob("*/*.json")}
    accounting = check_deployed_demo(results, cfg, run / "cache")
    print(f"\n{cfg.stages} stages:\n{format_report(table)}\n{accounting}")


def test_demo_run_writes_rank_zeros_metrics_to_the_csv_monitor(four_stages):
    """DeepSpeed's monitor writes on global rank 0, the metrics file is rank 0's: the same numbers.
    Perseus stops before the demo re-measures default clocks, so both end with the deployed steps."""
    run, cfg, _ = four_stages
    steps = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    steps = [s for s in steps if "event" not in s]
    folder = run / "csv" / "demo"
    energy = read_csv(folder, "perseus/energy_j")
    assert [v for _, v in energy] == pytest.approx([s["energy_j"] for s in steps], rel=1e-12)
    assert [x for x, _ in energy] == [cfg.micro_batch_size * cfg.microbatches * (i + 1) for i in range(len(steps))]
    assert [v for _, v in read_csv(folder, "perseus/phase")] == [PHASE_CODES.index(s["phase"]) for s in steps]
    assert "deployed" in {s["phase"] for s in steps}
    saving = read_csv(folder, "perseus/saving_ratio")
    after_warmup = [s for s in steps if s["phase"] != "warmup"]
    assert [v for _, v in saving] == pytest.approx([s["saving"] for s in after_warmup], rel=1e-9)
