"""The runtime measures each iteration's non-compute time on its warm-up steps (the shortest step's
time outside its instructions' span) and plans with it: the deployed plan carries it, so its
slowdowns and savings are the job's (``perseus.frontier.non_compute``)."""

from __future__ import annotations

import time

import pytest

from perseus.gpu.sim.device import SimulatedGPU
from perseus.runtime import PerseusConfig, PerseusRuntime, PipelineJob
from perseus.runtime.supply.plan_supply import NON_COMPUTE_POWER_S, warmup_non_compute

JOB = PipelineJob(num_stages=1, num_microbatches=2, stage=0)
TAIL_S = 0.03  # the client's work after its last instruction: an optimizer step, say


def test_the_shortest_warm_up_step_gives_the_time_and_a_well_covered_counter_the_power():
    assert not warmup_non_compute([])
    assert not warmup_non_compute([(0.0, None), (0.2, None)])  # one step had none: no constant to count on
    found = warmup_non_compute([(0.3, None), (0.2, None), (0.25, None)])
    assert found.time_s == 0.2 and found.power_w is None  # P_blocking: nothing measured
    long = NON_COMPUTE_POWER_S  # each step's outside time, so the steps cover at least the minimum
    assert warmup_non_compute([(long, 60.0 * long), (long, 80.0 * long)]).power_w == pytest.approx(70.0)
    assert warmup_non_compute([(long, 60.0 * long), (long, None)]).power_w is None  # one step unmeasured
    short = NON_COMPUTE_POWER_S / 10
    assert warmup_non_compute([(short, 60.0 * short)]).power_w is None  # a few counter updates say little


def _train(rt, steps, tail_s):
    """A client whose instructions are plain CPU work (a simulated kernel each), then ``tail_s`` more."""
    for _ in range(steps):
        rt.on_step_begin()
        for inst in rt.schedule.stages[0]:
            rt.on_instruction_begin(inst.kind, inst.microbatch, inst.chunk)
            time.sleep(0.002 * (2 if inst.kind == "backward" else 1))
            rt.on_instruction_end(inst.kind, inst.microbatch, inst.chunk)
        time.sleep(tail_s)
        rt.on_step_end()


def test_a_run_plans_with_the_time_its_warm_up_steps_spent_outside_the_instructions(tmp_path):
    def config(**kw):
        return PerseusConfig.from_dict({"gpu": "sim", "device_index": 0, "cache_dir": str(tmp_path / "cache"),
                                        "sim_gpu": {"state_dir": str(tmp_path / "sim")}, "warmup_steps": 2,
                                        "p_blocking_seconds": 0.05, **kw})

    # the simulated GPU's energy counter updates at every read (its state, shared with the runtime's)
    SimulatedGPU(0, state_dir=str(tmp_path / "sim"), energy_update_period_s=0.0, reset_state=True)
    with PerseusRuntime(JOB, config(mode="profile", freq_min_mhz=1200, freq_step_mhz=100, iters_per_freq=1,
                                    remeasure_max=0)) as rt:
        _train(rt, 2, 0.0)
        deadline = time.monotonic() + 300
        while rt.phase.value != "steady" and time.monotonic() < deadline:
            _train(rt, 1, 0.0)
    (entry,) = list((tmp_path / "cache").iterdir())
    with PerseusRuntime(JOB, config(mode="measure-only", profile_path=str(entry / "profile.json"),
                                    cache_dir=None)) as rt:
        _train(rt, 2, TAIL_S)
        deadline = time.monotonic() + 300  # hang guard: the planner process starts slowly on a loaded machine
        while rt.phase.value == "planning" and time.monotonic() < deadline:
            _train(rt, 1, TAIL_S)
        plan = rt.frontier
    assert plan is not None
    assert TAIL_S <= plan.non_compute.time_s < TAIL_S + 0.05, plan.non_compute  # a sleep is never shorter
    point = plan.lookup_slowdown(0.05)
    budget = (1.05 * (plan.baseline_time_s + plan.non_compute.time_s) - plan.non_compute.time_s)
    assert point.time_s <= budget * (1 + 1e-12)
