"""``perseus demo --gpu-replay DIR``: the demo's simulated GPUs replay one workload's measured A100 runs.

GPU ``i`` (the demo's stage ``i``) replays stage ``i`` of the workload (``replay_preset``), so the
demo runs the workload's stage count. Each forward and backward takes a measured instance of its
(stage, kind, clock) times ``TIME_SCALE`` and draws its stage's fitted power; P_blocking is the
fitted one. The demo runs its own microbatch count (a measured 128 would take minutes an
iteration), and the planner plans for the demo's configuration from its own online profile.
The report says all of this, with the planner's predicted saving beside the measured A/B.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from perseus.errors import PerseusError
from perseus.frontier import load_frontier
from perseus.measured.replay import ReplaySource, load_replay
from perseus_demo.common import DEFAULT_SIM_GPU

# A measured 104 ms forward runs 10.4 ms: a 4 × 8 iteration of a GPT-3 XL replay lasts about half a second.
TIME_SCALE = 0.1
# The runtime profiles every 75 MHz of the measured range (1,035-1,410 MHz for GPT-3 XL): six clocks.
FREQ_STEP_MHZ = 75


def replay_source(directory: Path, stages: int) -> ReplaySource:
    """The replayed runs, checked against the demo's stage count (one line when they do not fit)."""
    source = load_replay(directory, TIME_SCALE)
    if stages != source.stages:
        raise PerseusError(f"--gpu-replay {directory}: the runs measured {source.stages} stages; run the demo with "
                           f"--stages {source.stages} (GPU i replays stage i)")
    return source


def replay_settings(source: ReplaySource) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
    """(sim_gpu, demo settings, runtime settings) of a replay demo: the replay preset on every GPU,
    no nominal kernel time (the replay decides it), the measured clock range profiled."""
    sim_gpu = {**{k: v for k, v in DEFAULT_SIM_GPU.items() if k != "preset"},  # the demo's fast counter
               "replay": {"dir": str(source.path), "time_scale": TIME_SCALE}}
    return (sim_gpu, {"forward_ms": 0.0, "backward_ms": 0.0},
            {"freq_min_mhz": source.clocks_mhz[0], "freq_step_mhz": FREQ_STEP_MHZ})


def replay_lines(source: ReplaySource, microbatches: int) -> list[str]:
    """What the replay is and how it is scaled."""
    top = source.max_clock_mhz
    return [
        f"replay: GPU i replays stage i of {source.path.name} (A100, {source.stages} stages x "
        f"{source.workload.microbatches} microbatches measured, {len(source.workload.runs)} schedules)",
        f"  scale: instruction times x{TIME_SCALE:g} (stage 0 at {top} MHz: forward "
        f"{source.time_s(0, 'forward', top) * 1e3:.1f} ms, backward {source.time_s(0, 'backward', top) * 1e3:.1f} ms), "
        f"{microbatches} microbatches instead of {source.workload.microbatches}; power per stage and "
        f"P_blocking ({source.p_blocking_w:.1f} W) as fitted, not scaled; clocks "
        f"{source.clocks_mhz[0]}-{source.clocks_mhz[-1]} MHz as measured",
    ]


def predicted_line(cache_dir: Path) -> str:
    """The planner's own prediction for the demo's configuration: its deployed (no-slowdown) point."""
    frontiers = sorted(cache_dir.glob("*/frontier.json"))
    if not frontiers:
        return "planner's prediction: no frontier was planned"
    frontier = load_frontier(frontiers[-1])
    point = frontier.default_point()
    return (f"planner's prediction for this configuration (its deployed point vs all-max): "
            f"{100 * frontier.saving(point):.1f}% less energy, iteration time {100 * frontier.slowdown(point):+.1f}%")
