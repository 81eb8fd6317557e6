"""The deployed plan checked while training (``closed_loop.py`` in the engine): on a simulated GPU
that stretches plain CPU work by the clock, a frontier that promises too much is caught by the
same run's default-clock probes, and the runtime moves faster or falls back and says why.

The frontiers here lie on purpose, as the noisy profile of issue 24 did: a low-clock point
claiming the all-max time. Nothing asserts a wall-clock speed: the lie is a factor of two.
"""

from __future__ import annotations

import itertools
import json
import logging
import time

import numpy as np

from perseus.frontier import Frontier, FrontierPoint, save_frontier
from perseus.gpu.sim.device import SimulatedGPU
from perseus.runtime import PerseusConfig, PerseusRuntime, PipelineJob
from perseus.runtime.observe.report import summary_line
from perseus.schedules import build_schedule

JOB = PipelineJob(num_stages=1, num_microbatches=2, stage=0)
SCHEDULE = build_schedule("1f1b", 1, 2)
LOW, MAX = 600, 1410
EVERY = 8  # the first probe windows: a block (settle + counted), a plan settle step, five counted plan steps
STEPS_TO_ALARM = 2 + 10 * EVERY  # a plan twice as slow scores about 1.2 per window over the reference: ~6 windows


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
    cfg = setup(tmp_path, [uniform(MAX, 0.9, 9.0), uniform(LOW, 1.0, 5.0)], guard_threshold=1e6)
    with PerseusRuntime(JOB, cfg) as rt:
        clocks = train(rt, 2 + 40)
        default = rt.gpu.default_mhz
    steps = [r for r in lines(tmp_path) if "event" not in r and r["phase"] == "deployed"]
    per_step = [clocks[4 * i: 4 * i + 4] for i in range(2, 42)]
    for row, seen in zip(steps, per_step):
        assert set(seen) == ({default} if row["clocks"] == "default" else {LOW}), (row["step"], seen)
    # one block of two default-clock steps (settle + counted) per window, never at a fixed phase
    starts = [i for i, r in enumerate(steps) if r["clocks"] == "default" and (i == 0 or steps[i - 1]["clocks"] == "plan")]
    assert all(steps[i + 1]["clocks"] == "default" for i in starts if i + 1 < len(steps)) and 3 <= len(starts) <= 6
    assert len({b - a for a, b in itertools.pairwise(starts)}) > 1, "blocks at seeded offsets, not a fixed period"
    guard = [r["data"] for r in lines(tmp_path) if r.get("event") == "guard"]
    assert guard and all(g["action"] == "keep" and "0" in g["pipelines"] for g in guard)
    # a probe step has no planned time; counted plan steps after the first probe have their own A/B figure
    assert all(r["target_time_s"] is None for r in steps if r["clocks"] == "default")
    assert any("saving_vs_probes" in r for r in steps[starts[0] + 3:])
    assert len({r["run_id"] for r in lines(tmp_path)}) == 1


def test_a_plan_slower_than_default_clocks_moves_to_a_faster_point(tmp_path, caplog):
    cfg = setup(tmp_path, [uniform(MAX, 0.9, 9.0), uniform(LOW, 1.0, 5.0)])
    with caplog.at_level(logging.INFO, logger="perseus"):
        with PerseusRuntime(JOB, cfg) as rt:
            # stop soon after the move: the all-max point is default clocks, which save no energy,
            # and the energy guard would drop it a few windows later (test_energy_guard.py)
            for _ in range(STEPS_TO_ALARM):
                train(rt, 1)
                if rt.loop.decisions:
                    break
            train(rt, 2)
            summary = rt.summary()
            clocks = rt.stage_clocks()
    guard = [r["data"] for r in lines(tmp_path) if r.get("event") == "guard"]
    actions = [g["action"] for g in guard]
    assert "faster" in actions and set(actions[:actions.index("faster")]) == {"keep"}, actions
    moved = guard[actions.index("faster")]
    assert moved["pipelines"]["0"]["statistic"] >= moved["threshold"] and moved["slow_pipelines"] == [0]
    assert "moving to a faster point" in moved["reason"]
    assert clocks == [MAX] * 4, "the guard moved the plan to the all-max point"
    loop = summary["closed_loop"]
    assert summary["phase"] == "deployed" and loop["guard_moves"] == 1 and loop["pipelines"]["0"]["alarms"] == 1
    assert 0 < loop["default_clock_fraction"] < 0.5 and loop["decisions"][0]["action"] == "faster"
    assert "1 move(s) faster): pipeline 0 CUSUM" in summary_line(summary)
    assert "no-slowdown guard" in caplog.text


