"""The deployed plan checked while training (``closed_loop.py`` in the engine): on a simulated GPU
that stretches plain CPU work by the clock, a frontier that promises too much is caught by the
same run's default-clock probes, and the runtime moves faster or falls back and says why.

The frontiers here lie on purpose, as the noisy profile of issue 24 did: a low-clock point
claiming the all-max time. Nothing asserts a wall-clock speed: the lie is a factor of two.
"""

from __future__ import annotations

import json
import logging
import time

import numpy as np

from perseus.frontier import Frontier, FrontierPoint, save_frontier
from perseus.gpu.sim.device import SimulatedGPU
from perseus.runtime import PerseusConfig, PerseusRuntime, PipelineJob
from perseus.runtime.guard.probes import ProbeSchedule, StepRole
from perseus.schedules import build_schedule

JOB = PipelineJob(num_stages=1, num_microbatches=2, stage=0)
SCHEDULE = build_schedule("1f1b", 1, 2)
LOW, MAX = 600, 1410
EVERY = 6  # a probe block (settle + counted), a plan settle step and three counted plan steps


def setup(tmp_path, points, **kw):
    SimulatedGPU(0, state_dir=str(tmp_path / "sim"), energy_update_period_s=0.0, reset_state=True)
    save_frontier(Frontier(SCHEDULE, 80.0, 1.0, 10.0, points), tmp_path / "f.json")
    return PerseusConfig.from_dict({
        "gpu": "sim", "device_index": 0, "cache_dir": None, "sim_gpu": {"state_dir": str(tmp_path / "sim")},
        "warmup_steps": 2, "frontier_path": str(tmp_path / "f.json"), "probe_every_steps": EVERY,
        "metrics_file": str(tmp_path / "m.jsonl"), **kw})


def train(rt, steps, t=0.003):
    clocks = []
    for _ in range(steps):
        rt.on_step_begin()
        for inst in rt.schedule.stages[0]:
            rt.on_instruction_begin(inst.kind, inst.microbatch, inst.chunk)
            clocks.append(rt.gpu.current_mhz)
            time.sleep(t)
            rt.on_instruction_end(inst.kind, inst.microbatch, inst.chunk)
        rt.on_step_end()
    return clocks


def lines(tmp_path):
    return [json.loads(line) for line in (tmp_path / "m.jsonl").read_text().splitlines()]


def uniform(clock, time_s, energy_j):
    return FrontierPoint(time_s, energy_j, np.full(4, clock))


def test_probe_steps_run_default_clocks_and_are_marked(tmp_path):
    cfg = setup(tmp_path, [uniform(MAX, 0.9, 9.0), uniform(LOW, 1.0, 5.0)], guard_patience=50)
    with PerseusRuntime(JOB, cfg) as rt:
        clocks = train(rt, 2 + 20)
        default = rt.gpu.default_mhz
    steps = [r for r in lines(tmp_path) if "event" not in r and r["phase"] == "deployed"]
    roles = ProbeSchedule(every=EVERY).roles(len(steps))
    assert [r["clocks"] for r in steps] == ["default" if role.default_clocks else "plan" for role in roles]
    per_step = [clocks[4 * i: 4 * i + 4] for i in range(2, 22)]
    for role, seen in zip(roles, per_step):
        assert set(seen) == ({default} if role.default_clocks else {LOW}), (role, seen)
    # a probe step has no planned time; a counted plan step after the first probe has its own A/B figure
    assert all(r["target_time_s"] is None for r in steps if r["clocks"] == "default")
    first_probe = roles.index(StepRole.PROBE)
    assert all("saving_vs_probes" in r for r, role in zip(steps, roles) if role is StepRole.PLAN and steps.index(r) > first_probe)
    assert len({r["run_id"] for r in lines(tmp_path)}) == 1


def test_a_plan_slower_than_default_clocks_moves_to_a_faster_point(tmp_path, caplog):
    cfg = setup(tmp_path, [uniform(MAX, 0.9, 9.0), uniform(LOW, 1.0, 5.0)])
    with caplog.at_level(logging.INFO, logger="perseus"):
        with PerseusRuntime(JOB, cfg) as rt:
            train(rt, 2 + 5 * EVERY + 6)
            summary = rt.summary()
            clocks = rt.stage_clocks()
    guard = [r["data"] for r in lines(tmp_path) if r.get("event") == "guard"]
    assert [g["action"] for g in guard].count("faster") == 1, guard
    moved = next(g for g in guard if g["action"] == "faster")
    assert moved["excess"] > moved["margin"] and "moving to a faster point" in moved["reason"]
    assert clocks == [MAX] * 4, "the guard moved the plan to the all-max point"
    assert summary["phase"] == "deployed" and summary["closed_loop"]["guard_moves"] == 1
    assert "no-slowdown guard" in caplog.text


