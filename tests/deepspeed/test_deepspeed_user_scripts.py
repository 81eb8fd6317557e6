"""Users' DeepSpeed scripts, DeepSpeedExamples style: the config file through ``--deepspeed_config``,
``training_data=`` read by the engine's own loader, DeepSpeed's optimizer and LR scheduler from
the config, and Perseus through ``perseus_deepspeed.initialize`` and the config's ``"perseus"`` section.

``scripts/deepspeed_dataset_example.py`` runs unchanged under the real ``deepspeed`` launcher on
CPU (``--cpu``: gloo, simulated GPUs), 2 stages, inside ``deepspeed_example_probe.py``, which
records per rank what is checked here. The config is the example's, with a short Perseus run:
2 warm-up steps, one step per clock at 1410/810/210 MHz, a small planner, so that Perseus
profiles, plans and deploys within the run. The planner runs in the background; ``plan_wait_s``
makes rank 0 wait for it at the first planning step, which stands in for "enough steps" on a
machine of any load.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from perseus.gpu.sim.state import read_sim_state
from perseus.runtime.config import PerseusConfig

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "scripts" / "deepspeed_dataset_example.py"
CONFIG = REPO / "scripts" / "deepspeed_config_dataset_example.json"
PROBE = Path(__file__).with_name("deepspeed_example_probe.py")

STAGES = 2
MICRO_BATCHES = 4
MICRO_BATCH_SIZE = 2
STEPS = 10
SHORT_RUN = {
    "gpu": "sim", "warmup_steps": 2, "iters_per_freq": 1, "remeasure_max": 0, "freq_step_mhz": 600, "p_blocking_seconds": 0.1,
    "straggler_period_steps": 0, "log_every_steps": 1, "plan_wait_s": 240.0,
    "attribution_intervals": 0,  # one step per clock, as the phase history below spells out
    "planner_options": {"num_anchors": 2, "num_deadlines": 8, "improve_sweeps": 0, "search_time_s": 0,
                        "beam_width": 0},
}


def test_dataset_example_config_uses_deepspeeds_optimizer_and_scheduler():
    config = json.loads(CONFIG.read_text())
    assert PerseusConfig.from_dict(config["perseus"]).enabled
    assert config["optimizer"]["type"] == "Adam"
    assert config["optimizer"]["params"]["torch_adam"] is True  # torch's AdamW: nothing to compile on CPU
    assert config["scheduler"]["type"] == "WarmupLR"


def launch_example(tmp_path: Path, master_port: str) -> list[dict]:
    config = json.loads(CONFIG.read_text())
    config.update(train_micro_batch_size_per_gpu=MICRO_BATCH_SIZE, gradient_accumulation_steps=MICRO_BATCHES)
    config["perseus"].update(SHORT_RUN, cache_dir=str(tmp_path / "cache"), metrics_file=str(tmp_path / "metrics.jsonl"))
    config_path = tmp_path / "ds_config.json"
    config_path.write_text(json.dumps(config))
    out = tmp_path / "probe"
    out.mkdir()
    env = dict(os.environ, PERSEUS_SIM_GPU_DIR=str(tmp_path / "sim"), OMP_NUM_THREADS="1",
               PERSEUS_PROBE_SCRIPT=str(SCRIPT), PERSEUS_PROBE_DIR=str(out),
               PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]))
    cmd = [shutil.which("deepspeed"), "--num_gpus", str(STAGES), "--master_port", master_port, str(PROBE),
           "--deepspeed_config", str(config_path), "-p", str(STAGES), "--steps", str(STEPS), "--hidden-size", "32",
           "--layers", "4", "--samples", "64", "--cpu"]
    proc = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=400)
    (tmp_path / "launcher.log").write_text(proc.stdout + proc.stderr)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return [json.loads((out / f"rank{rank}.json").read_text()) for rank in range(STAGES)]


@pytest.mark.distributed
@pytest.mark.skipif(shutil.which("deepspeed") is None, reason="needs the deepspeed launcher")
def test_deepspeed_launcher_runs_a_deepspeedexamples_style_script_with_perseus(tmp_path, master_port):
    pytest.importorskip("deepspeed")
    results = launch_example(tmp_path, master_port)
    for r in results:
        rank = r["rank"]
        assert r["stage"] == rank and r["num_stages"] == STAGES and r["micro_batches"] == MICRO_BATCHES
        # DeepSpeed built the optimizer and the scheduler from the config; initialize returned them
        assert not r["client_optimizer"] and r["basic_optimizer"] == "AdamW" and r["optimizer_is_engines"], r
        assert r["lr_scheduler"] == "WarmupLR" and r["lr_scheduler_is_engines"], r
        assert r["lr"] == pytest.approx(1e-4 * math.log(STEPS) / math.log(20))  # WarmupLR's log ramp, 20 steps
        # train_batch() read every micro-batch from the loader the engine built from training_data
        assert r["first_or_last_stage"] and r["loader_is_engines"], r
        assert r["batches_read"] == STEPS * MICRO_BATCHES, r
        assert r["global_steps"] == STEPS
        # Perseus saw every train_batch, profiled, planned and deployed, with no fallback
        summary = r["summary"]
        assert r["perseus"] and summary["steps"] == STEPS
        # 2 warm-up steps, 3 clocks (the sweep cannot stop early with patience 2 and 3 clocks), one planning step
        assert summary["phase_history"] == [[0, "warmup"], [2, "profiling"], [5, "planning"], [6, "deployed"]], (summary.get("profiled_clocks_mhz"), summary.get("sweep_stopped_early"))
        assert summary["phase"] == "deployed" and summary["fallback"] is None, summary
        # engine.destroy() closed Perseus and left the simulated GPU at default clocks
        assert r["closed"] and r["locked_after_destroy"] == 0, r
    for index in range(STAGES):
        assert read_sim_state(index, tmp_path / "sim").locked == 0
    assert (tmp_path / "metrics.jsonl").exists()
