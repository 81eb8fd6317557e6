"""The Megatron demo on simulated GPUs with a clock-switch latency: the deployed plan runs as planned.

One torchrun of the megatron-core demo (2 stages × 4 microbatches) whose simulated GPUs apply each
clock switch 20 ms after it is asked for, with latency hiding on. Checked on the simulated GPUs'
own accounting of the clock traces, not on wall-clock time (``tests/demo_checks.py``); the
wall-clock A/B/A per latency is ``benchmarks/bench_switch_latency.py``.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from demo_checks import cached_profile, check_deployed_demo, slowdown_bound, traced_on_model, true_profile

from perseus_demo.megatron_demo import DemoConfig, launch

pytestmark = pytest.mark.distributed


def test_with_a_switch_latency_the_gpus_run_the_plan_as_planned(tmp_path):
    """Simulated GPUs whose clock switches land 20 ms after each request, latency hiding on: the
    planner keeps plans whose switches can land between instructions and the runtime times each
    request, so the GPUs' own accounting of the traced clocks is the plan's. Asked for when the
    instruction before ends (no hiding), this plan's switches land inside instructions: +1.1 %
    time and 0.9 points less saving on the same accounting (``perseus.timeline.switch_lag``)."""
    cfg = DemoConfig(stages=2, microbatches=4, max_steps=1000, deployed_steps=6, startup_steps=1, rebaseline_steps=4)
    cfg.sim_gpu = {**cfg.sim_gpu, "switch_latency_s": 0.02}
    cfg.perseus.update(warmup_steps=3, cache_dir=str(tmp_path / "cache"), trace_clocks=True,
                       planner_options={"switch_latency_s": 0.02},
                       probe_every_steps=0)  # every traced deployed step runs the plan (no default-clock probe)
    results = launch(cfg, tmp_path, timeout_s=600)
    measured = cached_profile(tmp_path / "cache")
    bound = slowdown_bound(measured, true_profile(cfg, measured.entries))
    if bound > 0.10:  # seen in the suite beside its other worker: "profile errors allow +42 %", 2.8 % saved
        pytest.skip(f"profiled under a load that put its times up to {100 * bound:.0f} % off: no plan to judge")
    accounting = check_deployed_demo(results, cfg, tmp_path / "cache")
    time_s, energy_j = traced_on_model(results, cfg, tmp_path / "cache", "deployed")
    base_s, base_j = traced_on_model(results, cfg, tmp_path / "cache", "stopped")
    traced_time, traced_saving = time_s / base_s - 1.0, 1.0 - energy_j / base_j
    assert traced_time <= accounting.slowdown + 0.005, (traced_time, accounting)
    # Saving within 0.8 points: unloaded the traced saving reads 0.1-0.2 points under the plan's, and
    # up to 0.7 with the suite's other worker on the same two cores (the controller processes deliver
    # the timed switches late). Without hiding the time check above fails (+1.1 %).
    assert traced_saving >= accounting.saving - 0.008, (traced_saving, accounting)
    print(f"\nswitch latency 20 ms: traced on the GPU model time {100 * traced_time:+.2f} %, saving "
          f"{100 * traced_saving:.1f} %; {accounting}")
