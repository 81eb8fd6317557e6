"""Real megatron-core pipelines under torchrun (CPU, gloo): recorded orders equal the core's schedules.

Two launches cover everything (start-up dominates: ~10 s for 2 ranks, ~18 s for 4 on 2 idle
cores): 2 stages — 1F1B with 4 and 1 microbatches (an evaluation call in between must not be
reported), interleaved 2 chunks with 4 and 6 microbatches, and ``enable()`` with the real
runtime; 4 stages — 1F1B with 8 and 2 microbatches, interleaved 2 chunks with 4.
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

# name -> (schedule, chunks, microbatches, extra)
CASES_2 = {
    "f4": ("1f1b", 1, 4, "eval"),
    "f1": ("1f1b", 1, 1, ""),
    "i4": ("interleaved", 2, 4, ""),
    "i6": ("interleaved", 2, 6, ""),
}
CASES_4 = {
    "f8": ("1f1b", 1, 8, ""),
    "f2": ("1f1b", 1, 2, ""),
    "i4": ("interleaved", 2, 4, ""),
}


def _launch(tmp_path: Path, ranks: int, cases: dict[str, tuple], extra: list[str]) -> list[dict[str, Any]]:
    specs = [f"{name}:{s}:{c}:{m}" + (f":{x}" if x else "") for name, (s, c, m, x) in cases.items()] + extra
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]),
               OMP_NUM_THREADS="1", PERSEUS_SIM_GPU_DIR=str(tmp_path / "sim-gpus"))
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={ranks}",
           str(WORKER), str(tmp_path), *specs]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    results = []
    for rank in range(ranks):
        path = tmp_path / f"rank{rank}.json"
        assert path.exists(), f"rank {rank} wrote no result\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
        result = json.loads(path.read_text())
        assert "error" not in result, result["error"]
        results.append(result)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return results


@pytest.fixture(scope="module")
def two_stages(tmp_path_factory) -> list[dict[str, Any]]:
    return _launch(tmp_path_factory.mktemp("pp2"), 2, CASES_2, ["enable"])


@pytest.fixture(scope="module")
def four_stages(tmp_path_factory) -> list[dict[str, Any]]:
    return _launch(tmp_path_factory.mktemp("pp4"), 4, CASES_4, [])


def _check(results: list[dict[str, Any]], cases: dict[str, tuple]) -> None:
    stages = len(results)
    for name, (schedule, chunks, microbatches, _) in cases.items():
        expected = build_schedule(schedule, stages, microbatches, chunks)
        seen_stages = set()
        for result in results:
            case = result[name]
            stage = case["stage"]
            seen_stages.add(stage)
            want = [[i.kind, i.microbatch, i.chunk] for i in expected.stages[stage]]
            assert len(case["steps"]) == 2, f"{name}: expected 2 reported training steps, got {len(case['steps'])}"
            for step in case["steps"]:
                assert step == want, f"{name} stage {stage}: recorded order differs from build_schedule"
        assert seen_stages == set(range(stages))


def test_two_stage_orders_match_core_schedules(two_stages):
    _check(two_stages, CASES_2)


def test_four_stage_orders_match_core_schedules(four_stages):
    _check(four_stages, CASES_4)


def test_enable_builds_the_job_from_parallel_state_and_drives_the_runtime(two_stages):
    for rank, result in enumerate(two_stages):
        enable = result["enable"]
        job = enable["job"]
        # The last step ran 6 microbatches: enable() rebuilt the runtime for the new job shape.
        assert job == {"num_stages": 2, "num_microbatches": 6, "stage": rank, "schedule": "interleaved",
                       "num_chunks": 2, "group_size": None, "dp_rank": 0, "dp_size": 1, "tp_rank": 0, "tp_size": 1,
                       "rank": rank, "world_size": 2}
        assert enable["model_config"]["hidden_size"] == 32 and enable["model_config"]["seq_length"] == 16
        assert enable["runtimes_created"] == 2
        assert enable["steps_per_listener"] == [2, 1]  # the forward-only call was not a step
        want = [[i.kind, i.microbatch, i.chunk] for i in build_schedule("interleaved", 2, 6, 2).stages[rank]]
        assert enable["last_steps"] == [want]
        assert enable["summary_steps"] == 1  # the runtime counted the step it saw
        assert enable["hooks_removed"]