def test_a_plan_slower_even_at_its_fastest_point_falls_back_and_says_why(tmp_path, caplog):
    cfg = setup(tmp_path, [uniform(LOW, 1.0, 5.0)])
    with caplog.at_level(logging.INFO, logger="perseus"):
        with PerseusRuntime(JOB, cfg) as rt:
            train(rt, STEPS_TO_ALARM)
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


class OtherPipeline:
    """A control plane of two ranks whose other rank (data-parallel pipeline 1) sends ``row``:
    what ``all_gather_floats`` returns to pipeline 0's rank."""

    is_root = True

    def __init__(self, row: list[float]) -> None:
        self.row = row
        self.gathers = 0

    def all_gather_floats(self, values: list[float]) -> list[list[float]]:
        self.gathers += 1
        return [list(values), list(self.row)]


def test_another_pipelines_alarm_moves_this_pipeline_too():
    """Pipeline 0 is honest; pipeline 1 says its CUSUM crossed the threshold, 20 % slow: every rank
    computes the same decision from the gathered rows, so pipeline 0's rank moves faster as well."""
    from perseus.planner.stage_plan import decode_stage, encode_stage
    from perseus.runtime.clocks.targeting import Targeting
    from perseus.runtime.guard.closed_loop import ClosedLoop
    from perseus.runtime.guard.job_guard import Action
    from perseus.runtime.guard.sequential import Confidence

    # verdict row (dp 1, score, statistic, confidence, ratio, excess), at fastest, probe share, extra J,
    # judges (its stage begins or ends the iteration)
    alarm = [1.0, 1.5, 7.5, float(list(Confidence).index(Confidence.ALARM)), 1.2, 0.2, 0.0, 0.25, 4.0, 1.0]
    plane = OtherPipeline(alarm)
    loop = ClosedLoop(PerseusConfig(probe_every_steps=EVERY), plane, PipelineJob(1, 2, 0, dp_rank=0, dp_size=2))
    frontier = Frontier(SCHEDULE, 80.0, 1.0, 10.0, [uniform(MAX, 0.9, 9.0), uniform(LOW, 1.0, 5.0)])
    plan = decode_stage(encode_stage(frontier, 0), SCHEDULE, 0)
    targeting = Targeting()
    targeting.deploy(plan)
    decision = None
    for step in range(3, 3 + 3 * EVERY):
        loop.begin_step(step)
        decision = loop.end_step(1.0, 2.0, targeting, plan)
        if decision is not None:
            break
    assert decision is not None and plane.gathers == 1
    assert decision.action is Action.FASTER and decision.slow_pipelines == (1,) and abs(decision.factor - 1 / 1.2) < 1e-12
    assert loop.apply(decision, targeting, speak=False) is None and targeting.due
    assert set(loop.pipelines) == {0, 1} and loop.pipelines[1].alarms == 1 and loop.pipelines[0].alarms == 0
    assert loop.summary()["pipelines"]["1"]["statistic"] == 7.5


def test_a_port_that_reports_clock_reasons_has_them_in_the_guard_events(tmp_path):
    """The engine hands the guard its GPU port when the port answers ``clock_reasons_since`` (the
    poller's samples on a real card); here a stand-in port says the power cap held the clock
    whenever it ran at default clocks, so probe steps report it and plan steps do not."""
    from test_engine_local import DirectController  # this directory is on sys.path

    from perseus.gpu.device import ClockEventReason
    from perseus.runtime.port.gpu_port import GPUPort

    class ReasonPort(GPUPort):
        def clock_reasons_since(self, t_s: float) -> frozenset[ClockEventReason]:
            held = self.device.current_sm_clock_mhz() == MAX
            return frozenset({ClockEventReason.SW_POWER_CAP}) if held else frozenset()

    cfg = setup(tmp_path, [uniform(MAX, 0.9, 9.0), uniform(LOW, 1.0, 5.0)], guard_threshold=1e6)
    device = SimulatedGPU(0, state_dir=str(tmp_path / "sim"), energy_update_period_s=0.0)
    with PerseusRuntime(JOB, cfg, gpu=ReasonPort(device, DirectController(device))) as rt:
        assert rt.loop.reason_source is rt.gpu
        train(rt, 2 + 40)
    guard = [r["data"] for r in lines(tmp_path) if r.get("event") == "guard"]
    assert guard and all(g["clock_reasons"]["pipeline"] == 0 for g in guard)
    last = guard[-1]["clock_reasons"]
    assert last["probe_steps"] >= 3 and last["probe"] == {"sw_power_cap": 1.0}
    assert last["plan_steps"] >= 3 and last["plan"] == {}  # the plan step after each block
