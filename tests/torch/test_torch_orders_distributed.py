"""Real torch.distributed.pipelining runs (gloo, CPU): what perseus_torch reports is exactly the
schedule data Perseus plans with, for every supported schedule; eval() and unhooked steps report
nothing; uninstall leaves the stages and schedule as they were."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from perseus.schedule import build_schedule

pytestmark = pytest.mark.distributed
ROOT = Path(__file__).resolve().parents[2]

CASES = [
    ("1f1b", 2, 1, 4), ("gpipe", 2, 1, 3), ("torch-interleaved", 2, 2, 4), ("zb-interleaved", 2, 2, 4),
    ("zbv", 2, 2, 4), ("zb-interleaved", 2, 1, 3),
    ("1f1b", 4, 1, 6), ("zbv", 4, 2, 8), ("torch-interleaved", 4, 2, 8),
]


def run_orders(tmp_path: Path, schedule: str, stages: int, chunks: int, microbatches: int) -> list[dict]:
    config = json.dumps({"stages": stages, "chunks": chunks, "microbatches": microbatches, "schedule": schedule,
                         "hidden_size": 8, "micro_batch_size": 2})
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={stages}",
           str(ROOT / "tests/torch/orders_worker.py"), str(tmp_path), config]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(stages)]


@pytest.mark.parametrize("schedule,stages,chunks,microbatches", CASES)
def test_reported_orders_equal_the_schedule_data(tmp_path, schedule, stages, chunks, microbatches):
    data = build_schedule(schedule, stages, microbatches, chunks)
    for result in run_orders(tmp_path, schedule, stages, chunks, microbatches):
        rank = result["rank"]
        want = [[i.kind, i.microbatch, i.chunk] for i in data.stages[rank]]
        assert result["trained_steps"] == 2 and result["steps"] == [want, want], f"rank {rank}"
        assert result["after_eval"] == 2 and result["after_uninstall"] == 2
        assert result["restored"]
        assert result["torch_stages"] == sorted(data.virtual_stage(rank, c) for c in range(chunks))