def test_a_plan_slower_even_at_its_fastest_point_falls_back_and_says_why(tmp_path, caplog):
    cfg = setup(tmp_path, [uniform(LOW, 1.0, 5.0)])
    with caplog.at_level(logging.INFO, logger="perseus"):
        with PerseusRuntime(JOB, cfg) as rt:
            train(rt, 2 + 4 * EVERY + 2)
            summary = rt.summary()
            default = rt.gpu.default_mhz
            clock = rt.gpu.current_mhz
    events = [r for r in lines(tmp_path) if "event" in r]
    assert [e["data"]["action"] for e in events if e["event"] == "guard"][-1] == "fallback"
    fallback = [e["data"] for e in events if e["event"] == "fallback"]
    assert fallback and "no-slowdown guard" in fallback[0] and "fastest frontier point" in fallback[0]
    assert summary["phase"] == "fallback" and summary["closed_loop"]["guard_fell_back"] is True
    assert clock == default, "default clocks after the fall-back"
    assert "falling back to default clocks" in caplog.text


def test_probes_off_keep_every_deployed_step_on_the_plan(tmp_path):
    cfg = setup(tmp_path, [uniform(LOW, 1.0, 5.0)], probe_every_steps=0)
    with PerseusRuntime(JOB, cfg) as rt:
        train(rt, 2 + 12)
        summary = rt.summary()
    steps = [r for r in lines(tmp_path) if "event" not in r and r["phase"] == "deployed"]
    assert {r["clocks"] for r in steps} == {"plan"}
    assert not [r for r in lines(tmp_path) if r.get("event") == "guard"]
    assert summary["phase"] == "deployed" and summary["closed_loop"]["probe_steps"] == 0


def test_the_ab_is_unknown_while_probe_energy_reads_zero(tmp_path):
    """A step shorter than the energy counter's update period can read 0 J: no figure, no crash."""
    from perseus.runtime.guard.closed_loop import ClosedLoop
    from perseus.runtime.plane.collective import Collective

    loop = ClosedLoop(PerseusConfig(probe_every_steps=EVERY), Collective(None))
    loop.plan.add(0.01, 1.0)
    loop.probes.add(0.01, 0.0)
    assert loop.figure() is None and loop.step_figure(0.01, 1.0) is None
    loop.probes.add(0.01, 2.0)
    loop.probes.add(0.01, 2.0)
    assert loop.figure() is not None and loop.figure().saving == 0.5


def test_straggler_and_external_targets_are_held_to_their_own_time():
    """The guard compares a paced or timed target with default clocks in units of its own time."""
    from perseus.runtime.guard.closed_loop import guard_target_ratio
    from perseus.planner.stage_plan import decode_stage, encode_stage
    from perseus.runtime.clocks.targeting import PacedTarget, Targeting, TimeTarget

    frontier = Frontier(SCHEDULE, 80.0, 1.0, 10.0, [uniform(MAX, 0.9, 9.0), uniform(LOW, 1.0, 5.0)])
    plan = decode_stage(encode_stage(frontier, 0), SCHEDULE, 0)  # this rank's stage, as it receives it
    targeting = Targeting()
    default_s = plan.default_point().time_s
    assert guard_target_ratio(targeting, plan) == 1.0
    targeting.set_external(PacedTarget(1.25))
    assert guard_target_ratio(targeting, plan) == 1.25
    targeting.set_external(TimeTarget(1.5 * default_s))
    assert abs(guard_target_ratio(targeting, plan) - 1.5) < 1e-12
    targeting.set_external(TimeTarget(0.5 * default_s))  # faster than the default: held to default clocks
    assert guard_target_ratio(targeting, plan) == 1.0
    targeting.set_external(None)
    targeting.observe_slowdown(1.3)  # the straggler policy follows only after its patience
    for _ in range(5):
        targeting.observe_slowdown(1.3)
    assert guard_target_ratio(targeting, plan) == targeting.straggler_ratio > 1.0
