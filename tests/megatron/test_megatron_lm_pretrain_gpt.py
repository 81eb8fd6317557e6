"""A real, unmodified Megatron-LM ``pretrain_gpt.py`` (core_v0.16.1) trains with ``--perseus`` on CPU.

The archived checkout is unpacked to a temporary directory and started under torchrun (gloo) by
``perseus_demo.megatron_lm_cpu``, which removes Megatron's CUDA-only start-up steps and then runs
the launcher a GPU user runs (``perseus_megatron.pretrain_gpt``). A tiny GPT on mock data, one
simulated GPU per rank: warm-up → online profiling (few clocks) → planning → deployed, without
a plan mismatch; the profile and frontier are cached, and a restart on the same cache deploys
the cached plan without profiling. No savings or times are asserted.
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

from megatron_lm_archive import REPO, unpack  # noqa: E402
from perseus_demo.megatron_lm_cpu import CPU_GPT_ARGS  # noqa: E402

pytestmark = pytest.mark.distributed

PERSEUS_ARGS = (
    "--perseus", "--perseus-gpu", "sim", "--perseus-warmup-steps", "2", "--perseus-iters-per-freq", "1",
    "--perseus-freq-min", "1000", "--perseus-freq-step", "200", "--perseus-early-stop-patience", "0",
    "--perseus-straggler-period", "0",
)


@pytest.fixture(scope="module")
def checkout(tmp_path_factory) -> Path:
    return unpack("0.16.1", tmp_path_factory.mktemp("megatron-lm"))


def run_pretrain_gpt(checkout: Path, work: Path, ranks: int, cache: Path, args: list[str]) -> list[dict[str, Any]]:
    """One torchrun of pretrain_gpt.py; each rank's Perseus summary."""
    summaries = work / "summaries"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]),
               OMP_NUM_THREADS="1", PERSEUS_SIM_GPU_DIR=str(work / "sim-gpus"))
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={ranks}",
           "-m", "perseus_demo.megatron_lm_cpu", "--summary-dir", str(summaries), "--megatron-lm", str(checkout),
           *CPU_GPT_ARGS, *args, *PERSEUS_ARGS, "--perseus-cache-dir", str(cache)]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=420, cwd=work)
    log = (proc.stdout + proc.stderr)[-6000:]
    assert proc.returncode == 0, log
    assert "iteration" in proc.stdout and "lm loss" in proc.stdout, log  # Megatron's own training log
    results = []
    for rank in range(ranks):
        path = summaries / f"rank{rank}.json"
        assert path.exists(), f"rank {rank} wrote no summary\n{log}"
        results.append(json.loads(path.read_text()))
    return results


def phases(summary: dict[str, Any]) -> list[str]:
    return [phase for _, phase in summary["phase_history"]]


def check_first_run(results: list[dict[str, Any]], stages: int, cache: Path) -> None:
    assert sorted(r["stage"] for r in results) == list(range(stages))
    for r in results:
        assert phases(r) == ["warmup", "profiling", "planning", "deployed"], r["phase_history"]
        assert r["fallback"] is None and r["phase"] == "deployed"
        assert len(r["profiled_clocks_mhz"]) >= 2
    key_dirs = [p for p in cache.iterdir() if p.is_dir()]
    assert len(key_dirs) == 1
    assert (key_dirs[0] / "profile.json").exists() and (key_dirs[0] / "frontier.json").exists()


def test_1f1b_two_stages_profiles_plans_deploys_and_restarts_from_the_cache(checkout, tmp_path):
    cache = tmp_path / "perseus-cache"
    args = ["--num-layers", "2", "--pipeline-model-parallel-size", "2", "--micro-batch-size", "1",
            "--global-batch-size", "4", "--train-iters", "14"]
    first = tmp_path / "first"
    first.mkdir()
    check_first_run(run_pretrain_gpt(checkout, first, 2, cache, args), 2, cache)

    second = tmp_path / "second"
    second.mkdir()
    restarted = run_pretrain_gpt(checkout, second, 2, cache, [*args[:-1], "4"])
    for r in restarted:
        assert "profiling" not in phases(r) and "planning" not in phases(r), r["phase_history"]
        assert r["phase"] == "deployed" and r["fallback"] is None
        assert not r.get("profiled_clocks_mhz")


def test_interleaved_four_stages_two_chunks_reaches_the_deployed_plan(checkout, tmp_path):
    cache = tmp_path / "perseus-cache"
    args = ["--num-layers", "8", "--pipeline-model-parallel-size", "4", "--num-layers-per-virtual-pipeline-stage", "1",
            "--no-overlap-p2p-communication", "--micro-batch-size", "1", "--global-batch-size", "4",
            "--train-iters", "14"]
    results = run_pretrain_gpt(checkout, tmp_path, 4, cache, args)
    check_first_run(results, 4, cache)
