"""Real megatron-core, 2 stages × 2 data-parallel pipelines under torchrun, one pipeline straggling.

Full path on simulated GPUs: online profiling → planning → the no-slowdown plan deployed; then
replica 1 runs 1.5× slower for a while. Replica 0 must notice, move to a slower frontier plan
(less energy, no extra time: it waits for replica 1 in the gradient all-reduce anyway), and move
back when replica 1 recovers. Replica 1 itself must not slow down.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from demo_checks import check_straggler_run, run_straggler_demo

pytestmark = pytest.mark.distributed


def test_dp2_straggler_slows_the_other_pipeline_and_recovers(tmp_path):
    from perseus_demo.megatron_demo import DemoConfig, launch

    results, cfg = run_straggler_demo(DemoConfig, launch, tmp_path)
    # megatron-core's rank layout (pipeline outermost): ranks 0,1 are replica 0/1 of stage 0
    assert sorted((r["stage"], r["dp_rank"]) for r in results) == [(0, 0), (0, 1), (1, 0), (1, 1)]
    check_straggler_run(results, cfg)
