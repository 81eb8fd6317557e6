"""Real megatron-core pipelines under torchrun (CPU, gloo): recorded orders equal the core's schedules.

One launch of 4 ranks covers everything (start-up dominates: every rank imports torch and
megatron-core), megatron-core's parallel state set up again for each case: 4 stages — 1F1B with 8
and 2 microbatches, interleaved 2 chunks with 4; 2 stages × 2 data-parallel replicas — 1F1B with 4
and 1 microbatches (an evaluation call in between must not be reported), interleaved 2 chunks with
4 and 6 microbatches, and ``enable()`` with the real runtime. Both replicas of a stage must report
its order.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("megatron.core")

from perseus.schedule import build_schedule  # noqa: E402

pytestmark = pytest.mark.distributed

REPO = Path(__file__).resolve().parents[2]
WORKER = Path(__file__).with_name("record_orders_worker.py")

RANKS = 4
# name -> (schedule, stages, chunks, microbatches, extra)
CASES = {
    "f8": ("1f1b", 4, 1, 8, ""),
    "f2": ("1f1b", 4, 1, 2, ""),
    "i4-pp4": ("interleaved", 4, 2, 4, ""),
    "f4": ("1f1b", 2, 1, 4, "eval"),
    "f1": ("1f1b", 2, 1, 1, ""),
    "i4": ("interleaved", 2, 2, 4, ""),
    "i6": ("interleaved", 2, 2, 6, ""),
}
ENABLE_STAGES = 2


@pytest.fixture(scope="module")
def launch(tmp_path_factory) -> list[dict[str, Any]]:
    """Every case, one after another, in one torchrun of ``RANKS`` ranks; each rank's result."""
    tmp_path = tmp_path_factory.mktemp("orders")
    specs = [f"{name}:{s}:{p}:{c}:{m}" + (f":{x}" if x else "") for name, (s, p, c, m, x) in CASES.items()]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]),
               OMP_NUM_THREADS="1", PERSEUS_SIM_GPU_DIR=str(tmp_path / "sim-gpus"))
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={RANKS}",
           str(WORKER), str(tmp_path), *specs, f"enable:{ENABLE_STAGES}"]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    results = []
    for rank in range(RANKS):
        path = tmp_path / f"rank{rank}.json"
        assert path.exists(), f"rank {rank} wrote no result\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
        result = json.loads(path.read_text())
        assert "error" not in result, result["error"]
        results.append(result)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return results


def _check(results: list[dict[str, Any]], stages: int) -> None:
    cases = {name: case for name, case in CASES.items() if case[1] == stages}
    assert cases
    for name, (schedule, _, chunks, microbatches, _) in cases.items():
        expected = build_schedule(schedule, stages, microbatches, chunks)
        seen = set()
        for result in results:
            case = result[name]
            stage = case["stage"]
            seen.add((stage, case["dp_rank"]))
            want = [[i.kind, i.microbatch, i.chunk] for i in expected.stages[stage]]
            assert len(case["steps"]) == 2, f"{name}: expected 2 reported training steps, got {len(case['steps'])}"
            for step in case["steps"]:
                assert step == want, f"{name} stage {stage}: recorded order differs from build_schedule"
        replicas = RANKS // stages
        assert seen == {(s, d) for s in range(stages) for d in range(replicas)}, seen


def test_two_stage_orders_match_core_schedules(launch):
    _check(launch, 2)


def test_four_stage_orders_match_core_schedules(launch):
    _check(launch, 4)


def test_enable_builds_the_job_from_parallel_state_and_drives_the_runtime(launch):
    grid = set()
    for rank, result in enumerate(launch):
        enable = result["enable"]
        job = enable["job"]
        stage, dp_rank = enable["parallel_state"]["stage"], enable["parallel_state"]["dp_rank"]
        grid.add((stage, dp_rank))
        # The last step ran 6 microbatches: enable() rebuilt the runtime for the new job shape.
        assert job == {"num_stages": ENABLE_STAGES, "num_microbatches": 6, "stage": stage, "schedule": "interleaved",
                       "num_chunks": 2, "group_size": None, "dp_rank": dp_rank, "dp_size": RANKS // ENABLE_STAGES,
                       "tp_rank": 0, "tp_size": 1, "rank": rank, "world_size": RANKS}
        assert enable["model_config"]["hidden_size"] == 32 and enable["model_config"]["seq_length"] == 16
        assert enable["runtimes_created"] == 2
        assert enable["steps_per_listener"] == [2, 1]  # the forward-only call was not a step
        want = [[i.kind, i.microbatch, i.chunk] for i in build_schedule("interleaved", ENABLE_STAGES, 6, 2).stages[stage]]
        assert enable["last_steps"] == [want]
        assert enable["summary_steps"] == 1  # the runtime counted the step it saw
        assert enable["hooks_removed"]
    assert grid == {(s, d) for s in range(ENABLE_STAGES) for d in range(RANKS // ENABLE_STAGES)}
