"""Real multi-process DeepSpeed pipelines (torchrun, gloo, CPU): recorded orders equal the core's schedule.

Each rank runs ``PipelineEngine.train_batch`` (activation checkpointing on) with Perseus started
by ``perseus_deepspeed.initialize`` from the config's ``"perseus"`` section, and writes what the
hooks reported; this test compares it with ``build_schedule("1f1b", S, M).stages[rank]``, on 2
stages. A launch is what costs, so 4 stages are checked on the DeepSpeed demo's 4-stage run
(``test_deepspeed_demo.py``): every rank executed the plan's instructions, which are
``build_schedule("1f1b", 4, 8)``'s, in every deployed iteration, and the runtime falls back at the
first reported instruction that differs.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("deepspeed")

from perseus.schedules import build_schedule

REPO = Path(__file__).resolve().parents[2]
WORKER = Path(__file__).with_name("deepspeed_orders_worker.py")
TRAIN_STEPS = 3


def launch(stages: int, microbatches: int, out_dir: Path) -> list[dict]:
    env = dict(os.environ, DS_ACCELERATOR="cpu", OMP_NUM_THREADS="1", PERSEUS_SIM_GPU_DIR=str(out_dir / "sim"),
               PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]))
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={stages}",
           str(WORKER), str(out_dir), str(microbatches)]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    results = []
    for rank in range(stages):
        path = out_dir / f"rank{rank}.json"
        assert path.exists(), f"rank {rank} wrote nothing (exit {proc.returncode}):\n{proc.stderr[-3000:]}"
        results.append(json.loads(path.read_text()))
    (out_dir / "orders.json").write_text(json.dumps({r["rank"]: r["orders"] for r in results}, indent=1))
    return results


@pytest.mark.distributed
@pytest.mark.parametrize("stages,microbatches", [(2, 4)])
def test_recorded_orders_equal_the_core_1f1b_schedule(stages, microbatches, tmp_path):
    results = launch(stages, microbatches, tmp_path)
    schedule = build_schedule("1f1b", stages, microbatches)
    for result in results:
        rank = result["rank"]
        stage = result["job"]["stage"]
        assert stage == rank  # one pipeline, no data parallelism: rank = stage
        want = [[inst.kind, inst.microbatch, inst.chunk] for inst in schedule.stages[stage]]
        assert result["orders"] == [want] * TRAIN_STEPS, f"rank {rank}"  # eval_batch in between reports nothing
        assert result["job"] == {
            "num_stages": stages, "num_microbatches": microbatches, "stage": stage, "schedule": "1f1b",
            "num_chunks": 1, "dp_rank": 0, "dp_size": 1, "tp_rank": 0, "tp_size": 1, "rank": rank,
            "world_size": stages, "group_size": None, "overlap_p2p": False,
        }
        assert result["model_config"]["framework"] == "deepspeed"
        assert result["model_config"]["activation_checkpoint_interval"] == 1
        assert result["stage_fingerprint"]  # this stage's parameters, for rank 0's cache key
        assert result["runtime_steps"] == TRAIN_STEPS  # the runtime received every step
        assert result["device_index"] == rank  # one simulated GPU per rank
        assert result["closed_by_destroy"] and not result["shm_op"]
