"""One A/B/A run of a framework demo, set up and read the way the benchmarks need it.

Shared by ``bench_demo.py`` and ``bench_switch_latency.py``: a real framework pipeline on CPU under
torchrun with simulated GPUs (profiling, planning, the deployed no-slowdown plan, then default
clocks again), optionally with a clock-switch latency on the simulated GPUs, the planner told
about it (latency hiding) and per-instruction clock traces. ``run_demo`` returns the ranks' results
with the deployed-vs-baseline numbers on the wall clock and on the simulated GPU's own model.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
for _path in (ROOT, ROOT / "tests"):
    if str(_path) not in sys.path:
        sys.path.insert(0, str(_path))

from demo_checks import account, cached_frontier, steps_in

from perseus.frontier import Frontier
from perseus_demo.common import phase_table


@dataclass
class DemoRun:
    """A finished demo run: every rank's result, its settings, the frontier it planned and numbers.

    ``numbers``: deployed plan against default clocks re-measured after it, as fractions: ``time``
    and ``saving`` on the wall clock (medians over the phases' iterations), ``true_time`` and
    ``true_saving`` of the plan on the simulated GPU's model (no latency), ``applied_time`` with the
    clocks each instruction ended at, ``applied`` the share that ended at its planned clock,
    ``base_time_s`` and ``wall_diff_s`` (deployed minus baseline iteration)."""

    results: list[dict[str, Any]]
    cfg: Any
    cache_dir: Path
    frontier: Frontier
    numbers: dict[str, float]


def run_demo(out: Path, *, framework: str = "megatron", stages: int = 4, microbatches: int = 8,
             latency_s: float = 0.0, switch_ahead: bool = True, planner_knows: bool = False,
             trace_clocks: bool = False) -> DemoRun:
    """Run the demo once under ``out`` (a fresh directory: its cache, its ranks' results)."""
    if framework == "megatron":
        from perseus_demo.megatron_demo import DemoConfig, launch
    else:
        from perseus_demo.deepspeed_demo import DemoConfig, launch
    cfg = DemoConfig(stages=stages, microbatches=microbatches)
    cfg.sim_gpu = {**cfg.sim_gpu, "switch_latency_s": latency_s}
    cfg.perseus = {**cfg.perseus, "cache_dir": str(out / "cache"), "switch_ahead": switch_ahead,
                   "trace_clocks": trace_clocks}
    if planner_knows and latency_s > 0:  # latency hiding: the plan and the runtime's requests know it
        cfg.perseus["planner_options"] = {"switch_latency_s": latency_s}
    results = launch(cfg, out / "run")
    table = phase_table(results)
    plan, base = table["deployed"], table["baseline again"]
    frontier = cached_frontier(out / "cache")
    acc = account(results, cfg, out / "cache", frontier.default_point(), steps_in(results[0], "deployed"))
    numbers = {"time": plan["time_s"] / base["time_s"] - 1.0, "saving": 1.0 - plan["energy_j"] / base["energy_j"],
               "true_time": acc.slowdown, "true_saving": acc.saving, "applied": acc.applied_share,
               "applied_time": acc.applied_slowdown, "base_time_s": base["time_s"],
               "wall_diff_s": plan["time_s"] - base["time_s"]}
    return DemoRun(results, cfg, out / "cache", frontier, numbers)
