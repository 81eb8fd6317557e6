"""Real torch.distributed.pipelining runs (gloo, CPU): what perseus_torch reports is exactly the
schedule data Perseus plans with, for every supported schedule; eval() and unhooked steps report
nothing; uninstall leaves the stages and schedule as they were.

Two launches cover every case (start-up dominates, not the tiny model): one torchrun of 2 ranks
and one of 4 run their cases one after another in one process group; each case is its own test.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Callable

import pytest

from perseus.schedule import build_schedule

pytestmark = pytest.mark.distributed
ROOT = Path(__file__).resolve().parents[2]

CASES = [
    ("1f1b", 2, 1, 4), ("gpipe", 2, 1, 3), ("torch-interleaved", 2, 2, 4), ("zb-interleaved", 2, 2, 4),
    ("zbv", 2, 2, 4), ("zb-interleaved", 2, 1, 3),
    ("1f1b", 4, 1, 6), ("zbv", 4, 2, 8), ("torch-interleaved", 4, 2, 8),
]


def case_id(schedule: str, stages: int, chunks: int, microbatches: int) -> str:
    return f"{schedule}-{stages}-{chunks}-{microbatches}"


def run_orders(tmp_path: Path, stages: int) -> dict[str, list[dict]]:
    """One torchrun of ``stages`` ranks through every case of that size; case id -> each rank's result."""
    cases = {case_id(*case): {"stages": stages, "chunks": case[2], "microbatches": case[3], "schedule": case[0],
                              "hidden_size": 8, "micro_batch_size": 2}
             for case in CASES if case[1] == stages}
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={stages}",
           str(ROOT / "tests/torch/orders_worker.py"), str(tmp_path), json.dumps(cases)]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-4000:]
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(stages)]
    return {name: [rank[name] for rank in ranks] for name in cases}


@pytest.fixture(scope="module")
def launches(tmp_path_factory) -> Callable[[int], dict[str, list[dict]]]:
    """Each rank count's launch, run the first time a case of that size asks for it (a failed one is not retried)."""
    done: dict[int, dict[str, list[dict]] | BaseException] = {}

    def get(stages: int) -> dict[str, list[dict]]:
        if stages not in done:
            try:
                done[stages] = run_orders(tmp_path_factory.mktemp(f"orders-pp{stages}"), stages)
            except BaseException as exc:  # every case of this size reports the launch's failure
                done[stages] = exc
        result = done[stages]
        if isinstance(result, BaseException):
            raise result
        return result

    return get


@pytest.mark.parametrize("schedule,stages,chunks,microbatches", CASES)
def test_reported_orders_equal_the_schedule_data(launches, schedule, stages, chunks, microbatches):
    data = build_schedule(schedule, stages, microbatches, chunks)
    results = launches(stages)[case_id(schedule, stages, chunks, microbatches)]
    assert [r["rank"] for r in results] == list(range(stages))
    for result in results:
        rank = result["rank"]
        want = [[i.kind, i.microbatch, i.chunk] for i in data.stages[rank]]
        assert result["trained_steps"] == 2 and result["steps"] == [want, want], f"rank {rank}"
        assert result["after_eval"] == 2 and result["after_uninstall"] == 2
        assert result["restored"]
        assert result["torch_stages"] == sorted(data.virtual_stage(rank, c) for c in range(chunks))
