"""Real DeepSpeed PipelineEngine, 2 stages × 2 data-parallel pipelines under torchrun, one straggling.

Full path on simulated GPUs: online profiling → planning → the no-slowdown plan deployed; then
replica 1 runs 1.3× slower for a while. Replica 0 must notice, move to a slower frontier plan
(less energy, no extra time: it waits for replica 1 in DeepSpeed's gradient all-reduce anyway),
and move back when replica 1 recovers. Replica 1 itself must not slow down.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from straggler_checks import check_straggler_run  # noqa: E402

from perseus.demo import DEFAULT_PERSEUS  # noqa: E402

pytestmark = pytest.mark.distributed

STRAGGLER = {"dp_rank": 1, "factor": 1.3, "start": 3, "stop": 17}
PERSEUS = {**DEFAULT_PERSEUS, "warmup_steps": 4, "straggler_period_steps": 2, "straggler_patience": 2,
           "straggler_threshold": 0.12, "straggler_recover_threshold": 0.05}


def test_dp2_straggler_slows_the_other_pipeline_and_recovers(tmp_path):
    from perseus_deepspeed.demo import DemoConfig, launch

    cfg = DemoConfig(stages=2, microbatches=4, dp_size=2, straggler=STRAGGLER, max_steps=80, deployed_steps=27,
                     rebaseline_steps=6, perseus={**PERSEUS, "cache_dir": str(tmp_path / "cache")})
    results = launch(cfg, tmp_path / "run", timeout_s=600)
    # DeepSpeed's PipeDataParallelTopology: data-parallel innermost, so ranks 0 and 1 hold stage 0
    assert [(r["rank"], r["stage"], r["dp_rank"]) for r in results] == [(0, 0, 0), (1, 0, 1), (2, 1, 0), (3, 1, 1)]
    # the runtime's job (from the engine's grid) agrees; its straggler checks saw both pipelines
    for r in results:
        s = r["summary"]
        assert (s["stage"], s["dp_rank"]) == (r["stage"], r["dp_rank"])
        assert sorted(map(int, s["job"]["pipeline_natural_time_s"])) == [0, 1]
    check_straggler_run(results, STRAGGLER)
