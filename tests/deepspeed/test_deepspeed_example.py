"""The user-facing example: its config's "perseus" section is valid, and the deepspeed launcher runs it.

The launcher run is on CPU (``--cpu``: gloo, simulated GPUs), 2 processes, a tiny model, 3 steps.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from perseus.runtime.config import PerseusConfig

REPO = Path(__file__).resolve().parents[2]
CONFIG = REPO / "scripts" / "deepspeed_config_example.json"
SCRIPT = REPO / "scripts" / "deepspeed_train_example.py"


def test_example_config_has_a_valid_perseus_section():
    config = json.loads(CONFIG.read_text())
    perseus = PerseusConfig.from_dict(config["perseus"])
    assert perseus.enabled and perseus.mode == "run"
    assert "train_batch_size" not in config  # DeepSpeed derives it from micro batch x accumulation x DP


@pytest.mark.distributed
@pytest.mark.skipif(shutil.which("deepspeed") is None, reason="needs the deepspeed launcher")
def test_deepspeed_launcher_runs_the_example_on_cpu(tmp_path, master_port):
    pytest.importorskip("deepspeed")
    env = dict(os.environ, PERSEUS_SIM_GPU_DIR=str(tmp_path / "sim"), OMP_NUM_THREADS="1",
               PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]))
    cmd = [shutil.which("deepspeed"), "--num_gpus", "2", "--master_port", master_port, str(SCRIPT),
           "--deepspeed_config", str(CONFIG), "--stages", "2", "--steps", "3", "--hidden-size", "32", "--layers", "4",
           "--cpu"]
    proc = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    line = next(line for line in proc.stdout.splitlines() if line.startswith("perseus summary:"))
    summary = json.loads(line.removeprefix("perseus summary:"))
    assert summary["steps"] == 3 and summary["phase"] == "warmup"  # warmup_steps is 5 in the example config
    assert (tmp_path / "perseus-metrics.jsonl").exists()  # metrics_file from the section, written by rank 0
