"""Run the unpadded AlexNet pipeline (``alexnet_pipe_train.py``) under torchrun beside a CPU-bound
process, and return what rank 0's metrics file recorded.

Issue 24's "Done when": the runtime's decisions are checked on a workload nobody padded, on a
machine whose load moves. The CPU-bound neighbour is ``tests/cpu_hog.py``'s.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cpu_hog import cpu_hog

REPO = Path(__file__).resolve().parents[2]
SCRIPT = Path(__file__).with_name("alexnet_pipe_train.py")
STAGES = 2

# A short Perseus run: 2 warm-up steps, one step per clock at 1410/810/210 MHz, a small planner
# that rank 0 waits for (the machine may be busy), the planner not niced (CPU-bound trainers).
SHORT_RUN: dict[str, Any] = {
    "mode": "run", "gpu": "sim", "warmup_steps": 2, "iters_per_freq": 1, "freq_step_mhz": 600,
    "p_blocking_seconds": 0.1, "straggler_period_steps": 0, "log_every_steps": 1, "plan_wait_s": 240.0,
    "planner_nice": 0, "attribution_intervals": 0,  # one step per clock, however short the steps
    "planner_options": {"num_anchors": 2, "num_deadlines": 8, "improve_sweeps": 0, "search_time_s": 0, "beam_width": 0},
}

# The README's minimal section with default profiling, as a new user runs it, plus what CPU
# training needs: simulated GPUs, the same small planner not niced (CPU-bound trainers), and
# the metrics file the guard's decisions are read from (``cache_dir`` and ``metrics_file`` are
# set per run).
MINIMAL: dict[str, Any] = {
    "enabled": True, "mode": "run", "gpu": "sim", "planner_nice": 0,
    "planner_options": SHORT_RUN["planner_options"],
}


def ds_config(out: Path, perseus: dict[str, Any] | None = None, micro_batch_size: int = 16,
              base: dict[str, Any] | None = None) -> dict[str, Any]:
    """The example's DeepSpeed config with its ``"perseus"`` section (``base``: ``SHORT_RUN`` unless
    given, e.g. ``MINIMAL``; then ``perseus``; files under ``out``)."""
    section = {**(SHORT_RUN if base is None else base), "cache_dir": str(out / "cache"),
               "metrics_file": str(out / "metrics.jsonl"), **(perseus or {})}
    return {
        "train_micro_batch_size_per_gpu": micro_batch_size, "gradient_accumulation_steps": 4, "steps_per_print": 1000,
        "optimizer": {"type": "Adam", "params": {"lr": 1e-3, "torch_adam": True}},
        "perseus": section,
    }


@dataclass(frozen=True)
class WorkloadRun:
    returncode: int
    records: list[dict[str, Any]]  # metrics-file step lines
    events: list[dict[str, Any]]  # metrics-file event lines
    log: str  # launcher stdout + stderr


def read_metrics(path: Path) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    lines = [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.exists() else []
    return [r for r in lines if "event" not in r], [r for r in lines if "event" in r]


def run_beside_cpu_hog(out: Path, steps: int, perseus: dict[str, Any] | None = None, *, hog: bool = True,
                       width: int = 32, micro_batch_size: int = 16, timeout_s: float = 400.0,
                       base: dict[str, Any] | None = None) -> WorkloadRun:
    """torchrun 2 stages of the AlexNet pipeline on CPU (simulated GPUs) beside a busy loop.

    The defaults make a step last well over the simulated energy counter's 100 ms update period
    (like NVML's), so per-step energies are not mostly whole ticks or zero.
    """
    out.mkdir(parents=True, exist_ok=True)
    config = out / "ds_config.json"
    config.write_text(json.dumps(ds_config(out, perseus, micro_batch_size, base)))
    env = dict(os.environ, PERSEUS_SIM_GPU_DIR=str(out / "sim"), OMP_NUM_THREADS="1",
               PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]))
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={STAGES}", str(SCRIPT),
           "--deepspeed_config", str(config), "-p", str(STAGES), "--steps", str(steps), "--width", str(width),
           "--samples", str(4 * micro_batch_size * 4), "--cpu"]
    with cpu_hog(hog):
        proc = subprocess.run(cmd, cwd=out, env=env, capture_output=True, text=True, timeout=timeout_s)
    log = proc.stdout + proc.stderr
    (out / "launcher.log").write_text(log)
    records, events = read_metrics(out / "metrics.jsonl")
    return WorkloadRun(proc.returncode, records, events, log)


def lying(profile: dict[str, Any]) -> dict[str, Any]:
    """The profile with every instruction's time flat across clocks (its top clock's time) and its
    energy that time at a power proportional to the clock: lower clocks look as fast and cheaper,
    so the planner deploys the lowest (kept energies would keep it at the top clock: on the
    simulated GPU's measured curve the lowest clocks cost more energy). Issue 34's lying profile."""
    out = json.loads(json.dumps(profile))
    for item in out["measurements"]:
        top = max(range(len(item["freq_mhz"])), key=lambda i: item["freq_mhz"][i])
        t, e, f = item["time_s"][top], item["energy_j"][top], item["freq_mhz"][top]
        item["time_s"] = [t] * len(item["time_s"])
        item["energy_j"] = [e * mhz / f for mhz in item["freq_mhz"]]
        item.pop("quality", None)
    return out
